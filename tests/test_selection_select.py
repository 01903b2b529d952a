"""Exactness of cumulate / rank_order / select_top / value against brute force."""

import numpy as np
import pandas as pd
import pytest

from specrank.schema import POOL_COLUMNS
from specrank.selection.pool import PoolBatch, PoolError
from specrank.selection.select import (
    SelectionError,
    budget_curve,
    cumulate,
    rank_order,
    rank_positions,
    select_top,
    value,
)
from specrank.selection.synthetic import random_pool


def brute_order(score, depth):
    s = np.where(np.isnan(score), -np.inf, score)
    return np.array([sorted(range(len(s[i])), key=lambda j: (-s[i, j], depth[i, j], j)) for i in range(len(s))])


def brute_path(pool, edge):
    out = np.zeros(pool.shape)
    for i in range(pool.n_rounds):
        for j in range(pool.shape[1]):
            prod, k = 1.0, j
            while k >= 0:
                prod *= edge[i, k]
                k = pool.parent[i, k]
            out[i, j] = prod
    return out


@pytest.mark.parametrize("ties", [False, True])
def test_cumulate_matches_brute_force(ties):
    pool = random_pool(20, 15, 3, seed=2, ties=ties)
    np.testing.assert_allclose(pool.path_prob("sampling"), brute_path(pool, pool.p_edge), rtol=1e-12)
    np.testing.assert_array_equal(pool.path_prob("greedy"), brute_path(pool, pool.p_argmax_child))


def test_cumulate_uniform_shape_fast_path():
    # identical depth vectors take the per-column branch; compare with the general branch
    pool = random_pool(1, 12, 2, seed=5)
    parent, depth = np.repeat(pool.parent, 6, 0), np.repeat(pool.depth, 6, 0)
    edge = np.random.default_rng(0).random((6, 12))
    np.testing.assert_allclose(cumulate(parent, depth, edge), brute_path(PoolBatch(
        token=parent, parent=parent, depth=depth, q_edge=edge, draft_logp=edge, p_edge=edge,
        p_argmax_child=parent), edge))


@pytest.mark.parametrize("ties", [False, True])
def test_rank_order_and_select_top_match_brute_force(ties):
    pool = random_pool(30, 14, 3, seed=3, ties=ties)
    for score in (pool.path_prob("greedy"), pool.path_prob("sampling"), pool.draft_logp.astype(float)):
        order = rank_order(score, pool.depth)
        np.testing.assert_array_equal(order, brute_order(score, pool.depth))
        pos = rank_positions(order)
        curve = budget_curve(order, pool.path_prob("sampling"))
        for b in range(1, 16):
            mask = select_top(score, pool.depth, b)
            np.testing.assert_array_equal(mask, pos < b)
            np.testing.assert_allclose(value(mask, pool.path_prob("sampling")), curve[:, min(b, 14) - 1])


@pytest.mark.parametrize("seed", range(4))
def test_packed_float32_ranking_is_exact_under_ties_zeros_and_nan(seed):
    rng = np.random.default_rng(seed)
    levels = np.array([0.0, -0.0, -0.5, -1.0, -np.inf, np.nan, 3.0], dtype=np.float32)
    score = rng.choice(levels, size=(40, 30)).astype(np.float32)
    depth = rng.integers(1, 5, size=(40, 30))
    order = rank_order(score, depth)
    np.testing.assert_array_equal(order, brute_order(score.astype(np.float64), depth))
    np.testing.assert_array_equal(order, rank_order(score.astype(np.float64), depth))


def test_draft_groups_same_for_float32_and_float64_pools():
    from specrank.selection.draws import DraftGroups

    p32 = random_pool(20, 25, 4, seed=7, ties=True, dtype=np.float32)
    arrays = _arrays(p32)
    arrays["draft_logp"] = arrays["draft_logp"].astype(np.float64)
    g32, g64 = DraftGroups.of(p32), DraftGroups.of(PoolBatch(**arrays))
    for name in ("order", "within", "n_desc", "top"):
        np.testing.assert_array_equal(getattr(g32, name), getattr(g64, name))


