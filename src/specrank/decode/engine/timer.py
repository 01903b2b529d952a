"""Where a decode's time goes: prefill, drafting, root and tree passes, reranker, bookkeeping."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

SPANS = ("prefill", "draft", "root", "target", "rerank", "measure")


@dataclass
class Timer:
    """Seconds spent in the prompt prefill, drafting, root passes, tree passes, reranker inference (online
    features included), measurement-only work (records, expected values) and in total, with round, token
    and target-pass (after the prefill) counts.

    ``sync`` (e.g. ``torch.cuda.synchronize``) is called at every span boundary so that asynchronous
    device work is charged to the span that queued it; leave it None outside benchmarks.
    """

    prefill: float = 0.0
    draft: float = 0.0
    root: float = 0.0
    target: float = 0.0
    rerank: float = 0.0
    measure: float = 0.0
    total: float = 0.0
    rounds: int = 0
    tokens: int = 0
    passes: int = 0
    sync: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    @contextmanager
    def span(self, name: str):
        if self.sync is not None:
            self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)

    @property
    def bookkeeping(self) -> float:
        """Everything outside model forwards, reranker inference and measurement: the decoder's own host work."""
        return self.total - sum(getattr(self, s) for s in SPANS)

    @property
    def decoding(self) -> float:
        """Seconds of decoding proper: the total without measurement-only work."""
        return self.total - self.measure

    def split(self) -> dict[str, float]:
        """Seconds by span, bookkeeping and total."""
        return {**{s: getattr(self, s) for s in SPANS}, "bookkeeping": self.bookkeeping, "total": self.total}
