"""One-position verification rules (docs/design.md, lossy verification rules; lossy verification, arXiv 2607.26627,
§2-§3).

A draft token ``x ~ q`` is accepted with probability ``h(x)``; otherwise a token is drawn
from the rule's residual. Rows ``p`` (target) and ``q`` (drafter) are probability tensors
``(..., V)`` batched over positions; every method works on the last axis. Each rule
states its induced law ``P(generate x)`` in closed form (``induced``); ``mechanical``
recomputes it from ``h`` and the residual, and ``sample`` draws it.
"""

from __future__ import annotations

import torch


class RuleError(ValueError):
    """Invalid rule parameter or rows."""


def check_rows(p: torch.Tensor, q: torch.Tensor, atol: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated floating (..., V) probability rows of one shape."""
    if p.shape != q.shape or p.dim() == 0:
        raise RuleError(f"p and q rows must share one shape (..., V), got {tuple(p.shape)} and {tuple(q.shape)}")
    for name, row in (("p", p), ("q", q)):
        if not row.is_floating_point():
            raise RuleError(f"{name} must be a floating tensor of probabilities")
        if bool((row < 0).any()) or not bool(torch.isfinite(row).all()):
            raise RuleError(f"{name} has a negative or non-finite probability")
        if bool(((row.sum(-1) - 1).abs() > atol).any()):
            raise RuleError(f"{name} rows must sum to 1")
    return p, q


def normalize(mass: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``mass`` / its sum along V; rows with no mass take ``fallback`` (they are never drawn from)."""
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 0, mass / total.clamp_min(torch.finfo(mass.dtype).tiny), fallback)


def ratio_cap(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``min(1, num / den)``, 1 where ``den`` is 0 (such tokens are never drafted)."""
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), 1.0).clamp(max=1.0)


def positive_residual(target: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(target - q)+`` normalized: the residual of speculative sampling towards ``target``."""
    return normalize((target - q).clamp_min(0), target)


def draw(rows: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per (N, V) row."""
    return torch.multinomial(rows, 1, generator=generator).squeeze(-1)


class VerificationRule:
    """Accept draft ``x ~ q`` with ``h(x)``, else draw from ``residual``; subclasses set the three laws."""

    name = "rule"

    def h(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Acceptance probability of every candidate token (..., V)."""
        raise NotImplementedError

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Law of the replacement token given a rejection, averaged over the draft (..., V)."""
        raise NotImplementedError

    def induced(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Closed-form ``P(generate x)`` (..., V)."""
        raise NotImplementedError

    def accept_prob(self, x: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``h(x)`` for draft tokens ``x`` (...) at rows (..., V)."""
        return self.h(p, q).gather(-1, x.unsqueeze(-1)).squeeze(-1)

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Probability that the drafted token is accepted, ``sum_x q(x) h(x)`` (...)."""
        return (q * self.h(p, q)).sum(-1)

    def redraw_row(self, x: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Row the replacement is drawn from after rejecting ``x``; most rules ignore ``x``."""
        return self.residual(p, q)

    def mechanical(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``q h + (1 - sum q h) residual``: the induced law recomputed from the mechanism."""
        h = self.h(p, q)
        return q * h + (1 - (q * h).sum(-1, keepdim=True)) * self.residual(p, q)

    def sample(self, p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None = None):
        """Draft from ``q``, apply the rule: (token (...), accepted (...) bool)."""
        p, q = check_rows(p, q)
        shape, vocab = p.shape[:-1], p.shape[-1]
        p2, q2 = p.reshape(-1, vocab), q.reshape(-1, vocab)  # (N, V)
        x = draw(q2, generator)
        u = torch.rand(x.shape, generator=generator, dtype=p2.dtype)
        accepted = u < self.accept_prob(x, p2, q2)
        token = torch.where(accepted, x, draw(self.redraw_row(x, p2, q2), generator))
        return token.reshape(shape), accepted.reshape(shape)

    def __repr__(self) -> str:
        return self.name


class Lossless(VerificationRule):
    """Speculative sampling: ``h = min(1, p/q)``, residual ``(p - q)+``; induces ``p``."""

    name = "lossless"

    def h(self, p, q):
        return ratio_cap(p, q)

    def residual(self, p, q):
        return positive_residual(p, q)

    def induced(self, p, q):
        return p


class TargetSampling(VerificationRule):
    """Exhaustive target sampling at one position: draw ``y ~ p``, accept the draft iff ``y == x``."""

    name = "exhaustive"

    def h(self, p, q):
        return p

    def redraw_row(self, x, p, q):
        # The emitted token is the target draw itself, conditioned on missing the draft.
        return normalize(p.scatter(-1, x.unsqueeze(-1), 0.0), p)

    def residual(self, p, q):
        return normalize(p * (1 - q), p)

    def induced(self, p, q):
        return p
