"""Feature correctness on hand-built rounds (one test per feature family) and the featurizer's contracts."""

import numpy as np
import pandas as pd
import pytest

from specrank.featurize import featurize_rounds, features_meta
from specrank.featurize.sets import BASE, ROWS

NAN = np.nan
TOPK = 3
# Pool (M = 8): first level 0, 1, 2; 3, 4 children of 1; 5 child of 0; 6 child of 3; 7 child of 5.
PARENT = [-1, -1, -1, 1, 1, 0, 3, 5]
DEPTH = [1, 1, 1, 2, 2, 2, 3, 3]
Q = [0.2, 0.5, 0.1, 0.6, 0.3, 0.9, 0.5, 1.0]
TOKEN = [10, 11, 12, 20, 21, 22, 30, 31]


def _draft_logp():
    logp = np.zeros(8)
    for i, (p, q) in enumerate(zip(PARENT, Q)):
        logp[i] = np.log(q) + (logp[p] if p >= 0 else 0.0)
    return logp


def hand_rounds():
    """Four rounds: prompt b rounds 1, 0 (out of order) and prompt a rounds 0, 2 (round 1 missing)."""
    n = 4
    pool = lambda v: np.tile(np.asarray(v), (n, 1))  # noqa: E731
    return {
        "prompt_id": np.array(["b", "b", "a", "a"]),
        "task": np.array(["qa", "qa", "code", "code"]),
        "round": np.array([1, 0, 0, 2]),
        "position": np.array([3, 0, 0, 9]),
        "prompt_len": np.array([50, 50, 7, 7]),
        "root_token": np.array([11, 5, 12, 99]),
        "token": pool(TOKEN),
        "parent": pool(PARENT).astype(np.int16),
        "depth": pool(DEPTH).astype(np.int8),
        "q_edge": pool(Q).astype(np.float32),
        "draft_logp": pool(_draft_logp()).astype(np.float32),
        "p_edge": pool([0.1, 0.7, 0.05, 0.5, 0.2, 0.3, 0.4, 0.9]).astype(np.float32),
        "p_argmax_child": pool([0, 1, 0, 1, 0, 1, 1, 1]).astype(np.int8),
        "accepted": np.array([1, 2, 0, 4]),
        "cache_logp": np.array([[-1.0, -2.0, NAN], [NAN] * 3, [-0.5, -0.25, -3.0], [NAN] * 3]),
        "same_token_logp": np.array([[NAN] * 3, [-2.0, -1.0, -4.0], [NAN] * 3, [NAN] * 3]),
        "preceding_logp": np.array([[-1.0, NAN, -2.0], [-3.0, -1.5, -1.0], [-1.0, -1.0, NAN], [-0.1, -0.2, -0.3]]),
        "cache_age": np.array([4, -1, 2, -1]),
        "prev_tree_root_token_count": np.array([2, -1, 0, 5]),
    }


def manifest(temperature=1.0, topk=TOPK):
    return {"temperature": temperature, "topk": topk, "depth": 3, "expand": 2, "budget": 4}


@pytest.fixture(scope="module")
def feats():
    return featurize_rounds(hand_rounds(), manifest())


def round_rows(df, prompt, rnd):
    return df[(df.prompt_id == prompt) & (df["round"] == rnd)].sort_values("cand")


def test_keys_fold_and_metadata(feats):
    assert len(feats) == 4 * TOPK
    assert list(feats.columns[:4]) == ["prompt_id", "task", "round", "cand"]
    # prompt number = rank among sorted ids: a -> 0, b -> 1; fold = parity
    assert feats.groupby("prompt_id")["prompt_index"].first().to_dict() == {"a": 0, "b": 1}
    assert (feats.fold == feats.prompt_index % 2).all()
    assert features_meta(feats) == {"label_kind": "probability", "topk": 3, "temperature": 1.0,
                                    "version": features_meta(feats)["version"]}
    for name in ROWS:
        assert name == "token_prior" or name in feats.columns, name


