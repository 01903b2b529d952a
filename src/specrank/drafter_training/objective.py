"""Loss and agreement of the unrolled head against the target rows, restricted to the draft vocabulary."""

from __future__ import annotations

import torch


def target_logits(last: torch.Tensor, lm_head: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """(..., Vd) the target's logits at its final states ``last`` (..., H), on the draft vocabulary ``ids``."""
    bias = getattr(lm_head, "bias", None)
    out = last @ lm_head.weight[ids].T
    return out if bias is None else out + bias[ids]


def step_loss(draft: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over valid indices of the cross-entropy from softmax(target) to softmax(draft).

    draft, target: (B, L, Vd) logits; valid: (B, L) bool. Equal to the KL divergence plus
    the target rows' entropy, which does not depend on the head.
    """
    vd = draft.shape[-1]
    p = torch.softmax(target.float(), -1).reshape(-1, vd)
    ce = torch.nn.functional.cross_entropy(draft.float().reshape(-1, vd), p, reduction="none")  # (B * L,)
    return (ce * valid.reshape(-1)).sum() / valid.sum().clamp_min(1)


def agrees(draft: torch.Tensor, argmax: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(...,) bool: the head's top token (a target id) is the target's full-vocabulary argmax."""
    return ids[draft.argmax(-1)] == argmax


def agreement(draft: torch.Tensor, argmax: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor) -> tuple[int, int]:
    """(hits, count): valid indices where the head's top token agrees with the target's argmax."""
    hits = agrees(draft, argmax, ids) & valid
    return int(hits.sum()), int(valid.sum())
