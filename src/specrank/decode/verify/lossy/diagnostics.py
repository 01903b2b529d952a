"""Exact per-position diagnostics of verification rules (docs/design.md, lossy verification rules; lossy verification,
arXiv 2607.26627, Lemma 1).

Divergences are in nats along the last axis; ``KL(a || b)`` is ``inf`` where ``a`` puts
mass on a token ``b`` excludes.
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd
import torch

from specrank.decode.verify.lossy.rules import RuleError


def total_variation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``0.5 sum |a - b|`` (...)."""
    return 0.5 * (a - b).abs().sum(-1)


def kl_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``KL(a || b) = sum a log(a / b)`` with ``0 log 0 = 0`` (...)."""
    terms = torch.where(a > 0, a * (a.log() - b.log()), 0.0)
    return terms.sum(-1)


def js_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence (...), at most log 2."""
    m = 0.5 * (a + b)
    return 0.5 * kl_divergence(a, m) + 0.5 * kl_divergence(b, m)


DIVERGENCES = ("tv", "kl", "js")


def divergence(name: str):
    """``D(p, q)`` by name: ``tv``, ``kl`` (KL(p || q)) or ``js``."""
    table = {"tv": total_variation, "kl": kl_divergence, "js": js_divergence}
    if name not in table:
        raise RuleError(f"unknown divergence {name!r} (one of {', '.join(DIVERGENCES)})")
    return table[name]


class Diagnostics(NamedTuple):
    """Per-position exact diagnostics of one rule, each (...)."""

    acceptance: torch.Tensor  # Pr(draft accepted)
    tv: torch.Tensor  # TV(induced, p)
    kl: torch.Tensor  # KL(induced || p)
    tv_truncated: torch.Tensor  # TV(induced, p_A); NaN for rules without a truncated target
    kl_truncated: torch.Tensor  # KL(induced || p_A); NaN likewise


def diagnose(rule, p: torch.Tensor, q: torch.Tensor) -> Diagnostics:
    """Exact acceptance and divergence of ``rule``'s induced law from the (truncated) target."""
    induced = rule.induced(p, q)
    if hasattr(rule, "truncated_target"):
        target = rule.truncated_target(p)
        tv_t, kl_t = total_variation(induced, target), kl_divergence(induced, target)
    else:
        tv_t = kl_t = torch.full(p.shape[:-1], float("nan"), dtype=p.dtype)
    return Diagnostics(
        acceptance=rule.acceptance(p, q),
        tv=total_variation(induced, p),
        kl=kl_divergence(induced, p),
        tv_truncated=tv_t,
        kl_truncated=kl_t,
    )


class Efficiency(NamedTuple):
    """Lemma 1 of lossy verification, arXiv 2607.26627 (§5.1): ``delta_be = gain - loss`` (each (...))."""

    gain: torch.Tensor  # sum over A of min{(q - p)+, (1/z - 1) p}
    loss: torch.Tensor  # sum outside A of min(p, q)
    delta_be: torch.Tensor


def truncation_efficiency(p: torch.Tensor, q: torch.Tensor, allowed) -> Efficiency:
    """Change of lossless acceptance when the target is truncated to ``allowed`` (Lemma 1)."""
    keep = allowed.mask(p)
    z = (p * keep).sum(-1, keepdim=True)
    gain = torch.where(keep, torch.minimum((q - p).clamp_min(0), (1 / z - 1) * p), 0.0).sum(-1)
    loss = torch.where(keep, 0.0, torch.minimum(p, q)).sum(-1)
    return Efficiency(gain=gain, loss=loss, delta_be=gain - loss)


def diagnostics_table(rules, p: torch.Tensor, q: torch.Tensor):
    """One row per (verification rule, position) with every diagnostic: a pandas DataFrame."""
    frames = []
    for rule in rules:
        diag = diagnose(rule, p, q)
        cols = {name: value.reshape(-1).double().numpy() for name, value in diag._asdict().items()}
        if hasattr(rule, "allowed"):
            eff = truncation_efficiency(p, q, rule.allowed)
            cols.update({name: value.reshape(-1).double().numpy() for name, value in eff._asdict().items()})
        frame = pd.DataFrame(cols)
        frame.insert(0, "position", range(len(frame)))
        frame.insert(0, "verification_rule", rule.name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
