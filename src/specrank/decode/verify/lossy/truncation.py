"""Truncation-based verification and its matched baselines (lossy verification, arXiv 2607.26627, §2.3, §3.2, §5).

An allowed set ``A`` is computed from the target row: min-p keeps ``p >= p_base max p``,
eta keeps ``p >= min(eps, delta exp(-H(p)))``; both always keep the argmax. SpecCascade
(min-p) and typical acceptance (eta) accept a draft iff it lies in ``A``; the matched
baselines sample the truncated target ``p_A`` and verify losslessly against it.
"""

from __future__ import annotations

import math

import torch

from specrank.decode.verify.lossy.rules import RuleError, VerificationRule, normalize, positive_residual, ratio_cap


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats (...)."""
    return -(p * torch.where(p > 0, p, 1.0).log()).sum(-1)


def with_argmax(keep: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``keep`` with each row's argmax added, so no allowed set is empty."""
    return keep.scatter(-1, p.argmax(-1, keepdim=True), True)


class MinP:
    """Min-p allowed set: ``p(x) >= p_base * max p``, ``p_base`` in (0, 1)."""

    def __init__(self, p_base: float):
        if not 0 < p_base < 1:
            raise RuleError(f"min-p base must lie in (0, 1), got {p_base}")
        self.p_base = float(p_base)
        self.name = f"p_base={p_base:g}"

    def mask(self, p: torch.Tensor) -> torch.Tensor:
        """Allowed tokens (..., V) bool."""
        return with_argmax(p >= self.p_base * p.amax(-1, keepdim=True), p)


class Eta:
    """Eta allowed set: ``p(x) >= min(eps, delta exp(-H(p)))``; ``delta`` defaults to sqrt(eps)."""

    def __init__(self, eps: float, delta: float | None = None):
        delta = math.sqrt(eps) if delta is None and eps > 0 else delta
        if not 0 < eps < 1:
            raise RuleError(f"eta eps must lie in (0, 1), got {eps}")
        if not delta > 0:
            raise RuleError(f"eta delta must be > 0, got {delta}")
        self.eps, self.delta = float(eps), float(delta)
        self.name = f"eps={eps:g},delta={self.delta:g}"

    def mask(self, p: torch.Tensor) -> torch.Tensor:
        """Allowed tokens (..., V) bool."""
        cut = torch.clamp(self.delta * torch.exp(-entropy(p)), max=self.eps).unsqueeze(-1)
        return with_argmax(p >= cut, p)


AllowedSet = MinP | Eta


def truncate(p: torch.Tensor, allowed: AllowedSet) -> torch.Tensor:
    """The truncated target ``p_A = p 1_A / Z_A(p)`` (..., V)."""
    return normalize(p * allowed.mask(p), p)


class TruncationAcceptance(VerificationRule):
    """``h = 1[x in A]`` (SpecCascade with min-p, typical acceptance with eta); on rejection the
    replacement is drawn from ``q`` restricted to ``A`` so that the rule induces
    ``q 1_A / Z_A(q)`` (001 §3.2); ``p_A`` where ``q`` has no mass on ``A``."""

    def __init__(self, allowed: AllowedSet):
        self.allowed = allowed
        family = "speccascade" if isinstance(allowed, MinP) else "typical"
        self.name = f"{family}:{allowed.name}"

    def truncated_target(self, p: torch.Tensor) -> torch.Tensor:
        return truncate(p, self.allowed)

    def h(self, p, q):
        return self.allowed.mask(p).to(p.dtype)

    def residual(self, p, q):
        return normalize(q * self.allowed.mask(p), self.truncated_target(p))

    def induced(self, p, q):
        return self.residual(p, q)


class TruncatedLossless(VerificationRule):
    """Matched baseline: min-p or eta sampling of the target, verified losslessly; induces ``p_A``."""

    def __init__(self, allowed: AllowedSet):
        self.allowed = allowed
        family = "minp" if isinstance(allowed, MinP) else "eta"
        self.name = f"{family}:{allowed.name}"

    def truncated_target(self, p: torch.Tensor) -> torch.Tensor:
        return truncate(p, self.allowed)

    def h(self, p, q):
        return ratio_cap(self.truncated_target(p), q)

    def residual(self, p, q):
        return positive_residual(self.truncated_target(p), q)

    def induced(self, p, q):
        return self.truncated_target(p)
