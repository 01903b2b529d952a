"""One-position verification rules: closed forms vs mechanism vs seeded draws (lossy verification, arXiv 2607.26627,
§2-§3)."""

import pytest
import torch
from verify_helpers import chi_square_pvalue, one_thread, random_rows  # noqa: F401 (autouse fixture)

from specrank.decode.verify.lossy.chain import verify_chain
from specrank.decode.verify.lossy.collaborative import Diversed, FuzzySD, Interpolation, JudgeRelaxation, Lenience
from specrank.decode.verify.lossy.diagnostics import total_variation
from specrank.decode.verify.lossy.parse import parse_verification_rule
from specrank.decode.verify.lossy.rules import Lossless, RuleError, TargetSampling, check_rows, positive_residual
from specrank.decode.verify.lossy.truncation import Eta, MinP, TruncatedLossless, TruncationAcceptance, truncate

DRAWS = 20_000

# Lenience l = 0.5 on this pair hits all three regions of 001 eq. 10:
# tokens 0, 1, 5: q <= p; tokens 2, 4: p < q <= p / l; token 3: q > p / l.
P_FIXED = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.10, 0.05], dtype=torch.float64)
Q_FIXED = torch.tensor([0.10, 0.15, 0.25, 0.30, 0.15, 0.05], dtype=torch.float64)


def soft_judge(x, p, q):
    """A fractional judge depending on the candidate and both rows."""
    return (x % 3).to(p.dtype) / 2 * (p.gather(-1, x) > 0.02).to(p.dtype)


def judge_score(x, p, q):
    return -q.gather(-1, x)  # keeps overshooting drafts the drafter is not too sure of


RULES = {
    "lossless": Lossless(),
    "exhaustive": TargetSampling(),
    "lenience-0.5": Lenience(0.5),
    "lenience-0.2": Lenience(0.2),
    "cos-0.3": Interpolation(0.3),
    "diversed-tv": Diversed(total_variation),
    "fuzzy-tv-open": FuzzySD(0.9, "tv"),
    "fuzzy-kl-closed": FuzzySD(1e-3, "kl"),
    "fuzzy-js": FuzzySD(0.2, "js"),
    "judge-soft": JudgeRelaxation(judge=soft_judge),
    "judge-threshold": JudgeRelaxation(score=judge_score, threshold=-0.2),
    "speccascade": TruncationAcceptance(MinP(0.3)),
    "typical": TruncationAcceptance(Eta(0.2, 0.5)),
    "minp-baseline": TruncatedLossless(MinP(0.3)),
    "eta-baseline": TruncatedLossless(Eta(0.2, 0.5)),
}


def pairs():
    p, q = random_rows(7, n=2)
    return [(P_FIXED, Q_FIXED), (p[0], q[0]), (p[1], q[1])]


def draw_tokens(rule, p, q, seed):
    gen = torch.Generator().manual_seed(seed)
    token, accepted = rule.sample(p.expand(DRAWS, -1), q.expand(DRAWS, -1), gen)
    return token, accepted


def test_fixed_pair_has_three_lenience_regions():
    ell = 0.5
    assert (Q_FIXED <= P_FIXED).any()
    assert ((P_FIXED < Q_FIXED) & (Q_FIXED <= P_FIXED / ell)).any()
    assert (Q_FIXED > P_FIXED / ell).any()


def edge_rows(dtype):
    """Random rows plus sparse rows, one-hot rows and p == q rows."""
    p, q = random_rows(3, n=200)
    gen = torch.Generator().manual_seed(0)
    sparse_p, sparse_q = (torch.rand(2, 100, 6, generator=gen) < 0.4).double() * torch.stack([p[:100], q[:100]])
    sparse_p[:, 0] += 1e-3  # keep every row non-empty
    sparse_q[:, 1] += 1e-3
    one_hot = torch.nn.functional.one_hot(torch.arange(20) % 6, 6).double()
    p = torch.cat([p, sparse_p / sparse_p.sum(-1, keepdim=True), one_hot, q[:20]])
    q = torch.cat([q, sparse_q / sparse_q.sum(-1, keepdim=True), q[:20], q[:20]])
    return p.to(dtype), q.to(dtype)


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("name", RULES)
def test_closed_form_equals_mechanism(name, dtype, atol):
    rule = RULES[name]
    p, q = edge_rows(dtype)
    induced = rule.induced(p, q)
    assert torch.all(induced >= 0)
    assert torch.allclose(induced.sum(-1), torch.ones(len(p), dtype=dtype), atol=atol)
    assert torch.allclose(induced, rule.mechanical(p, q), atol=atol)
    assert torch.allclose(rule.acceptance(p, q), (q * rule.h(p, q)).sum(-1))


