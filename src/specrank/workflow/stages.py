"""What a long workflow says about each of its stages (the stage before it runs, its seconds after), and which
stages a rerun may skip."""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specrank.atomic import write_json_atomic


@dataclass
class Clock:
    """The seconds a ``timed`` block took (set when it ends)."""

    seconds: float = 0.0


@contextmanager
def timed(what: str | None):
    """``what`` printed before the block (None: nothing printed), the block's seconds after it; yields the
    block's ``Clock``."""
    if what is not None:
        print(f"\n{what}", flush=True)
    clock, start = Clock(), time.perf_counter()
    try:
        yield clock
    finally:
        clock.seconds = time.perf_counter() - start
    if what is not None:
        print(f"  ({clock.seconds:.0f} s)", flush=True)


class Stages:
    """``stages.json``: the digest of the input each stage last ran on; a stage whose input is unchanged is
    skipped, one whose input changed is redone (its old output removed first)."""

    def __init__(self, path: Path):
        self.path = path
        self.done = json.loads(path.read_text()) if path.is_file() else {}

    def run(self, stage: str, digest: str, output: Path, work, clear: Path | None = None) -> None:
        if self.done.get(stage) == digest and output.exists():
            print(f"\n{stage}: its input is unchanged since it ran (skipped)", flush=True)
            return
        if clear is not None and clear.exists():
            shutil.rmtree(clear)
        with timed(f"{stage}: {self.path.parent}"):
            work()
        self.done[stage] = digest
        write_json_atomic(self.path, self.done)
