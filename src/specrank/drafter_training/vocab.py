"""The draft vocabulary: the target tokens the head can propose, and the EAGLE-3 ``d2t``/``t2d`` maps."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftVocab:
    """Target ids of the draft vocabulary in increasing order (``ids[d]`` is draft id ``d``)."""

    ids: torch.Tensor  # (Vd,) int64
    vocab_size: int  # the target's V

    @property
    def d2t(self) -> torch.Tensor:
        """EAGLE-3 offsets: target id = draft id + ``d2t[draft id]``."""
        return self.ids - torch.arange(len(self.ids))

    @property
    def t2d(self) -> torch.Tensor:
        """(V,) bool: target ids that have a draft id."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.ids] = True
        return mask

    def coverage(self, tokens: torch.Tensor) -> float:
        """Share of ``tokens`` (target ids) inside the draft vocabulary."""
        return float(self.t2d[tokens].float().mean()) if len(tokens) else float("nan")


def most_frequent(tokens: torch.Tensor, vocab_size: int, size: int) -> DraftVocab:
    """The ``size`` most frequent ids among ``tokens`` (ties: lower id first), in id order.

    ``size`` is capped at the number of distinct ids seen; a vocabulary never seen is an error.
    """
    if size < 1:
        raise ValueError(f"draft vocabulary size must be positive, got {size}")
    if len(tokens) == 0:
        raise ValueError("no tokens to count for the draft vocabulary")
    counts = torch.bincount(tokens.long(), minlength=vocab_size)  # (V,)
    order = torch.argsort(-counts, stable=True)  # stable: equal counts keep increasing id
    keep = order[: min(size, int((counts > 0).sum()))]
    return DraftVocab(keep.sort().values, vocab_size)