@pytest.mark.parametrize("name", RULES)
def test_draws_on_edge_rows_stay_in_support(name):
    p, q = edge_rows(torch.float32)
    token, accepted = RULES[name].sample(p, q, torch.Generator().manual_seed(1))
    assert token.shape == accepted.shape == (len(p),)
    assert torch.all(RULES[name].induced(p, q).gather(-1, token[:, None]) > 0)


@pytest.mark.parametrize("name", RULES)
def test_draws_match_closed_form(name):
    rule = RULES[name]
    for i, (p, q) in enumerate(pairs()):
        token, accepted = draw_tokens(rule, p, q, seed=i)
        assert chi_square_pvalue(token, rule.induced(p, q)) > 1e-4, (name, i)
        rate, se = accepted.double().mean(), accepted.double().std() / DRAWS**0.5
        assert abs(rate - rule.acceptance(p, q)) <= 5 * se + 1e-9, (name, i)


def test_lenience_regions_exact():
    rule, ell = Lenience(0.5), 0.5
    induced = rule.induced(P_FIXED, Q_FIXED)
    middle = (P_FIXED < Q_FIXED) & (Q_FIXED <= P_FIXED / ell)
    assert torch.allclose(induced[middle], Q_FIXED[middle])
    over = Q_FIXED > P_FIXED / ell
    assert torch.allclose(induced[over], P_FIXED[over] / ell)
    under = Q_FIXED <= P_FIXED
    d = rule.delta(P_FIXED, Q_FIXED)
    assert 0 < d < 1
    assert torch.allclose(induced[under], Q_FIXED[under] + d * (P_FIXED - Q_FIXED)[under])


def test_judge_formula_binary_regions():
    rule = JudgeRelaxation(score=judge_score, threshold=-0.2)
    induced = rule.induced(P_FIXED, Q_FIXED)
    j = (-Q_FIXED >= -0.2).double()
    over = Q_FIXED > P_FIXED
    assert torch.allclose(induced[over & (j == 0)], P_FIXED[over & (j == 0)])
    assert torch.allclose(induced[over & (j == 1)], Q_FIXED[over & (j == 1)])
    assert (over & (j == 0)).any() and (over & (j == 1)).any()


@pytest.mark.parametrize("name", ["lossless", "exhaustive"])
def test_lossless_rules_generate_target(name):
    p, q = random_rows(11, n=1)
    token, _ = draw_tokens(RULES[name], p[0], q[0], seed=5)
    assert chi_square_pvalue(token, p[0]) > 1e-4
    assert torch.allclose(Lenience(1.0).induced(p, q), p)


@pytest.mark.parametrize("allowed", [MinP(0.3), Eta(0.2, 0.5)])
def test_matched_baselines_generate_truncated_target(allowed):
    token, _ = draw_tokens(TruncatedLossless(allowed), P_FIXED, Q_FIXED, seed=9)
    assert chi_square_pvalue(token, truncate(P_FIXED, allowed)) > 1e-4


class WrongResidual(Lossless):
    """Negative control: resamples from p instead of (p - q)+ but still claims to induce p."""

    def residual(self, p, q):
        return p


def test_wrong_residual_fails():
    rule = WrongResidual()
    token, _ = draw_tokens(rule, P_FIXED, Q_FIXED, seed=2)
    assert chi_square_pvalue(token, rule.induced(P_FIXED, Q_FIXED)) < 1e-8
    assert not torch.allclose(rule.mechanical(P_FIXED, Q_FIXED), rule.induced(P_FIXED, Q_FIXED))


def test_cos_and_diversed_induce_mixture():
    p, q = random_rows(4, n=50)
    lam = torch.linspace(0, 1, 50, dtype=p.dtype)
    rule = Diversed(lambda p_, q_: lam)
    expected = lam[:, None] * p + (1 - lam[:, None]) * q
    assert torch.allclose(rule.induced(p, q), expected)
    assert torch.allclose(rule.mechanical(p, q), expected)
    cos = Interpolation(0.25)
    assert torch.allclose(cos.mechanical(p, q), 0.25 * p + 0.75 * q)
    assert torch.allclose(positive_residual(0.25 * p + 0.75 * q, q), cos.residual(p, q))


def test_fuzzy_gate_picks_an_endpoint():
    p, q = random_rows(5, n=100)
    tv = total_variation(p, q)
    rule = FuzzySD(float(tv.median()), "tv")
    induced = rule.induced(p, q)
    assert torch.equal(induced[tv < tv.median()], q[tv < tv.median()])
    assert torch.equal(induced[tv >= tv.median()], p[tv >= tv.median()])


