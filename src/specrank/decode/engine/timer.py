"""Where a decode's time goes: prefill, drafting, root and tree passes, reranker, bookkeeping."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

SPANS = ("prefill", "draft", "root", "target", "rerank", "measure")


@dataclass
class Timer:
    """Seconds spent in the prompt prefill (its pass and the row caches' seeding), drafting, root passes, tree passes, reranker inference (online
    features included), measurement-only work (records, expected values) and in total, with round, token
    and target-pass (after the prefill) counts. With a pipelined drafter the ``draft`` span is the time the
    target waited for the pool; ``drafting`` is the drafter's own time and ``root_pass_hidden_s`` the root-pass
    time spent while it drafted.

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
    drafting: float = 0.0  # seconds the drafter drafted, by its own clock (in its process when pipelined)
    root_pass_hidden_s: float = 0.0  # seconds of root passes that ran while the drafter drafted
    window: tuple[float, float] = (0.0, 0.0)  # perf_counter span of the last span closed
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
            self.window = (start, time.perf_counter())
            setattr(self, name, getattr(self, name) + self.window[1] - start)

    def add_drafting(self, draft: tuple[float, float], root: tuple[float, float] | None) -> None:
        """Count one pool's drafting span and the part of the round's root-pass span (if any) inside it.

        Spans are ``time.perf_counter`` stamps, one system-wide monotonic clock across processes on Linux
        (CLOCK_MONOTONIC), so a worker's stamps compare with the target process's.
        """
        self.drafting += draft[1] - draft[0]
        if root is not None:
            self.root_pass_hidden_s += max(0.0, min(draft[1], root[1]) - max(draft[0], root[0]))

    @property
    def bookkeeping(self) -> float:
        """Everything outside model forwards, reranker inference and measurement: the decoder's own host work."""
        return self.total - sum(getattr(self, s) for s in SPANS)

    @property
    def decoding(self) -> float:
        """Seconds of decoding proper: the total without measurement-only work."""
        return self.total - self.measure

    def split(self) -> dict[str, float]:
        """Seconds by span, bookkeeping and total; then the drafter's own seconds and the root-pass seconds
        hidden under them (overlapping the spans, not parts of the total)."""
        return {**{s: getattr(self, s) for s in SPANS}, "bookkeeping": self.bookkeeping, "total": self.total,
                "drafting": self.drafting, "root_pass_hidden": self.root_pass_hidden_s}
