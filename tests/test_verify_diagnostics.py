"""Exact diagnostics: divergences, per-rule TV / KL / acceptance, Lemma 1 of lossy verification, arXiv 2607.26627."""

import math

import pytest
import torch
from verify_helpers import one_thread, random_rows  # noqa: F401 (autouse fixture)

from specrank.decode.verify.lossy.collaborative import FuzzySD, Interpolation, Lenience
from specrank.decode.verify.lossy.diagnostics import (
    diagnose,
    diagnostics_table,
    js_divergence,
    kl_divergence,
    total_variation,
    truncation_efficiency,
)
from specrank.decode.verify.lossy.rules import Lossless
from specrank.decode.verify.lossy.truncation import Eta, MinP, TruncatedLossless, TruncationAcceptance, truncate

ALLOWED = [MinP(0.1), MinP(0.5), MinP(0.9), Eta(0.05), Eta(0.3, 0.8)]


def test_divergences_known_values():
    a = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    b = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    assert total_variation(a, b) == pytest.approx(0.5)
    assert kl_divergence(a, b) == pytest.approx(math.log(2))
    assert kl_divergence(b, a) == math.inf
    assert kl_divergence(a, a) == 0
    m = (a + b) / 2
    assert js_divergence(a, b) == pytest.approx(0.5 * float(kl_divergence(a, m) + kl_divergence(b, m)))
    assert js_divergence(a, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)) == pytest.approx(math.log(2))


def test_lossless_has_no_distortion():
    p, q = random_rows(1, n=100)
    diag = diagnose(Lossless(), p, q)
    assert torch.all(diag.tv == 0) and torch.all(diag.kl == 0)
    assert torch.allclose(diag.acceptance, 1 - total_variation(p, q))
    assert torch.all(diag.tv_truncated.isnan())


def test_collaborative_distortion_closed_forms():
    p, q = random_rows(2, n=100)
    tv = total_variation(p, q)
    cos = diagnose(Interpolation(0.3), p, q)
    assert torch.allclose(cos.tv, 0.7 * tv)
    # Mixing in q raises acceptance: min(nu, q) >= min(p, q) pointwise.
    assert torch.all(cos.acceptance >= 1 - tv - 1e-12)
    fuzzy = diagnose(FuzzySD(float(tv.median()), "tv"), p, q)
    assert torch.allclose(fuzzy.tv, torch.where(tv < tv.median(), tv, 0.0))
    assert torch.allclose(fuzzy.acceptance, (tv < tv.median()).double())
    lenient = diagnose(Lenience(0.5), p, q)
    assert torch.all(lenient.acceptance >= 1 - tv - 1e-12) and torch.all(lenient.kl >= 0)


@pytest.mark.parametrize("allowed", ALLOWED)
def test_truncation_rule_distortion(allowed):
    p, q = random_rows(3, n=100)
    baseline = diagnose(TruncatedLossless(allowed), p, q)
    assert torch.allclose(baseline.tv_truncated, torch.zeros(100, dtype=p.dtype), atol=1e-12)
    lossy = diagnose(TruncationAcceptance(allowed), p, q)
    keep = allowed.mask(p)
    zp, zq = (p * keep).sum(-1, keepdim=True), (q * keep).sum(-1, keepdim=True)
    # 001 Theorem 1: KL_SD = sum_A q/Zq log(q Zp / (Zq p)).
    kl_sd = torch.where(keep & (q > 0), q / zq * torch.log(q * zp / (zq * p)), 0.0).sum(-1)
    assert torch.allclose(lossy.kl_truncated, kl_sd)
    assert torch.allclose(lossy.acceptance, zq.squeeze(-1))


@pytest.mark.parametrize("allowed", ALLOWED)
def test_lemma1_equals_measured_acceptance_change(allowed):
    p, q = random_rows(4, n=300, alpha=0.4)
    eff = truncation_efficiency(p, q, allowed)
    measured = diagnose(TruncatedLossless(allowed), p, q).acceptance - diagnose(Lossless(), p, q).acceptance
    assert torch.allclose(eff.delta_be, measured, atol=1e-12)
    assert torch.all(eff.gain >= 0) and torch.all(eff.loss >= 0)
    # Both terms are active on these rows, so neither alone can match.
    assert (eff.loss > 1e-3).any() and (eff.gain > 1e-3).any()
    assert not torch.allclose(eff.gain, measured, atol=1e-6)


def test_lemma1_negative_control_wrong_normalizer():
    # Using p itself (no renormalization) as the truncated target misses the gain term.
    p, q = random_rows(5, n=300, alpha=0.4)
    allowed = MinP(0.3)
    wrong = torch.minimum(p * allowed.mask(p), q).sum(-1) - torch.minimum(p, q).sum(-1)
    assert not torch.allclose(truncation_efficiency(p, q, allowed).delta_be, wrong, atol=1e-6)


def test_diagnostics_table():
    p, q = random_rows(6, n=4)
    rules = [Lossless(), Lenience(0.5), TruncationAcceptance(MinP(0.2)), TruncatedLossless(Eta(0.1))]
    table = diagnostics_table(rules, p, q)
    assert len(table) == 16
    assert list(table["verification_rule"].unique()) == [r.name for r in rules]
    assert {"acceptance", "tv", "kl", "tv_truncated", "kl_truncated", "gain", "loss", "delta_be"} <= set(table)
    row = table[table["verification_rule"] == rules[3].name]
    assert row["tv_truncated"].abs().max() < 1e-12
    assert table.loc[table["verification_rule"] == "lossless", "gain"].isna().all()


def test_allowed_sets():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    assert MinP(0.5).mask(p).tolist() == [True, True, False, False]
    assert torch.allclose(truncate(p, MinP(0.5)), torch.tensor([0.625, 0.375, 0, 0], dtype=p.dtype))
    h = float(-(p * p.log()).sum())
    cut = min(0.1, 0.9 * math.exp(-h))
    assert Eta(0.1, 0.9).mask(p).tolist() == [x >= cut for x in p.tolist()]
    # The argmax always survives, even when the cut would drop everything.
    flat = torch.full((4,), 0.25, dtype=torch.float64)
    assert Eta(0.5, 5.0).mask(flat).sum() == 1
