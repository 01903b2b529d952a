"""Collaborative verification (lossy verification, arXiv 2607.26627, §3.1, App. A, F): lenience, interpolation (CoS),
DIVERSED, Fuzzy SD and judge-based relaxation."""

from __future__ import annotations

from collections.abc import Callable

import torch

from specrank.decode.verify.lossy.diagnostics import divergence, total_variation
from specrank.decode.verify.lossy.rules import RuleError, VerificationRule, positive_residual, ratio_cap

Coefficient = Callable[[torch.Tensor, torch.Tensor], "torch.Tensor | float"]
Judge = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def unit_interval(value: torch.Tensor, what: str) -> torch.Tensor:
    """``value`` unchanged after checking it lies in [0, 1]."""
    if bool(((value < 0) | (value > 1) | value.isnan()).any()):
        raise RuleError(f"{what} must lie in [0, 1]")
    return value


class Lenience(VerificationRule):
    """``h = min(1, p / (l q))``, residual ``(p - q)+`` (001 eq. 10, App. A.3), ``0 < l <= 1``."""

    def __init__(self, ell: float):
        if not 0 < ell <= 1:
            raise RuleError(f"lenience l must lie in (0, 1], got {ell}")
        self.ell = float(ell)
        self.name = f"lenience:l={ell:g}"

    def h(self, p, q):
        return ratio_cap(p, self.ell * q)

    def residual(self, p, q):
        return positive_residual(p, q)

    def delta(self, p, q) -> torch.Tensor:
        """``Delta_l``: share of the residual mass (App. A.3), 0 where ``p == q`` (...)."""
        tv = total_variation(p, q)
        num = 0.5 * (q - p / self.ell).abs().sum(-1) + 0.5 - 0.5 / self.ell
        # Delta lies in [0, 1]; clamping removes rounding when the overshoot mass is nil.
        return torch.where(tv > 0, num / tv.clamp_min(torch.finfo(p.dtype).tiny), 0.0).clamp(0, 1)

    def induced(self, p, q):
        d = self.delta(p, q).unsqueeze(-1)
        ceiling = p / self.ell
        return torch.where(q <= p, q + d * (p - q), torch.where(q <= ceiling, q, ceiling))


class Interpolation(VerificationRule):
    """CoS: verify against ``nu = lam p + (1 - lam) q``; induces ``nu`` (001 eq. 8)."""

    def __init__(self, lam: float):
        if not 0 <= lam <= 1:
            raise RuleError(f"interpolation lambda must lie in [0, 1], got {lam}")
        self.lam = float(lam)
        self.name = f"cos:lam={lam:g}"

    def coefficient(self, p, q) -> torch.Tensor:
        """Mixture weight of ``p`` per position (..., 1)."""
        return torch.full((*p.shape[:-1], 1), self.lam, dtype=p.dtype)

    def mixture(self, p, q) -> torch.Tensor:
        lam = self.coefficient(p, q)
        return lam * p + (1 - lam) * q

    def h(self, p, q):
        return ratio_cap(self.mixture(p, q), q)

    def residual(self, p, q):
        return positive_residual(self.mixture(p, q), q)

    def induced(self, p, q):
        return self.mixture(p, q)


class Diversed(Interpolation):
    """DIVERSED: CoS with ``lam_t = f(p_t, q_t)`` per position (001 App. A.1)."""

    def __init__(self, f: Coefficient, label: str | None = None):
        if not callable(f):
            raise RuleError("DIVERSED needs a callable f(p, q) -> lambda per position")
        self.f = f
        self.name = f"diversed:f={label or getattr(f, '__name__', 'f')}"

    def coefficient(self, p, q):
        lam = torch.as_tensor(self.f(p, q), dtype=p.dtype)
        lam = unit_interval(lam.expand(p.shape[:-1]), "DIVERSED lambda")
        return lam.unsqueeze(-1)


class FuzzySD(VerificationRule):
    """Accept every draft iff ``D(p, q) < T`` (D: tv, kl = KL(p||q), js); induces q or p (App. A.2)."""

    def __init__(self, threshold: float, div: str = "tv"):
        if not threshold >= 0:
            raise RuleError(f"Fuzzy SD threshold T must be >= 0, got {threshold}")
        self.threshold, self.div = float(threshold), div
        self.distance = divergence(div)
        self.name = f"fuzzy:T={threshold:g},div={div}"

    def gate(self, p, q) -> torch.Tensor:
        """``g_T`` per position (..., 1) bool."""
        return (self.distance(p, q) < self.threshold).unsqueeze(-1)

    def h(self, p, q):
        return self.gate(p, q).to(p.dtype).expand_as(p)

    def residual(self, p, q):
        return p

    def induced(self, p, q):
        return torch.where(self.gate(p, q), q, p)


class JudgeRelaxation(VerificationRule):
    """Judge-based relaxation (001 eq. 12, App. F.1): an overshooting draft (q > p) is kept
    with ``p/q + (1 - p/q) j(x)``. ``judge(x, p, q) -> j in [0, 1]`` for candidate tokens
    ``x`` (..., K), or ``score`` with ``threshold``: ``j = 1[score >= threshold]``."""

    def __init__(self, judge: Judge | None = None, score: Judge | None = None, threshold: float | None = None):
        if (judge is None) == (score is None) or (score is not None and threshold is None):
            raise RuleError("judge relaxation needs either judge=, or score= with threshold=")
        self.judge, self.score, self.threshold = judge, score, threshold
        label = f"threshold={threshold:g}" if score is not None else "judge"
        self.name = f"judge:{label}"

    def judgement(self, x, p, q) -> torch.Tensor:
        """``j(x)`` for candidate tokens ``x`` (..., K) -> (..., K) in [0, 1]."""
        if self.score is not None:
            return (torch.as_tensor(self.score(x, p, q)) >= self.threshold).to(p.dtype)
        return unit_interval(torch.as_tensor(self.judge(x, p, q), dtype=p.dtype), "judge output j")

    def _h_at(self, j, p_x, q_x):
        ratio = ratio_cap(p_x, q_x)
        return torch.where(q_x <= p_x, 1.0, ratio + (1 - ratio) * j)

    def h(self, p, q):
        x = torch.arange(p.shape[-1]).expand(p.shape)
        return self._h_at(self.judgement(x, p, q), p, q)

    def accept_prob(self, x, p, q):
        j = self.judgement(x.unsqueeze(-1), p, q).squeeze(-1)
        at = x.unsqueeze(-1)
        return self._h_at(j, p.gather(-1, at).squeeze(-1), q.gather(-1, at).squeeze(-1))

    def residual(self, p, q):
        return positive_residual(p, q)

    def induced(self, p, q):
        j = self.judgement(torch.arange(p.shape[-1]).expand(p.shape), p, q)
        over = (q - p).clamp_min(0)
        under = (p - q).clamp_min(0).sum(-1, keepdim=True)
        d = torch.where(under > 0, (over * (1 - j)).sum(-1, keepdim=True) / under.clamp_min(1e-30), 0.0).clamp(0, 1)
        return torch.where(q <= p, d * p + (1 - d) * q, p + (q - p) * j)
