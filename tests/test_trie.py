"""Exact trie theory: App. B.1 numbers as fractions, identities, Monte-Carlo agreement."""

from fractions import Fraction as F

import numpy as np
import pytest

from specrank.selection import trie as tt

HALF = {"a": F(1, 2), "b": F(1, 2)}
B1 = [("a",), ("a", "a"), ("a", "a", "a"), ("a", "a", "b"), ("a", "b"), ("b",), ("b", "a")]


def word(s):
    return tuple(s)


@pytest.fixture
def b1_rows():
    return tt.iid_rows(B1, HALF)


def test_b1_exhaustive(b1_rows):
    out = tt.stopping(B1, b1_rows, "exhaustive")
    assert tt.tau_star(B1, b1_rows) == 2
    assert (out.coverage, out.expected_acceptance, out.shortfall) == (0, 2, 0)
    assert isinstance(out.expected_acceptance, F)


@pytest.mark.parametrize(
    "rule, coverage, acceptance, shortfall",
    [("cap:1", F(3, 4), 1, 1), ("sampled_leaf", F(3, 4), F(5, 4), F(3, 4)), ("cap:2", F(1, 4), F(7, 4), F(1, 4))],
)
def test_b1_stopping_rules(b1_rows, rule, coverage, acceptance, shortfall):
    out = tt.stopping(B1, b1_rows, rule)
    assert (out.coverage, out.expected_acceptance, out.shortfall) == (coverage, acceptance, shortfall)
    # Theorem 1: the shortfall is the unused path length on covered rounds.
    assert out.shortfall == sum(out.covered[v] * out.unused[v] for v in out.covered)


def test_b1_covered_addresses(b1_rows):
    cap1 = tt.stopping(B1, b1_rows, "cap:1")
    assert cap1.covered == {word("aa"): F(1, 4), word("ab"): F(1, 4), word("ba"): F(1, 4)}
    assert cap1.unused == {word("aa"): 2, word("ab"): 1, word("ba"): 1}
    leaf = tt.stopping(B1, b1_rows, "sampled_leaf")
    assert leaf.covered == {word("aaa"): F(1, 8), word("aab"): F(1, 8), word("ab"): F(1, 4), word("ba"): F(1, 4)}
    assert set(leaf.unused.values()) == {1}


def test_b1_scored_beyond_trie():
    trie, scored = [("a",)], [("a",), ("b",)]
    rows = tt.iid_rows(scored, HALF)
    out = tt.stopping(trie, rows, "exhaustive", scored=scored)
    assert (out.expected_acceptance, out.coverage, out.shortfall) == (F(1, 2), F(1, 2), 0)
    assert tt.stopping(trie, rows, "exhaustive").coverage == 0
    assert tt.tau_star(scored, rows) == 1
    assert tt.frontier(trie, scored) == {("b",)}
    assert tt.frontier_coverage(trie, scored, rows) == F(1, 2)


def random_trie(rng, vocab=3, depth=4, grow=0.55):
    """A random prefix-closed trie, a scored superset and Dirichlet rows at every scored node."""
    trie, level = {()}, [()]
    for _ in range(depth):
        level = [u + (x,) for u in level for x in range(vocab) if rng.random() < grow]
        trie.update(level)
    extra = {u + (x,) for u in trie for x in range(vocab) if u + (x,) not in trie and rng.random() < 0.3}
    scored = trie | extra
    rows = {u: rng.dirichlet(np.full(vocab, 0.7)) for u in scored}
    return trie, scored, rows


RULES = ["exhaustive", "cap:1", "cap:2", "sampled_leaf"]


def mc_agrees(exact, draws, z=5.0):
    """Exact mean within z standard errors of the Monte-Carlo mean."""
    se = max(draws.std(ddof=1) / np.sqrt(draws.size), 1e-12)
    return abs(draws.mean() - float(exact)) <= z * se


@pytest.mark.parametrize("seed", range(6))
def test_monte_carlo_matches_exact(seed):
    rng = np.random.default_rng(seed)
    trie, scored, rows = random_trie(rng)
    for rule in RULES:
        out = tt.stopping(trie, rows, rule, scored=scored)
        acc, cov = tt.simulate(trie, rows, rule, scored=scored, n=40_000, seed=seed)
        assert mc_agrees(out.expected_acceptance, acc), rule
        assert mc_agrees(out.coverage, cov), rule


def test_monte_carlo_rejects_wrong_rule():
    # Negative control: the exact law of one rule must not pass for another rule's draws.
    rows = tt.iid_rows(B1, HALF)
    for exact_rule, sim_rule in [("cap:1", "sampled_leaf"), ("cap:2", "exhaustive"), ("sampled_leaf", "cap:2")]:
        out = tt.stopping(B1, rows, exact_rule)
        acc, cov = tt.simulate(B1, rows, sim_rule, n=40_000, seed=1)
        assert not (mc_agrees(out.expected_acceptance, acc) and mc_agrees(out.coverage, cov))


@pytest.mark.parametrize("seed", range(4))
def test_identities_on_random_tries(seed):
    rng = np.random.default_rng(100 + seed)
    trie, scored, rows = random_trie(rng)
    exhaustive = tt.stopping(trie, rows, "exhaustive", scored=scored)
    union = trie | tt.frontier(trie, scored)
    # Eq. 5 / App. A.3: frontier coverage = tau*(T u F) - tau*(T), and exhaustive has no shortfall.
    assert exhaustive.coverage == pytest.approx(tt.frontier_coverage(trie, scored, rows), abs=1e-12)
    assert exhaustive.coverage == pytest.approx(tt.tau_star(union, rows) - tt.tau_star(trie, rows), abs=1e-12)
    assert exhaustive.expected_acceptance == pytest.approx(tt.tau_star(trie, rows), abs=1e-12)
    for rule in RULES:
        out = tt.stopping(trie, rows, rule, scored=scored)
        # tau*(Q) - E[A] >= Pr(C) for any scored trie Q containing T.
        assert tt.tau_star(union, rows) - out.expected_acceptance >= out.coverage - 1e-12
        assert out.shortfall == pytest.approx(sum(out.covered[v] * out.unused[v] for v in out.covered))
        # With Q = T (Theorem 1): E[L_T - A] >= Pr(C).
        own = tt.stopping(trie, rows, rule)
        assert own.shortfall >= own.coverage - 1e-12


def test_float_rows_give_floats():
    trie = [(0,), (0, 0), (1,)]
    out = tt.stopping(trie, tt.iid_rows(trie, [0.5, 0.5]), "cap:1")
    assert isinstance(out.expected_acceptance, float)
    assert out.coverage == pytest.approx(0.25)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: tt.as_trie([("a", "b")]), "prefix-closed"),
        (lambda: tt.stopping(B1, {(): HALF}), "no target row"),
        (lambda: tt.stopping([("a",)], tt.iid_rows(B1, {"a": F(1, 2), "b": F(1, 3)})), "sums to"),
        (lambda: tt.stopping(B1, tt.iid_rows(B1, HALF), scored=[("a",)]), "scored set lacks"),
        (lambda: tt.parse_stop("cap:x"), "whole number"),
        (lambda: tt.parse_stop("greedy"), "unknown stopping rule"),
    ],
)
def test_bad_input_raises(call, message):
    with pytest.raises(tt.TrieError, match=message):
        call()
