"""Properties of every rule on random pools (hypothesis), checked against brute force."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specrank.selection.draws import DRAW_SELECTIONS, draw_values, equal_mean, pearl_curves
from specrank.selection.pool import PoolError
from specrank.selection.scores import SCORES, MIXTURE_WEIGHTS, fixed_values, score_of
from specrank.selection.select import select_top, value
from specrank.selection.synthetic import random_pool

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pools(draw, max_rounds=4):
    m = draw(st.integers(1, 24))
    pool = random_pool(
        draw(st.integers(1, max_rounds)), m, draw(st.integers(1, min(5, m))), seed=draw(st.integers(0, 2**16)),
        ties=draw(st.booleans()), dtype=draw(st.sampled_from([np.float32, np.float64])),
    )
    return pool, draw(st.integers(1, 30)), draw(st.sampled_from(["sampling", "greedy"]))


def score_inputs(pool, seed):
    """Inputs for every registered rule, with exact ties and absent rows."""
    rng = np.random.default_rng(seed)
    n, m, L = pool.n_rounds, pool.shape[1], pool.n_first
    with np.errstate(divide="ignore"):
        row = np.log(rng.choice([0.0, 0.25, 0.5], size=(n, L)))
    row[rng.random(n) < 0.3] = np.nan
    return {
        "first_factor": rng.choice([0.0, 0.3, 0.6, 1.0], size=(n, L)),
        "iso_factor": rng.choice([0.1, 0.5, 1.0], size=(n, L)),
        "edge_factor": rng.choice([0.0, 0.5, 1.0], size=(n, m)),
        "row_logp": row,
        "weight": MIXTURE_WEIGHTS[seed % 3],
    }


def ancestor_closed(mask, parent):
    par_sel = np.take_along_axis(mask, np.maximum(parent.astype(int), 0), axis=1)
    return bool(np.all(~mask | (parent < 0) | par_sel))


@SETTINGS
@given(pools(max_rounds=24), st.integers(0, 100))  # >= 16 rounds takes the partition path
def test_every_rule_selects_min_b_ancestor_closed_and_oracle_dominates(case, seed):
    pool, b, law = case
    inputs = score_inputs(pool, seed)
    path = pool.path_prob(law)
    with np.errstate(divide="ignore"):
        oracle = value(select_top(score_of(pool, "oracle", law), pool.depth, b), path)
    for name in SCORES:
        mask = select_top(score_of(pool, name, law, **inputs), pool.depth, b)
        assert (mask.sum(axis=1) == min(b, pool.shape[1])).all(), name
        assert ancestor_closed(mask, pool.parent), name
        assert (value(mask, path) <= oracle + 1e-12).all(), name


@SETTINGS
@given(pools(max_rounds=24))
def test_greedy_root_beats_draft_every_round(case):
    pool, b, _ = case
    draft, _ = fixed_values(pool, score_of(pool, "draft", "greedy"), [b], "greedy")
    root, _ = fixed_values(pool, score_of(pool, "root", "greedy"), [b], "greedy")
    assert (root >= draft - 1e-12).all()


def draft_order(pool, i):
    d = pool.draft_logp[i]
    return sorted(range(pool.shape[1]), key=lambda j: (-d[j], pool.depth[i, j], j))


def below(pool, i, x):
    """Descendants of x (excluded) in draft order."""
    out = []
    for j in draft_order(pool, i):
        k = pool.parent[i, j]
        while k >= 0 and k != x:
            k = pool.parent[i, k]
        if k == x:
            out.append(j)
    return out


def expected_below(pool, i, node, kept, edge):
    """E[accepted tokens strictly below node | node reached], by recursion on kept children."""
    kids = [j for j in kept if pool.parent[i, j] == node]
    return sum(edge[i, j] * (1 + expected_below(pool, i, j, kept, edge)) for j in kids)


def brute_draws(pool, i, b, law):
    """(value, size) of root_draw, PEARL-style and the PEARL variant, drawing x explicitly."""
    edge = pool.edge_prob(law)
    L = pool.n_first
    tree = set(draft_order(pool, i)[:b])
    top = draft_order(pool, i)[0]
    res = {}
    for rule in DRAW_SELECTIONS:
        val = size = 0.0
        for x in range(L):
            keep_x = {x, *below(pool, i, x)[: b - 1]}
            if rule == "root_draw":
                kept = keep_x
            elif rule == "pearl":
                kept = ({x} | set(below(pool, i, x))) & tree if x in tree else {x}
            else:
                kept = keep_x if x == top else {x}
            val += edge[i, x] * (1 + expected_below(pool, i, x, kept, edge))
            size += edge[i, x] * len(kept)
        outside = 1 - edge[i, :L].sum()  # a draw off the first level is verified alone
        res[rule] = (val + outside, size + outside)
    return res


@SETTINGS
@given(pools())
def test_draw_rules_match_brute_force_and_order(case):
    pool, b, law = case
    got = draw_values(pool, [b], law)
    for i in range(pool.n_rounds):
        want = brute_draws(pool, i, b, law)
        for rule in DRAW_SELECTIONS:
            assert got[rule][0][i, 0] == pytest.approx(want[rule][0], abs=1e-9), rule
            assert got[rule][1][i, 0] == pytest.approx(want[rule][1], abs=1e-9), rule
    assert (got["root_draw"][0] >= got["pearl"][0] - 1e-12).all()
    # PEARL-style = draft + Pr(draw not on the draft tree's first level)
    tree = select_top(pool.draft_logp, pool.depth, b)
    p1 = pool.first_draw_prob(law)
    draft, _ = fixed_values(pool, score_of(pool, "draft", law), [b], law)
    miss = 1 - np.where(tree[:, : pool.n_first], p1, 0).sum(axis=1)
    np.testing.assert_allclose(got["pearl"][0][:, 0], draft[:, 0] + miss, atol=1e-12)
    vc, sc = pearl_curves(pool, law)
    np.testing.assert_allclose(vc[:, min(b, pool.shape[1]) - 1], got["pearl"][0][:, 0], atol=1e-12)
    np.testing.assert_allclose(sc[:, min(b, pool.shape[1]) - 1], got["pearl"][1][:, 0], atol=1e-12)


def test_oracle_maximizes_value_among_ancestor_closed_sets():
    from itertools import combinations

    pool = random_pool(6, 8, 2, seed=11)
    path = pool.path_prob("sampling")
    for b in range(1, 8):
        oracle = value(select_top(score_of(pool, "oracle"), pool.depth, b), path)
        for i in range(pool.n_rounds):
            best = max(
                path[i, list(s)].sum()
                for s in combinations(range(8), b)
                if all(pool.parent[i, j] < 0 or pool.parent[i, j] in s for j in s)
            )
            assert oracle[i] == pytest.approx(best, abs=1e-12)


def simulate_acceptance(pool, i, mask, n_sims, rng, law):
    """Mean accepted tokens of exhaustive traversal of the tree ``mask`` in round i."""
    m = pool.shape[1]
    edge = pool.edge_prob(law)[i]
    children = [np.flatnonzero(pool.parent[i] == k) for k in range(-1, m)]  # slot 0 = the root
    node = np.full(n_sims, -1)
    accepted = np.zeros(n_sims)
    alive = np.ones(n_sims, dtype=bool)
    for _ in range(int(pool.depth[i].max())):
        u = rng.random(n_sims)
        nxt = np.full(n_sims, -2)
        for k in np.unique(node[alive]):
            kids = children[k + 1]
            rows = alive & (node == k)
            if len(kids) == 0:
                continue
            cum = np.cumsum(edge[kids])
            pick = np.searchsorted(cum, u[rows], side="right")
            nxt[rows] = np.where(pick < len(kids), kids[np.minimum(pick, len(kids) - 1)], -2)
        alive &= (nxt >= 0) & mask[np.maximum(nxt, 0)]
        accepted += alive
        node = np.where(alive, nxt, node)
    return accepted.mean(), accepted.std() / np.sqrt(n_sims)


@pytest.mark.parametrize("law", ["sampling", "greedy"])
def test_value_equals_simulated_exhaustive_traversal(law):
    from specrank.selection.synthetic import synthetic_pools

    pool = synthetic_pools(4, topk=4, depth=4, expand=4, seed=3).pool
    rng = np.random.default_rng(0)
    for rule in ("draft", "root", "oracle"):
        for b in (3, 10, 40):
            mask = select_top(score_of(pool, rule, law), pool.depth, b)
            v = value(mask, pool.path_prob(law))
            for i in range(pool.n_rounds):
                mean, se = simulate_acceptance(pool, i, mask[i], 4000, rng, law)
                assert abs(mean - v[i]) <= 4.5 * se + 1e-12, (rule, b, i)


def test_equal_mean_mixes_the_two_nearest_budgets():
    pool = random_pool(50, 30, 4, seed=8)
    vc, sc = pearl_curves(pool)
    target = draw_values(pool, [6])["root_draw"][1].mean()
    em = equal_mean(vc, sc, target)
    assert em.sizes.mean() == pytest.approx(target, abs=1e-12)
    assert sc[:, em.lower - 1].mean() <= target <= sc[:, em.lower].mean()
    assert em.budget == pytest.approx(em.lower + em.weight)
    np.testing.assert_allclose(em.values, (1 - em.weight) * vc[:, em.lower - 1] + em.weight * vc[:, em.lower])
    with pytest.raises(PoolError, match="^target_size:"):
        equal_mean(vc, sc, sc.mean(axis=0)[-1] + 1)


def test_score_inputs_are_checked():
    pool = random_pool(3, 10, 3, seed=1)
    with pytest.raises(PoolError, match="^first_factor:"):
        score_of(pool, "reranked")
    with pytest.raises(PoolError, match="^first_factor: expected shape"):
        score_of(pool, "reranked", first_factor=np.zeros((3, 4)))
    with pytest.raises(PoolError, match="^score: unknown score"):
        score_of(pool, "nope")
    with pytest.raises(PoolError, match="^law:"):
        score_of(pool, "root", "beam")
    with pytest.raises(PoolError, match="^weight:"):
        score_of(pool, "mixture", row_logp=np.zeros((3, 3)), weight=2)


def test_substitution_keeps_draft_ranking_without_a_row_and_matches_root_with_the_root_row():
    pool = random_pool(6, 20, 4, seed=2)
    row = np.log(pool.p_edge[:, :4].astype(float))
    row[::2] = np.nan
    sub = select_top(score_of(pool, "substitution", row_logp=row), pool.depth, 7)
    draft = select_top(score_of(pool, "draft"), pool.depth, 7)
    root = select_top(score_of(pool, "root"), pool.depth, 7)
    np.testing.assert_array_equal(sub[::2], draft[::2])
    np.testing.assert_array_equal(sub[1::2], root[1::2])
    mix = select_top(score_of(pool, "mixture", row_logp=row, weight=1.0), pool.depth, 7)
    np.testing.assert_array_equal(mix, sub)


def test_evaluate_rules_covers_every_rule_and_matches_the_parts():
    from specrank.selection.synthetic import synthetic_pools
    from specrank.selection.values import evaluate_scores

    rounds = synthetic_pools(40, seed=1)
    pool = rounds.pool
    out = evaluate_scores(pool, [8, 59], "greedy", {"row_logp": rounds.rows["cache_logp"]})
    assert set(out) == {"draft", "root", "depth2", "oracle", "substitution", "root_draw", "pearl",
                        "pearl_variant", "pearl_equal_mean"}
    root, _ = fixed_values(pool, score_of(pool, "root", "greedy"), [8, 59], "greedy")
    np.testing.assert_array_equal(out["root"][0], root)
    assert out["pearl_equal_mean"][1].mean(axis=0) == pytest.approx(out["root_draw"][1].mean(axis=0))
    assert (out["oracle"][0] >= out["draft"][0]).all() and (out["draft"][1] == [8, 59]).all()


def test_cross_fit_choice_uses_the_other_fold_only():
    from specrank.selection.select import SelectionError
    from specrank.selection.values import cross_fit_choice

    values = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 5.0], [0.0, 5.0]])
    fold = np.array([0, 0, 1, 1])  # fold 0 prefers option 0, fold 1 option 1
    chosen, choice = cross_fit_choice(values, fold)
    np.testing.assert_array_equal(choice, [1, 1, 0, 0])  # each fold gets the other's favourite
    np.testing.assert_array_equal(chosen, [0.0, 0.0, 0.0, 0.0])
    with pytest.raises(SelectionError, match="^fold:"):
        cross_fit_choice(values, np.zeros(4))


def definition_score(pool, i, j, factors):
    """log score of candidate j in round i: sum over its path of log factors[depth](edge)."""
    total, k = 0.0, j
    while k >= 0:
        total += np.log(factors(i, k))
        k = pool.parent[i, k]
    return total


@pytest.mark.parametrize("law", ["sampling", "greedy"])
def test_scores_select_as_their_definitions(law):
    pool = random_pool(20, 25, 4, seed=12)
    rng = np.random.default_rng(0)
    r = rng.random((20, 4))
    iso = rng.random((20, 25))
    row = np.log(rng.random((20, 4)))
    p, q, d = pool.edge_prob(law), pool.q_edge, pool.depth
    defs = {
        "root": ({}, lambda i, k: p[i, k] if d[i, k] == 1 else q[i, k]),
        "depth2": ({}, lambda i, k: p[i, k] if d[i, k] <= 2 else q[i, k]),
        "oracle": ({}, lambda i, k: p[i, k]),
        "reranked": ({"first_factor": r}, lambda i, k: r[i, k] if d[i, k] == 1 else q[i, k]),
        "per_depth": ({"edge_factor": iso}, lambda i, k: iso[i, k]),
        "substitution": ({"row_logp": row}, lambda i, k: np.exp(row[i, k]) if d[i, k] == 1 else q[i, k]),
        "mixture": ({"row_logp": row, "weight": 0.25},
                    lambda i, k: q[i, k] ** 0.75 * np.exp(row[i, k]) ** 0.25 if d[i, k] == 1 else q[i, k]),
    }
    with np.errstate(divide="ignore"):
        for name, (inputs, factors) in defs.items():
            want = np.array([[definition_score(pool, i, j, factors) for j in range(25)] for i in range(20)])
            for b in (1, 5, 12):
                np.testing.assert_array_equal(
                    select_top(score_of(pool, name, law, **inputs), pool.depth, b),
                    select_top(want, pool.depth, b), err_msg=f"{name} B={b}")
