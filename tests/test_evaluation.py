"""Offline evaluation on synthetic rounds: exact values, alignment, cross-fitting, statistics."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specrank.evaluation import align_predictions, evaluate
from specrank.evaluation.data import Rounds
from specrank.evaluation.offline import first_factor_estimates, split_labels
from specrank.evaluation.values import mixture_values, per_depth_edges
from specrank.featurize.synthetic import synthetic_rounds
from specrank.schema import SchemaError
from specrank.selection.scores import MIXTURE_WEIGHTS, fixed_values, score_of

BUDGETS = (2, 8, 24, 59)


def make_rounds(temperature: float = 1.0, seed: int = 3) -> Rounds:
    table, manifest = synthetic_rounds(n_prompts=16, rounds_per_prompt=10, topk=6, depth=3, expand=6,
                                       temperature=temperature, seed=seed)
    return Rounds.from_table(table, manifest)


def controls_frame(rounds: Rounds) -> pd.DataFrame:
    """Predictions: the exact root factor (``perfect``) and the draft factor (``copy``), in shuffled row order."""
    n, k = rounds.n_rounds, rounds.topk
    frame = pd.DataFrame({
        "prompt_id": np.repeat(rounds.prompt_id, k),
        "task": np.repeat(rounds.task, k),
        "round": np.repeat(rounds.round, k),
        "cand": np.tile(np.arange(k), n),
        "perfect": rounds.first_label.reshape(-1),
        "copy": rounds.pool.q_edge[:, :k].astype(np.float64).reshape(-1),
        # columns `specrank train` also writes, which are not first-factor rerankers here
        "draft": rounds.pool.q_edge[:, :k].astype(np.float64).reshape(-1),
        "per_depth": np.zeros(n * k),
        "label": rounds.first_label.reshape(-1),
        "fold": np.repeat(rounds.fold, k),
    })
    return frame.sample(frac=1.0, random_state=0).reset_index(drop=True)


@pytest.fixture(scope="module")
def rounds():
    return make_rounds()


@pytest.fixture(scope="module")
def evaluation(rounds):
    return evaluate(rounds, align_predictions(rounds, controls_frame(rounds)), budgets=BUDGETS, n_boot=200)


def brute_value(rounds: Rounds, r: int, score: np.ndarray, budget: int) -> float:
    """Top-B by (score desc, depth asc, index asc) with a Python sort; sum of path probabilities."""
    pool = rounds.pool
    path = pool.path_prob(rounds.law)[r]
    keys = sorted(range(pool.shape[1]), key=lambda j: (-score[j], pool.depth[r, j], j))
    return float(sum(path[j] for j in keys[:budget]))


def test_exact_values_against_brute_force(rounds, evaluation):
    s = evaluation.summary.set_index(["score", "budget"])
    pool, k = rounds.pool, rounds.topk
    p1 = rounds.first_label
    for b in (8, 59):
        root = np.mean([brute_value(rounds, r, p1[r, pool.first_ancestor[r]] * np.exp(
            pool.draft_logp[r] - pool.draft_logp[r, pool.first_ancestor[r]]), b) for r in range(rounds.n_rounds)])
        draft = np.mean([brute_value(rounds, r, pool.draft_logp[r], b) for r in range(rounds.n_rounds)])
        assert s.loc[("root", b), "mean"] == pytest.approx(root, rel=1e-9)
        assert s.loc[("draft", b), "mean"] == pytest.approx(draft, rel=1e-9)
    assert k == 6


def test_controls_reproduce_root_and_draft_exactly(evaluation):
    s = evaluation.summary.set_index(["score", "budget"])
    for b in BUDGETS:
        assert s.loc[("perfect", b), "mean"] == pytest.approx(s.loc[("root", b), "mean"], abs=1e-12)
        assert s.loc[("copy", b), "mean"] == pytest.approx(s.loc[("draft", b), "mean"], abs=1e-12)
        assert s.loc[("perfect", b), "root_share"] == pytest.approx(100.0)
        assert (s.loc[("perfect", b), "root_share_low"], s.loc[("perfect", b), "root_share_high"]) == pytest.approx((100, 100))
        assert s.loc[("copy", b), "gain"] == pytest.approx(0.0, abs=1e-12)
        assert s.loc[("root", b), "gain_low"] <= s.loc[("root", b), "gain"] <= s.loc[("root", b), "gain_high"]
        assert s.loc[("oracle", b), "mean"] >= s.loc[("depth2", b), "mean"] - 1e-12
    assert s.loc[("root", 8), "gain_low"] > 0  # the synthetic target disagrees with the drafter


def test_predictions_alignment_is_order_free_and_strict(rounds):
    frame = controls_frame(rounds)
    aligned = align_predictions(rounds, frame)
    assert sorted(aligned) == ["copy", "perfect"]
    np.testing.assert_array_equal(aligned["perfect"], rounds.first_label)
    with pytest.raises(SchemaError, match="is missing"):
        align_predictions(rounds, frame.iloc[1:])
    with pytest.raises(SchemaError, match="repeats"):
        align_predictions(rounds, pd.concat([frame, frame.iloc[:1]]))
    bad = frame.copy()
    bad.loc[0, "round"] = 999
    with pytest.raises(SchemaError, match="matches no first-level candidate"):
        align_predictions(rounds, bad)
    bad = frame.copy()
    bad.loc[3, "copy"] = np.nan
    with pytest.raises(SchemaError, match="copy contains NaN"):
        align_predictions(rounds, bad)
    with pytest.raises(ValueError, match="clashes with a built-in score"):
        evaluate(rounds, {"root": rounds.first_label}, budgets=(8,), n_boot=10)


def test_per_depth_calibration_is_cross_fitted(rounds):
    edges = per_depth_edges(rounds)
    fold = rounds.fold
    changed = make_rounds()
    p = changed.pool.p_edge.copy()
    p[fold == 0] = np.clip(p[fold == 0] ** 3, 0, 1)  # relabel half 0 only
    changed.pool.p_edge = p
    after = per_depth_edges(changed)
    np.testing.assert_array_equal(after[fold == 0], edges[fold == 0])  # half 0 scored by half-1 maps
    assert not np.allclose(after[fold == 1], edges[fold == 1])


def test_mixture_weight_of_each_half_is_chosen_on_the_other():
    rounds = make_rounds()
    fold, discriminating = rounds.fold, False
    noise = np.log(np.random.default_rng(1).dirichlet(np.ones(rounds.topk), rounds.n_rounds))
    # the cache row is exact on half 1 and noise on half 0, so the halves prefer different weights
    rounds.rows["cache"] = np.where((fold == 1)[:, None], np.log(rounds.first_label), noise)
    values, chosen = mixture_values(rounds, BUDGETS)
    for source in ("cache", "preceding"):
        per_w = np.stack([fixed_values(rounds.pool, score_of(rounds.pool, "mixture", rounds.law,
                          row_logp=rounds.rows[source], weight=w), list(BUDGETS), rounds.law)[0] for w in MIXTURE_WEIGHTS])
        for half in (0, 1):
            other = np.asarray(MIXTURE_WEIGHTS)[per_w[:, fold != half].mean(axis=1).argmax(axis=0)]
            own = np.asarray(MIXTURE_WEIGHTS)[per_w[:, fold == half].mean(axis=1).argmax(axis=0)]
            np.testing.assert_array_equal(chosen[f"mix_{source}"][half], other)
            discriminating |= bool((own != other).any())
            pick = [MIXTURE_WEIGHTS.index(w) for w in other]
            np.testing.assert_array_equal(values[f"mix_{source}"][fold == half],
                                          per_w[pick, :, range(len(BUDGETS))].T[fold == half])
    assert discriminating  # an own-half choice would fail this test


def test_first_factor_errors_and_top1(rounds, evaluation):
    ff = evaluation.first_factor.set_index("estimate")
    q1, p1 = rounds.pool.q_edge[:, : rounds.topk].astype(float), rounds.first_label
    assert ff.loc["draft", "mse"] == pytest.approx(np.mean((q1 - p1) ** 2))
    assert ff.loc["perfect", "mse"] == pytest.approx(0.0, abs=1e-15)
    target = rounds.pool.p_argmax_child[:, : rounds.topk] == 1
    assert ff.loc["draft", "top1_hit_pct"] == pytest.approx(100 * target[:, 0].mean())
    assert ff.loc["perfect", "top1_hit_pct"] == pytest.approx(100 * target.any(axis=1).mean())
    est = first_factor_estimates(rounds, {})
    absent = np.isnan(rounds.rows["cache"]).all(axis=1)
    assert absent.any() and (~absent).any()
    np.testing.assert_array_equal(est["subst_cache"][absent], q1[absent])  # rounds without the row keep q1


def test_splits_cover_all_rounds_and_match_labels(rounds, evaluation):
    sp = evaluation.splits
    for kind, t in sp[(sp["score"] == "draft") & (sp["budget"] == 8)].groupby("split_kind"):
        assert t["rounds"].sum() == rounds.n_rounds, kind
        assert t["round_share"].sum() == pytest.approx(1.0)
    agree = sp[(sp["split_kind"] == "agreement") & (sp["group"] == "agree") & (sp["score"] == "draft")]
    assert agree["rounds"].iloc[0] == int((rounds.pool.p_argmax_child[:, 0] == 1).sum())
    labels = split_labels(rounds)["entropy_quintile"]
    assert set(labels) == {"Q1", "Q2", "Q3", "Q4", "Q5"}
    low = rounds.root_entropy[labels == "Q1"].max()
    assert low <= rounds.root_entropy[labels == "Q5"].min()
    assert set(sp[sp["split_kind"] == "task"]["group"]) == set(rounds.task)


def test_greedy_run_uses_point_masses(tmp_path):
    rounds = make_rounds(temperature=0.0)
    assert rounds.law == "greedy"
    ev = evaluate(rounds, align_predictions(rounds, controls_frame(rounds)), budgets=(8,), n_boot=50)
    s = ev.summary.set_index("score")
    assert s.loc["perfect", "mean"] == pytest.approx(s.loc["root", "mean"])
    assert s.loc["root", "gain"] >= 0  # root selection cannot shorten the greedy path
    ff = ev.first_factor.set_index("estimate")
    assert ff.loc["perfect", "top1_hit_pct"] == pytest.approx(100.0)  # only rounds holding the argmax count


def test_bad_budgets_and_bootstrap(rounds):
    with pytest.raises(ValueError, match="budgets"):
        evaluate(rounds, {}, budgets=(0, 8), n_boot=10)
    with pytest.raises(ValueError, match="budgets"):
        evaluate(rounds, {}, budgets=(10_000,), n_boot=10)
    with pytest.raises(ValueError, match="bootstrap"):
        evaluate(rounds, {}, budgets=(8,), n_boot=0)


def test_root_share_figure_keeps_its_bars_readable_when_an_interval_explodes():
    from specrank.evaluation.figures import root_share_by_task

    def rows(groups, low):
        return [{"score": "rows", "budget": 8, "group": g, "split_kind": "task", "root_share": 40.0,
                 "root_share_low": low if g == "b" else 10.0, "root_share_high": 80.0} for g in groups]

    summary = pd.DataFrame(rows(["all"], 10.0)).drop(columns=["group", "split_kind"])
    for low, bottom in ((-900.0, -100.0), (-20.0, -25.0)):  # a near-zero root gain in a resample: -900%
        fig = root_share_by_task(summary, pd.DataFrame(rows(["a", "b"], low)))
        assert fig.axes[0].get_ylim() == pytest.approx((bottom, 105.0))


def test_root_share_figure_leaves_out_a_group_without_a_share_and_warns_nothing():
    """A task whose root selection gains nothing has a NaN share (and interval): no bar and no whisker, where a NaN
    bar made matplotlib compute its limits from NaN (a RuntimeWarning in every evaluation that had such a task)."""
    import warnings

    from specrank.evaluation.figures import root_share_by_task

    def row(group, share, low, high):
        return {"score": "rows", "budget": 8, "group": group, "split_kind": "task", "root_share": share,
                "root_share_low": low, "root_share_high": high}

    summary = pd.DataFrame([row("all", 40.0, 10.0, 80.0)]).drop(columns=["group", "split_kind"])
    splits = pd.DataFrame([row("a", 30.0, 5.0, 60.0), row("b", np.nan, np.nan, np.nan), row("c", 20.0, np.nan, 50.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = root_share_by_task(summary, splits)
    ax = fig.axes[0]
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == [20.0, 30.0, 40.0]  # a, c and all; b has no bar
    whiskers = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(whiskers) == 1 and len(whiskers[0].lines[2][0].get_segments()) == 2  # a and all; c has no interval