def test_chain_lossless_law():
    p, q = P_FIXED, Q_FIXED
    gamma, gen = 3, torch.Generator().manual_seed(3)
    draft = torch.multinomial(q, DRAWS * gamma, replacement=True, generator=gen).view(DRAWS, gamma)
    accepted, cont = verify_chain(Lossless(), draft, p.expand(DRAWS, gamma + 1, -1), q.expand(DRAWS, gamma, -1), gen)
    alpha = float(torch.minimum(p, q).sum())
    law = torch.tensor([alpha**k * (1 - alpha) for k in range(gamma)] + [alpha**gamma])
    assert chi_square_pvalue(accepted, law) > 1e-4
    first = torch.where(accepted > 0, draft[:, 0], cont)
    assert chi_square_pvalue(first, p) > 1e-4
    # Negative control: the wrong-residual rule breaks the emitted law.
    p_rows, q_rows = p.expand(DRAWS, gamma + 1, -1), q.expand(DRAWS, gamma, -1)
    accepted, cont = verify_chain(WrongResidual(), draft, p_rows, q_rows, gen)
    assert chi_square_pvalue(torch.where(accepted > 0, draft[:, 0], cont), p) < 1e-8


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Lenience(0.0), "lenience l"),
        (lambda: Lenience(-1.0), "lenience l"),
        (lambda: Lenience(1.5), "lenience l"),
        (lambda: Interpolation(1.2), "lambda"),
        (lambda: Interpolation(-0.1), "lambda"),
        (lambda: MinP(0.0), "min-p base"),
        (lambda: MinP(1.0), "min-p base"),
        (lambda: Eta(0.0), "eta eps"),
        (lambda: Eta(0.1, -1.0), "eta delta"),
        (lambda: FuzzySD(-0.1), "threshold"),
        (lambda: FuzzySD(0.1, "hellinger"), "unknown divergence"),
        (lambda: JudgeRelaxation(), "judge relaxation needs"),
        (lambda: Diversed(lambda p, q: 1.5).induced(P_FIXED, Q_FIXED), "DIVERSED lambda"),
        (lambda: JudgeRelaxation(judge=lambda x, p, q: 5 * p.gather(-1, x)).h(P_FIXED, Q_FIXED), "judge output"),
        (lambda: Lossless().sample(P_FIXED, Q_FIXED[:5]), "share one shape"),
        (lambda: check_rows(P_FIXED, 2 * Q_FIXED), "sum to 1"),
    ],
)
def test_invalid_parameters(make, message):
    with pytest.raises(RuleError, match=message):
        make()


@pytest.mark.parametrize(
    "text, kind, name",
    [
        ("lossless", Lossless, "lossless"),
        ("exhaustive", TargetSampling, "exhaustive"),
        ("lenience:l=0.5", Lenience, "lenience:l=0.5"),
        ("cos:lam=0.3", Interpolation, "cos:lam=0.3"),
        ("diversed:f=specrank.decode.verify.lossy.diagnostics:total_variation", Diversed, None),
        ("fuzzy:T=0.2,div=js", FuzzySD, "fuzzy:T=0.2,div=js"),
        ("judge:score=test_verify_rules:judge_score,threshold=-0.2", JudgeRelaxation, None),
        ("speccascade:p_base=0.1", TruncationAcceptance, "speccascade:p_base=0.1"),
        ("typical:eps=0.09", TruncationAcceptance, "typical:eps=0.09,delta=0.3"),
        ("minp:p_base=0.1", TruncatedLossless, "minp:p_base=0.1"),
        ("eta:eps=0.1,delta=0.5", TruncatedLossless, "eta:eps=0.1,delta=0.5"),
    ],
)
def test_parse_verifier(text, kind, name):
    rule = parse_verification_rule(text)
    assert type(rule) is kind
    if name is not None:
        assert rule.name == name
    assert torch.allclose(rule.induced(P_FIXED, Q_FIXED).sum(), torch.tensor(1.0, dtype=torch.float64))


@pytest.mark.parametrize(
    "text, message",
    [
        ("greedy", "unknown verification rule"),
        ("lenience", "missing parameter l="),
        ("lenience:l=abc", "must be a number"),
        ("lenience:l=0.5,lam=0.2", "takes no parameter lam"),
        ("lenience:0.5", "not KEY=VALUE"),
        ("diversed:f=nowhere", "module:name"),
        ("diversed:f=specrank.nothing:f", "cannot load"),
        ("speccascade:p_base=1.5", "min-p base"),
    ],
)
def test_parse_verifier_errors(text, message):
    with pytest.raises(RuleError, match=message):
        parse_verification_rule(text)
