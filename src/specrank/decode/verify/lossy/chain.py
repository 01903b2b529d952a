"""Chain (single-draft) verification: a drafted chain is verified position by position and
stops at the first rejection (Leviathan et al.; lossy verification, arXiv 2607.26627, §2.1)."""

from __future__ import annotations

import torch

from specrank.decode.verify.lossy.rules import RuleError, VerificationRule, check_rows, draw


def verify_chain(
    rule: VerificationRule,
    draft: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify chains ``draft`` (N, G) with target rows ``p`` (N, G + 1, V) and draft rows
    ``q`` (N, G, V), G >= 1: (accepted count (N,), emitted continuation token (N,))."""
    n, gamma = draft.shape
    if gamma < 1 or p.shape[:2] != (n, gamma + 1) or q.shape[:2] != (n, gamma):
        raise RuleError(f"chain rows must be p (N, G+1, V), q (N, G, V) for draft (N, G) = {(n, gamma)}")
    check_rows(p[:, :gamma], q)
    u = torch.rand(draft.shape, generator=generator, dtype=p.dtype)
    ok = u < rule.accept_prob(draft, p[:, :gamma], q)  # (N, G)
    accepted = ok.long().cumprod(-1).sum(-1)  # (N,)
    at = accepted.clamp(max=gamma - 1)
    rows = torch.arange(n)
    redraw = rule.redraw_row(draft[rows, at], p[rows, at], q[rows, at])  # (N, V)
    # All accepted: the bonus token comes from the target row after the chain.
    source = torch.where((accepted == gamma).unsqueeze(-1), p[:, gamma], redraw)
    return accepted, draw(source, generator)
