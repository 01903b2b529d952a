"""Multi-draft tree verification (lossy verification, arXiv 2607.26627, App. G.2-G.5): closed forms vs seeded
traversals."""

import numpy as np
import pytest
import torch
from verify_helpers import chi_square_pvalue, one_thread, random_rows  # noqa: F401 (autouse fixture)

from specrank.decode.verify.lossy.diagnostics import diagnose
from specrank.decode.verify.lossy.parse import parse_verification_rule
from specrank.decode.verify.lossy.rules import RuleError
from specrank.decode.verify.lossy.tree import (
    FirstAllowed,
    SequentialLossless,
    position_divergence,
    sample_tree,
    tree_form,
    tree_law,
)
from specrank.decode.verify.lossy.truncation import Eta, MinP, TruncationAcceptance, truncate

DRAWS = 20_000
V = 6
# Root children 0, 1, 2 (tokens 3, 1, 4); node 0 has children 3, 4; node 3 has child 5; node 2 has child 6.
TOKEN = [3, 1, 4, 2, 0, 5, 1]
PARENT = [0, 0, 0, 1, 1, 4, 3]

RULES = {
    "lossless": SequentialLossless(),
    "minp-baseline": SequentialLossless(MinP(0.3)),
    "eta-baseline": SequentialLossless(Eta(0.2, 0.5)),
    "speccascade": FirstAllowed(MinP(0.3)),
    "typical": FirstAllowed(Eta(0.2, 0.5)),
}


def rows(seed, n=len(TOKEN) + 1):  # noqa: B008
    return random_rows(seed, n=n, vocab=V, alpha=0.5)[0]


def random_tree(rng, n=9, vocab=V):
    """A random tree with distinct sibling tokens, parents preceding children."""
    token, parent = [], []
    for i in range(n):
        used = [{t for t, r in zip(token, parent, strict=True) if r == row} for row in range(i + 1)]
        row = int(rng.choice([r for r in range(i + 1) if len(used[r]) < vocab]))
        token.append(int(rng.choice([t for t in range(vocab) if t not in used[row]])))
        parent.append(row)
    return token, parent


def outcome_samples(rule, probs, seed):
    gen = torch.Generator().manual_seed(seed)
    end, cont, accepted = sample_tree(rule, TOKEN, PARENT, probs, DRAWS, gen)
    return end * V + cont, accepted


@pytest.mark.parametrize("name", RULES)
def test_traversals_match_closed_form(name):
    rule = RULES[name]
    for seed in (0, 1):
        probs = rows(seed)
        law = tree_law(rule, TOKEN, PARENT, probs)
        assert law.outcome.sum() == pytest.approx(1.0)
        cells, accepted = outcome_samples(rule, probs, seed)
        assert chi_square_pvalue(cells, law.outcome) > 1e-4, (name, seed)
        se = accepted.double().std() / DRAWS**0.5
        assert abs(accepted.double().mean() - law.block_efficiency) <= 5 * se + 1e-9


class OverEager(SequentialLossless):
    """Negative control: accepts a child twice as often as the residual allows."""

    def child_accept(self, residual_at_child):
        return (2 * residual_at_child).clamp(max=1)


def test_wrong_tree_rule_fails():
    probs = rows(0)
    cells, _ = outcome_samples(OverEager(), probs, 3)
    assert chi_square_pvalue(cells, tree_law(OverEager(), TOKEN, PARENT, probs).outcome) < 1e-8


@pytest.mark.parametrize("name", ["lossless", "minp-baseline", "eta-baseline"])
def test_sequential_lossless_emits_its_target(name):
    # G.3 Lemma 2(i): the per-position emission is exactly p~, and child c is accepted w.p. p~(c).
    rule, probs = RULES[name], rows(2)
    law = tree_law(rule, TOKEN, PARENT, probs)
    target = rule.target(probs)
    assert torch.allclose(law.emission, target, atol=1e-12)
    assert torch.allclose(law.accept, target[PARENT, TOKEN])


@pytest.mark.parametrize("allowed", [MinP(0.1), MinP(0.5), MinP(0.9), Eta(0.05), Eta(0.3, 0.8)])
def test_truncated_lossless_never_beats_speccascade(allowed):
    # G.3 and G.5: per position a_lossless(C) <= a_lossy(C), hence block efficiency too.
    rng = np.random.default_rng(0)
    for seed in range(10):
        token, parent = random_tree(rng)
        probs = rows(100 + seed, n=len(token) + 1)
        lossless = tree_law(SequentialLossless(allowed), token, parent, probs)
        lossy = tree_law(FirstAllowed(allowed), token, parent, probs)
        assert torch.all(lossless.position_acceptance <= lossy.position_acceptance + 1e-12)
        strict = (lossless.position_acceptance > 0) & (lossless.position_acceptance < 1)
        assert torch.all(lossy.position_acceptance[strict] == 1)
        # On a chain the per-position order carries over to block efficiency (G.5).
        chain = list(range(len(token)))
        lossless = tree_law(SequentialLossless(allowed), token, chain, probs)
        lossy = tree_law(FirstAllowed(allowed), token, chain, probs)
        assert lossless.block_efficiency <= lossy.block_efficiency + 1e-12