def test_depth_sorted_pool_tie_break_is_by_depth_then_index():
    # depth-sorted pool of 5: scores all tie; order must be pool order
    depth = np.array([[1, 1, 2, 2, 3]])
    score = np.zeros((1, 5))
    np.testing.assert_array_equal(rank_order(score, depth), [[0, 1, 2, 3, 4]])
    depth2 = np.array([[1, 2, 1, 3, 2]])  # not depth-sorted: depth wins over index
    np.testing.assert_array_equal(rank_order(score, depth2), [[0, 2, 1, 4, 3]])
    np.testing.assert_array_equal(select_top(score, depth2, 3), [[True, True, True, False, False]])


def test_nan_scores_rank_last():
    score = np.array([[np.nan, 0.5, 0.1]])
    depth = np.ones((1, 3), dtype=int)
    np.testing.assert_array_equal(rank_order(score, depth), [[1, 2, 0]])
    np.testing.assert_array_equal(select_top(score, depth, 2), [[False, True, True]])


def test_single_round_hot_path_shape():
    pool = random_pool(1, 40, 4, seed=9)
    mask = select_top(pool.draft_logp, pool.depth, 10)
    assert mask.shape == (1, 40) and mask.sum() == 10


@pytest.mark.parametrize("budget", [0, -1, 2.5, True])
def test_bad_budget_names_field(budget):
    with pytest.raises(SelectionError, match="^budget:"):
        select_top(np.zeros((1, 3)), np.ones((1, 3), dtype=int), budget)


def test_mismatched_shapes_name_field():
    with pytest.raises(SelectionError, match="^depth:"):
        rank_order(np.zeros((2, 3)), np.ones((2, 4), dtype=int))
    with pytest.raises(SelectionError, match="^path_prob:"):
        value(np.zeros((2, 3), bool), np.zeros((3, 3)))


def _arrays(pool):
    return {k: getattr(pool, k).copy() for k in
            ("token", "parent", "depth", "q_edge", "draft_logp", "p_edge", "p_argmax_child")}


@pytest.mark.parametrize(
    "field, edit, pattern",
    [
        ("parent", lambda a: a["parent"].__setitem__((0, 5), 7), "^parent:"),
        ("depth", lambda a: a["depth"].__setitem__((1, 6), 9), "^depth:"),
        ("q_edge", lambda a: a["q_edge"].__setitem__((0, 4), -0.1), "^q_edge:"),
        ("p_edge", lambda a: a["p_edge"].__setitem__((0, 4), 1.5), "^p_edge:"),
        ("p_argmax_child", lambda a: a["p_argmax_child"].__setitem__((0, 4), 2), "^p_argmax_child:"),
        ("draft_logp", lambda a: a["draft_logp"].__setitem__((0, 7), 0.5), "^draft_logp:"),
        ("p_edge", lambda a: a.__setitem__("p_edge", a["p_edge"][:, :-1]), "^p_edge: shape"),
    ],
)
def test_validation_errors_name_the_field(field, edit, pattern):
    arrays = _arrays(random_pool(3, 10, 3, seed=4))
    edit(arrays)
    with pytest.raises(PoolError, match=pattern) as info:
        PoolBatch(**arrays).validate()
    assert "\n" not in str(info.value)


def test_from_frame_round_trip_and_missing_column():
    pool = random_pool(5, 9, 3, seed=6)
    arrays = _arrays(pool)
    df = pd.DataFrame({k: list(v) for k, v in arrays.items()})
    df["prompt_id"] = pool.prompt_id
    back = PoolBatch.from_frame(df)
    for k, v in arrays.items():
        np.testing.assert_array_equal(getattr(back, k), v.astype(POOL_COLUMNS[k]))
    np.testing.assert_array_equal(back.prompt_id, pool.prompt_id)
    with pytest.raises(ValueError, match="missing columns p_edge"):
        PoolBatch.from_frame(df.drop(columns="p_edge"))