def test_draft_family(feats):
    r = round_rows(feats, "b", 1)
    np.testing.assert_allclose(r.q, [0.2, 0.5, 0.1], rtol=1e-6)
    np.testing.assert_allclose(r.log_q, np.log([0.2, 0.5, 0.1]), rtol=1e-6)
    np.testing.assert_array_equal(r.sib_rank, [1, 0, 2])
    np.testing.assert_allclose(r.sib_top_q, 0.5, rtol=1e-6)
    np.testing.assert_allclose(r.sib_gap, [0.3, 0.0, 0.4], atol=1e-7)
    np.testing.assert_allclose(r.sib_sum_q, 0.8, rtol=1e-6)
    share = np.array([0.25, 0.625, 0.125])
    np.testing.assert_allclose(r.sib_entropy, -(share * np.log(share)).sum(), rtol=1e-6)


def test_subtree_family(feats):
    r = round_rows(feats, "a", 0)
    two = np.array([2 / 3, 1 / 3])
    np.testing.assert_allclose(r.child_max_q.iloc[:2], [0.9, 0.6], rtol=1e-6)
    np.testing.assert_allclose(r.child_entropy.iloc[:2], [0.0, -(two * np.log(two)).sum()], atol=1e-6)
    assert np.isnan(r.child_max_q.iloc[2]) and np.isnan(r.child_entropy.iloc[2])  # no child in the pool
    np.testing.assert_array_equal(r.subtree_size, [2, 3, 0])
    np.testing.assert_allclose(r.subtree_mass, [0.2 * 0.9 * 2, 0.5 * 0.6 + 0.5 * 0.3 + 0.5 * 0.6 * 0.5, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(r.subtree_expanded, [2, 2, 0])


def test_context_family(feats):
    prev = {(p, r): round_rows(feats, p, r).prev_accepted.iloc[0] for p, r in [("b", 1), ("b", 0), ("a", 0), ("a", 2)]}
    assert prev[("b", 1)] == 2  # accepted of b's round 0, although listed after round 1
    assert np.isnan(prev[("b", 0)]) and np.isnan(prev[("a", 0)])
    assert np.isnan(prev[("a", 2)])  # round 1 is not in the table: missing, not round 0's value
    np.testing.assert_array_equal(round_rows(feats, "b", 1).repeats_root, [0, 1, 0])  # root token 11
    np.testing.assert_array_equal(round_rows(feats, "a", 0).repeats_root, [0, 0, 1])
    r = round_rows(feats, "a", 2)
    assert (r.task == "code").all() and (r.prompt_len == 7).all() and (r.position == 9).all()


def test_rows_family(feats):
    r = round_rows(feats, "b", 1)
    np.testing.assert_allclose(r.cache_logp, [-1.0, -2.0, NAN])
    np.testing.assert_allclose(r.cache_gap, [0.0, -1.0, NAN])
    assert r.same_token_logp.isna().all() and r.same_token_gap.isna().all()  # absent row
    np.testing.assert_allclose(r.preceding_gap, [0.0, NAN, -1.0])  # the continuation entry is missing
    assert (r.cache_age == 4).all() and (r.prev_tree_root_token_count == 2).all()
    r = round_rows(feats, "b", 0)
    assert r.cache_age.isna().all() and r.prev_tree_root_token_count.isna().all()  # -1 = absent
    np.testing.assert_allclose(r.same_token_gap, [-1.0, 0.0, -3.0])
    np.testing.assert_allclose(round_rows(feats, "a", 0).cache_gap, [-0.25, 0.0, -2.75])


def test_labels_by_run_kind():
    sampling = featurize_rounds(hand_rounds(), manifest(1.0))
    greedy = featurize_rounds(hand_rounds(), manifest(0.0))
    np.testing.assert_allclose(round_rows(sampling, "a", 0).label, [0.1, 0.7, 0.05], rtol=1e-6)
    np.testing.assert_array_equal(round_rows(greedy, "a", 0).label, [0, 1, 0])
    assert features_meta(greedy)["label_kind"] == "argmax"
    assert "label" not in featurize_rounds(hand_rounds(), manifest(), labels=False)


def test_one_round_online_equals_batch(feats):
    """The decoder's path: one round, its previous acceptance given, no labels -> identical features."""
    rounds = hand_rounds()
    one = {k: v[:1] for k, v in rounds.items() if k != "accepted"}
    one["prev_accepted"] = np.array([2.0])
    online = featurize_rounds(one, manifest(), labels=False)
    batch = round_rows(feats, "b", 1).reset_index(drop=True)
    cols = [c for c in ROWS if c != "token_prior"] + ["token"]
    pd.testing.assert_frame_equal(online[cols], batch[cols], check_dtype=False, check_categorical=False)


def test_base_and_rows_sets_are_disjoint_in_rows():
    assert set(BASE) < set(ROWS)
    assert not any("logp" in f or "gap" in f for f in BASE if f != "sib_gap")


def test_every_feature_of_the_sets_is_documented():
    from specrank.featurize.sets import DESCRIPTIONS

    assert set(ROWS) == set(DESCRIPTIONS)


def test_draft_and_row_features_match_their_definitions():
    from specrank.featurize.block import candidate_block
    from specrank.featurize.columns import COLUMN

    rng = np.random.default_rng(0)
    q1 = rng.dirichlet(np.ones(6), size=5)[:, :4].astype(np.float32)
    q1[0, 1] = q1[0, 2]  # a tie: ranked by pool index
    rows = np.log(rng.dirichlet(np.ones(9), size=(5, 3))[:, :, :4]).astype(np.float32)
    rows[1, 0] = np.nan  # a source absent in a round
    rows[2, 2, 1] = -np.inf  # the preceding row's zeroed continuation entry
    n = len(q1)
    parent = np.tile([-1, -1, -1, -1], (n, 1))
    block = candidate_block(np.arange(4)[None].repeat(n, 0), parent, np.ones_like(parent), q1, np.log(q1), 4,
                            np.full(n, 2), np.full(n, 30), np.arange(n), np.full(n, np.nan), rows[:, 0], rows[:, 1],
                            rows[:, 2], [3, -1, 0, 1, 2],
                            [-1, 1, 2, 0, 5])
    col = lambda name: block[:, :, COLUMN[name]]  # noqa: E731
    q = q1.astype(np.float64)
    np.testing.assert_array_equal(col("q"), q)
    np.testing.assert_allclose(col("log_q"), np.log(q), rtol=1e-15)
    order = np.argsort(-q, axis=1, kind="stable")
    np.testing.assert_array_equal(col("sib_rank"), np.argsort(order, axis=1))
    np.testing.assert_allclose(col("sib_top_q"), np.broadcast_to(q.max(1, keepdims=True), q.shape), rtol=1e-15)
    np.testing.assert_allclose(col("sib_gap"), q.max(1, keepdims=True) - q, atol=1e-15)
    np.testing.assert_allclose(col("sib_sum_q"), np.broadcast_to(q.sum(1, keepdims=True), q.shape), rtol=1e-15)
    share = q / q.sum(1, keepdims=True)
    np.testing.assert_allclose(col("sib_entropy")[:, 0], -(share * np.log(share)).sum(1), rtol=1e-12)
    np.testing.assert_array_equal(col("repeats_root"), np.tile([0.0, 0.0, 1.0, 0.0], (n, 1)))
    np.testing.assert_array_equal(col("position")[:, 0], np.arange(n))
    assert np.isnan(col("child_max_q")).all() and (col("subtree_size") == 0).all()  # no second level
    for s, source in enumerate(("cache", "same_token", "preceding")):
        lp = rows[:, s].astype(np.float64)
        np.testing.assert_array_equal(col(f"{source}_logp"), lp)
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(col(f"{source}_gap"), lp - np.fmax.reduce(lp, axis=1, keepdims=True))
    np.testing.assert_array_equal(col("cache_age")[:, 0], [3, np.nan, 0, 1, 2])
    np.testing.assert_array_equal(col("prev_tree_root_token_count")[:, 0], [np.nan, 1, 2, 0, 5])
    absent = candidate_block(np.arange(4)[None], parent[:1], np.ones((1, 4)), q1[:1], np.log(q1[:1]), 4, [0], [1],
                             [0], [0])
    assert np.isnan(absent[0, :, [COLUMN[f] for f in ("cache_logp", "preceding_gap", "cache_age")]]).all()