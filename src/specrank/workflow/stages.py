"""What a long workflow says about each of its stages (the stage before it runs, its seconds after), and which
stages a rerun may skip.

The workflow says it through ``logging`` (logger ``specrank``, level INFO), as every library module does: the
command line prints those lines on stdout; in Python, ``logging.basicConfig(level=logging.INFO)`` shows them."""

from __future__ import annotations

import json
import logging
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specrank.atomic import write_json_atomic

log = logging.getLogger(__name__)


@dataclass
class Clock:
    """The seconds a ``timed`` block took (set when it ends)."""

    seconds: float = 0.0


@contextmanager
def timed(what: str | None):
    """``what`` said before the block (None: nothing said), the block's seconds after it; yields the block's
    ``Clock``."""
    if what is not None:
        log.info(f"\n{what}")
    clock, start = Clock(), time.perf_counter()
    try:
        yield clock
    finally:
        clock.seconds = time.perf_counter() - start
    if what is not None:
        log.info(f"  ({clock.seconds:.0f} s)")


class Stages:
    """``stages.json``: the digest of the input each stage last ran on; a stage whose input is unchanged is
    skipped, one whose input changed is redone (its old output removed first)."""

    def __init__(self, path: Path):
        self.path = path
        self.done = json.loads(path.read_text()) if path.is_file() else {}

    def run(self, stage: str, digest: str, output: Path, work, clear: Path | None = None) -> None:
        if self.done.get(stage) == digest and output.exists():
            log.info(f"\n{stage}: its input is unchanged since it ran (skipped)")
            return
        if clear is not None and clear.exists():
            shutil.rmtree(clear)
        with timed(f"{stage}: {self.path.parent}"):
            work()
        self.done[stage] = digest
        write_json_atomic(self.path, self.done)
