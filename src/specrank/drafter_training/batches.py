"""Training windows over the corpus and their padded batches for a k-step training-time test.

A window of sequence ``x`` with target states ``h``: head index ``i`` pairs the feature
``h[i]`` with the token ``x[i+1]``; unrolled step ``j`` at index ``i`` reads token
``x[i+1+j]`` and is scored against the target row at position ``i+1+j``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch


@dataclass
class Batch:
    features: torch.Tensor  # (B, L, F) float32
    tokens: torch.Tensor  # (B, L + k - 1) int64, x[i+1] at index i
    last: torch.Tensor  # (B, L + k - 1, H) float32, target final states at i+1
    argmax: torch.Tensor  # (B, L + k - 1) int64, target argmax at i+1
    response: torch.Tensor  # (B, L + k - 1) bool, the row at i+1 predicts a generated token
    lengths: torch.Tensor  # (B,) valid head indices per row (n - 1)

    def to(self, device) -> Batch:
        """The batch on ``device``."""
        return Batch(*(getattr(self, f.name).to(device) for f in fields(self)))

    def valid(self, step: int, response_only: bool = False) -> torch.Tensor:
        """(B, L) bool: indices scored at unrolled ``step`` (the target row exists; and predicts
        a generated token with ``response_only``)."""
        width = self.features.shape[1]
        index = torch.arange(width, device=self.lengths.device)
        valid = index[None, :] < (self.lengths[:, None] - step)
        return valid & self.response[:, step : step + width] if response_only else valid


def windows(slices, max_len: int, min_len: int = 2) -> list[slice]:
    """Cut sequences into consecutive windows of at most ``max_len + 1`` tokens (``max_len`` head indices)."""
    out = []
    for s in slices:
        for start in range(s.start, s.stop - 1, max_len):
            stop = min(start + max_len + 1, s.stop)
            if stop - start >= min_len:
                out.append(slice(start, stop))
    return out


def epoch_order(n_windows: int, seed: int, epoch: int) -> np.ndarray:
    """The window order of one epoch: a function of (seed, epoch) only, so a resumed run replays it."""
    return np.random.default_rng([seed, epoch]).permutation(n_windows)


def batch_at(corpus, wins: list[slice], step: int, batch_size: int, seed: int, steps: int) -> Batch:
    """The batch of global ``step`` (windows of epoch ``step // per_epoch`` in that epoch's order)."""
    per_epoch = max(1, len(wins) // batch_size)
    order = epoch_order(len(wins), seed, step // per_epoch)
    k = step % per_epoch
    return collate(corpus, [wins[i] for i in order[k * batch_size : (k + 1) * batch_size]], steps)


def collate(corpus, wins: list[slice], steps: int) -> Batch:
    """Right-padded batch of ``wins`` for ``steps`` unrolled steps."""
    lengths = torch.tensor([w.stop - w.start - 1 for w in wins])
    width = int(lengths.max())
    b, f, h = len(wins), corpus.features.shape[1], corpus.last.shape[1]
    features = torch.zeros(b, width, f)
    tokens = torch.zeros(b, width + steps - 1, dtype=torch.long)
    last = torch.zeros(b, width + steps - 1, h)
    argmax = torch.zeros(b, width + steps - 1, dtype=torch.long)
    response = torch.zeros(b, width + steps - 1, dtype=torch.bool)
    for row, w in enumerate(wins):  # a handful of rows per batch
        n = w.stop - w.start - 1
        features[row, :n] = corpus.features[w.start : w.stop - 1].float()
        tokens[row, :n] = corpus.input_ids[w.start + 1 : w.stop]
        last[row, :n] = corpus.last[w.start + 1 : w.stop].float()
        argmax[row, :n] = corpus.argmax[w.start + 1 : w.stop]
        response[row, :n] = corpus.response[w.start + 1 : w.stop]
    return Batch(features, tokens, last, argmax, response, lengths)
