"""What a long command says about each of its stages: the stage before it runs, its seconds after."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def timed(what: str):
    """``what`` printed before the block, the block's seconds after it."""
    print(f"\n{what}", flush=True)
    start = time.perf_counter()
    yield
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
