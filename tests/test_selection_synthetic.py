"""Synthetic EAGLE-3-shaped rounds: shape, validity, reproducibility, realized vs expected acceptance."""

import numpy as np

from specrank.selection.pool import PoolBatch
from specrank.selection.scores import fixed_values, score_of
from specrank.selection.synthetic import random_pool, synthetic_pools


def test_paper_pool_shape_and_labels():
    rounds = synthetic_pools(60, seed=1, n_prompts=7)
    pool = rounds.pool.validate()
    assert pool.shape == (60, 710) and pool.n_first == 10
    assert np.bincount(pool.depth[0])[1:].tolist() == [10] + [100] * 7
    expanded = {int(j) for j in np.unique(pool.parent[0]) if j >= 0}
    assert len(expanded) == 70 and set(range(10)) <= expanded
    assert sorted(set(pool.prompt_id)) == list(range(7))
    for pid in range(7):  # one task per prompt, rounds numbered from 0
        at = pool.prompt_id == pid
        assert len(set(pool.task[at])) == 1 and rounds.rounds["round"][at].tolist() == list(range(at.sum()))
    assert (pool.p_argmax_child[:, :10].sum(axis=1) <= 1).all()
    assert rounds.rows["cache_logp"].shape == (60, 10)


def test_seeded_and_reproducible():
    a, b = synthetic_pools(5, seed=3).pool, synthetic_pools(5, seed=3).pool
    c = synthetic_pools(5, seed=4).pool
    np.testing.assert_array_equal(a.p_edge, b.p_edge)
    assert not np.array_equal(a.p_edge, c.p_edge)


def test_realized_acceptance_agrees_with_expected_value():
    rounds = synthetic_pools(2000, seed=5)
    expected, _ = fixed_values(rounds.pool, score_of(rounds.pool, "draft"), [59])
    realized = rounds.rounds["accepted"].astype(float)
    se = realized.std() / np.sqrt(len(realized))
    assert abs(realized.mean() - expected.mean()) < 4 * se


def test_to_frame_round_trips_through_from_frame():
    rounds = synthetic_pools(6, topk=3, depth=3, expand=2, seed=2)
    back = PoolBatch.from_frame(rounds.to_frame())
    np.testing.assert_array_equal(back.parent, rounds.pool.parent)
    np.testing.assert_array_equal(back.draft_logp, rounds.pool.draft_logp)
    np.testing.assert_array_equal(back.task, rounds.pool.task)


def test_random_pool_is_valid_with_ties():
    pool = random_pool(10, 30, 5, seed=0, ties=True, dtype=np.float32)
    assert pool.validate() is pool and pool.draft_logp.dtype == np.float32
