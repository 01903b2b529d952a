"""Reranker estimators: isotonic controls, gradient boosting, save/load and the online interface."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from specrank.featurize import featurize_rounds
from specrank.featurize.synthetic import synthetic_rounds
from specrank.rerankers import (
    GBMReranker,
    IsotonicFirstFactor,
    PerDepthCalibration,
    RerankerError,
    load_reranker,
)

SMALL = {"n_estimators": 60, "num_leaves": 15, "n_jobs": 1}


@pytest.fixture(scope="module")
def rounds():
    return synthetic_rounds(12, 20, topk=6, depth=3, expand=4, seed=5)


@pytest.fixture(scope="module")
def sampling(rounds):
    return featurize_rounds(*rounds)


@pytest.fixture(scope="module")
def greedy(rounds):
    table, manifest = rounds
    return featurize_rounds(table, {**manifest, "temperature": 0.0})


def _frame(q, label, kind="probability", topk=1, **cols):
    df = pd.DataFrame({"prompt_id": "p", "q": q, "label": label, **cols})
    df.attrs["specrank"] = {"label_kind": kind, "topk": topk, "temperature": 1.0, "version": "0.1.0"}
    return df


def test_isotonic_uses_equal_count_bins_and_is_monotone():
    # 2 bins of 3: q means 0.2 and 0.8, label means 0.5 and 0.1 -> pooled to 0.3 (decreasing data)
    q = np.array([0.1, 0.2, 0.3, 0.7, 0.8, 0.9])
    y = np.array([0.5, 0.5, 0.5, 0.1, 0.1, 0.1])
    iso = IsotonicFirstFactor(n_bins=2).fit(_frame(q, y))
    np.testing.assert_allclose(iso.iso_.X_thresholds_, [0.2, 0.8])
    np.testing.assert_allclose(iso.predict(_frame(q, y)), 0.3)
    # 200 equal-count bins on 2,000 rows: 10 rows per bin, predictions non-decreasing in q
    rng = np.random.default_rng(0)
    q = rng.random(2000)
    y = np.clip(q**2 + 0.1 * rng.normal(size=2000), 0, 1)
    iso = IsotonicFirstFactor().fit(_frame(q, y))
    assert len(iso.iso_.X_thresholds_) <= 200
    grid = np.linspace(0, 1, 101)
    pred = iso.predict(_frame(grid, grid))
    assert np.all(np.diff(pred) >= 0) and np.abs(pred - grid**2).max() < 0.1


def test_per_depth_calibration_keeps_a_map_per_depth():
    rng = np.random.default_rng(1)
    q = rng.random(4000)
    depth = np.repeat([1, 2], 2000)
    y = np.where(depth == 1, q, q / 2)
    edges = _frame(q, y, depth=depth, q_edge=q)
    cal = PerDepthCalibration(n_bins=50).fit(edges)
    assert sorted(cal.maps_) == [1, 2]
    probe = _frame([0.6, 0.6, 0.6], [0, 0, 0], depth=[1, 2, 5], q_edge=[0.6, 0.6, 0.6])
    np.testing.assert_allclose(cal.predict(probe), [0.6, 0.3, 0.3], atol=0.03)  # depth 5 uses the deepest map
    np.testing.assert_allclose(cal.predict_first_factor(_frame([0.6], [0])), [0.6], atol=0.03)


@pytest.mark.parametrize("backend", ["lightgbm", "sklearn"])
def test_gbm_objectives_and_probability_range(sampling, greedy, backend):
    for feats, kind in ((sampling, "probability"), (greedy, "argmax")):
        est = GBMReranker("rows", backend=backend, **SMALL).fit(feats)
        pred = est.predict(feats)
        assert est.label_kind_ == kind and pred.shape == (len(feats),)
        assert np.all((pred >= 0) & (pred <= 1))
        if backend == "lightgbm":
            assert est.model_.params["objective"] == ("binary" if kind == "argmax" else "cross_entropy")
        else:
            assert type(est.model_).__name__.endswith("Classifier" if kind == "argmax" else "Regressor")
    assert GBMReranker().get_params()["n_estimators"] == 100
    assert (GBMReranker().learning_rate, GBMReranker().num_leaves) == (0.1, 15)


@pytest.mark.parametrize("backend", ["lightgbm", "sklearn"])
def test_gbm_leaf_penalty_shrinks_predictions_to_the_mean(sampling, backend):
    spread = [GBMReranker("base", backend=backend, reg_lambda=lam, **SMALL).fit(sampling).predict(sampling).std()
              for lam in (0.0, 1e6)]
    assert spread[1] < 0.1 * spread[0]


def test_gbm_monotone_in_draft_probability(sampling):
    est = GBMReranker("base", monotone_draft=True, **SMALL).fit(sampling)
    probe = pd.concat([sampling.iloc[[0]]] * 50, ignore_index=True)
    probe["q"] = np.linspace(0.001, 0.999, 50)
    probe["log_q"] = np.log(probe["q"])
    probe.attrs = sampling.attrs
    assert np.all(np.diff(est.predict(probe)) >= -1e-12)


def test_save_load_roundtrip_and_metadata(tmp_path, sampling):
    est = GBMReranker("rows", **SMALL).fit(sampling)
    est.save(tmp_path / "m")
    back = load_reranker(tmp_path / "m")
    np.testing.assert_array_equal(back.predict(sampling), est.predict(sampling))
    assert back.meta_["features"] == est.features_ and back.meta_["label_kind"] == "probability"
    assert back.meta_["topk"] == 6 and back.meta_["version"] == est.version_
    (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a specrank reranker"):
        load_reranker(tmp_path / "junk.pkl")


def test_kind_topk_and_column_mismatches_raise(sampling, greedy):
    est = GBMReranker("base", **SMALL).fit(greedy)
    with pytest.raises(RerankerError, match="argmax labels .*greedy.* got probability features"):
        est.predict(sampling)
    wrong_topk = greedy.copy()
    wrong_topk.attrs = {"specrank": {**greedy.attrs["specrank"], "topk": 10}}
    with pytest.raises(RerankerError, match="topk=6 got topk=10"):
        est.predict_first_factor(wrong_topk)
    with pytest.raises(ValueError, match="missing columns sib_entropy"):
        est.predict(greedy.drop(columns=["sib_entropy"]))
    with pytest.raises(ValueError, match="no specrank metadata"):
        est.predict(_strip(greedy))
    bad = sampling.copy()
    bad.loc[0, "label"] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clone(est).fit(bad)
    with pytest.raises(ValueError, match="unknown feature set"):
        GBMReranker("everything").fit(sampling)


def _strip(df):
    df = df.copy()
    df.attrs = {}
    return df


def test_online_interface_on_one_round_equals_batch(rounds, sampling):
    """The decoder featurizes a single round (prev_accepted given, no labels) and gets the same prediction."""
    table, manifest = rounds
    est = GBMReranker("rows", **SMALL).fit(sampling)
    i = 25  # a round past the first of its prompt
    prev = [[float(table["accepted"][i - 1].as_py())]]
    one = table.slice(i, 1).drop_columns(["accepted"]).append_column("prev_accepted", prev)
    online = est.predict_first_factor(featurize_rounds(one, manifest, labels=False))
    np.testing.assert_allclose(online, est.predict(sampling)[i * 6:(i + 1) * 6], rtol=1e-12)


def test_unseen_task_is_missing_not_an_error(sampling):
    est = GBMReranker("base", **SMALL).fit(sampling)
    other = sampling.assign(task="translation")
    other.attrs = sampling.attrs
    assert np.isfinite(est.predict(other)).all()


def test_gbm_boosting_from_the_draft_starts_at_q(sampling, greedy):
    for feats in (sampling, greedy):
        start = GBMReranker("rows", boost_from_draft=True, n_estimators=1, learning_rate=1e-9, n_jobs=1).fit(feats)
        np.testing.assert_allclose(start.predict(feats), feats["q"].clip(1e-6, 1 - 1e-6), rtol=1e-6)
        plain = GBMReranker("rows", n_estimators=1, learning_rate=1e-9, n_jobs=1).fit(feats)
        assert np.ptp(plain.predict(feats)) < 1e-6  # a constant start ignores q: the control
    fitted = GBMReranker("rows", boost_from_draft=True, **SMALL).fit(sampling)
    err = lambda p: float(np.mean((p - sampling["label"]) ** 2))  # noqa: E731
    assert err(fitted.predict(sampling)) < err(sampling["q"].to_numpy())
    with pytest.raises(ValueError, match="lightgbm"):
        GBMReranker("rows", backend="sklearn", boost_from_draft=True).fit(sampling)


def test_the_ranking_reranker_is_calibrated_without_changing_its_order(sampling, monkeypatch):
    from specrank.rerankers import ranking
    from specrank.workflow.rerankers import make_reranker

    model = make_reranker("ranking", n_jobs=1, n_estimators=40, num_leaves=7)
    assert model.features == "rows" and model.objective == "lambdarank"
    model.fit(sampling)
    pred, label = model.predict(sampling), sampling["label"].to_numpy()
    # Platt's intercept makes the mean estimate the mean label on the training matrix (whose token prior is fitted
    # out of sample, so the prediction matrix differs a little)
    assert abs(pred.mean() - label.mean()) < 0.01
    monkeypatch.setattr(ranking, "platt", lambda score, y: (1.0, 0.0))  # the same ranking, uncalibrated
    raw = clone(model).fit(sampling)
    assert abs(raw.predict(sampling).mean() - label.mean()) > 0.05  # negative control: a ranking score is no probability
    m = model._matrix(sampling, model.prior_of(sampling))
    a, b = np.polyfit(raw.margin(m), model.margin(m), 1)
    np.testing.assert_allclose(model.margin(m), a * raw.margin(m) + b, atol=1e-9)
    assert a > 0  # an increasing map: every round's order is the ranking's