def test_block_efficiency_order_can_fail_on_branching_trees():
    # Root children a (leaf, tried first) and b (with child c) hold all of A: SpecCascade
    # always accepts the leaf a (E[A] = 1); lossless also reaches c through b.
    p = torch.tensor([0.5, 0.45, 0.05], dtype=torch.float64)
    probs = torch.stack([p, p, p, p])
    token, parent, allowed = [0, 1, 0], [0, 0, 2], MinP(0.5)
    lossy = tree_law(FirstAllowed(allowed), token, parent, probs).block_efficiency
    lossless = tree_law(SequentialLossless(allowed), token, parent, probs).block_efficiency
    assert lossy == 1
    assert lossless == pytest.approx(1 + 0.45 / 0.95 * 0.5 / 0.95)


def test_first_allowed_divergence_is_log_z_over_p():
    # G.4: at a row where some child is allowed, the emission is a point mass: KL = log(Z / p(x)).
    allowed, probs = MinP(0.3), rows(4)
    rule = FirstAllowed(allowed)
    law = tree_law(rule, TOKEN, PARENT, probs)
    kl, tv = position_divergence(rule, TOKEN, PARENT, probs)
    keep = allowed.mask(probs)
    z = (probs * keep).sum(-1)
    checked = 0
    for row in range(len(TOKEN) + 1):
        kids = [i for i, r in enumerate(PARENT) if r == row and keep[row, TOKEN[i]]]
        if kids:
            x = TOKEN[kids[0]]
            assert kl[row] == pytest.approx(float(torch.log(z[row] / probs[row, x])))
            assert law.emission[row, x] == 1
            checked += 1
        else:
            assert kl[row] == pytest.approx(0.0, abs=1e-12)
    assert checked > 0
    lossless_kl = position_divergence(SequentialLossless(allowed), TOKEN, PARENT, probs)[0]
    assert torch.allclose(lossless_kl, torch.zeros(8, dtype=probs.dtype), atol=1e-12)


def test_tree_distortion_does_not_vanish_as_draft_improves():
    # 001 Theorem 1: KL_SD -> 0 as q -> p, KL_EAGLE does not.
    allowed = MinP(0.2)
    p = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04], dtype=torch.float64)
    noise = torch.tensor([0.01, -0.01, 0.005, -0.003, -0.002], dtype=torch.float64)
    q = p + noise
    kl_sd = diagnose(TruncationAcceptance(allowed), p, q).kl_truncated
    top = [int(t) for t in torch.argsort(q, descending=True)[:3]]
    probs = torch.stack([p] + [p] * 3)
    kl_eagle = position_divergence(FirstAllowed(allowed), top, [0, 0, 0], probs)[0][0]
    assert kl_sd < 1e-3 < kl_eagle
    assert kl_eagle == pytest.approx(float(torch.log(truncate(p, allowed)[0] ** -1)))


@pytest.mark.parametrize(
    "token, parent, probs, message",
    [
        ([1, 2], [0, 2], rows(0, 3), "earlier node"),
        ([1, 1], [0, 0], rows(0, 3), "distinct tokens"),
        ([1, 2], [0, 0], rows(0, 2), "probs"),
        ([1, 2], [0, 0], 2 * rows(0, 3), "summing to 1"),
    ],
)
def test_bad_tree_raises(token, parent, probs, message):
    with pytest.raises(RuleError, match=message):
        tree_law(SequentialLossless(), token, parent, probs)


@pytest.mark.parametrize(
    "text, kind, allowed",
    [
        ("lossless", SequentialLossless, None),
        ("exhaustive", SequentialLossless, None),
        ("minp:p_base=0.2", SequentialLossless, MinP),
        ("eta:eps=0.1", SequentialLossless, Eta),
        ("speccascade:p_base=0.2", FirstAllowed, MinP),
        ("typical:eps=0.1", FirstAllowed, Eta),
    ],
)
def test_tree_form(text, kind, allowed):
    rule = tree_form(parse_verification_rule(text))
    assert type(rule) is kind
    assert (rule.allowed is None) if allowed is None else isinstance(rule.allowed, allowed)


def test_tree_form_rejects_collaborative_rules():
    with pytest.raises(RuleError, match="no tree form"):
        tree_form(parse_verification_rule("lenience:l=0.5"))
