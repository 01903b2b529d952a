"""Compiled inference: the shared-library trees against LightGBM's own predict, the cache, the fallback, and
the isotonic rerankers' array lookups against sklearn's predict."""

import pickle

import numpy as np
import pandas as pd
import pytest

lgb = pytest.importorskip("lightgbm")
pytest.importorskip("tl2cgen")

from specrank.featurize.features import META_KEY, feature_meta  # noqa: E402
from specrank.rerankers import GBMReranker, IsotonicFirstFactor  # noqa: E402
from specrank.rerankers.compiled import compile_booster, model_sha256  # noqa: E402
from specrank.rerankers.isotonic import binned_isotonic, isotonic_lookup  # noqa: E402

F = 6


def booster(seed=0, trees=30):
    """A binary booster over F features: a categorical column 0, NaNs in the others."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(3000, F))
    X[:, 0] = rng.integers(0, 5, len(X))
    X[:, 1:][rng.random((len(X), F - 1)) < 0.15] = np.nan
    y = (rng.random(len(X)) < 1 / (1 + np.exp(-np.nan_to_num(X[:, 1]) - (X[:, 0] == 2)))).astype(float)
    params = {"objective": "binary", "num_leaves": 15, "min_data_in_leaf": 10, "verbose": -1, "num_threads": 1,
              "deterministic": True, "seed": 0}
    return lgb.train(params, lgb.Dataset(X, y, categorical_feature=[0]), trees)


def random_rows(n=10_000, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, F)) * 1.5
    X[:, 0] = rng.integers(-1, 7, n)  # unseen and negative categories too
    X[rng.random((n, F)) < 0.1] = np.nan
    return X


def test_compiled_trees_equal_lightgbm_predict_and_a_perturbed_model_fails(tmp_path):
    b = booster()
    trees, how = compile_booster(b, tmp_path)
    assert trees is not None, how
    X = random_rows()
    raw = trees.raw(X)
    np.testing.assert_allclose(raw, b.predict(X, raw_score=True), rtol=0, atol=1e-9)
    np.testing.assert_allclose(1 / (1 + np.exp(-raw)), b.predict(X), rtol=0, atol=1e-9)
    perturbed = lgb.Booster(model_str=b.model_to_string())
    perturbed.set_leaf_output(0, 0, perturbed.get_leaf_output(0, 0) + 1e-3)  # one leaf of one tree
    wrong, _ = compile_booster(perturbed, tmp_path)
    assert np.abs(wrong.raw(X) - b.predict(X, raw_score=True)).max() > 1e-9


def test_library_is_built_once_per_model_and_reused(tmp_path):
    b = booster(seed=2, trees=5)
    first, _ = compile_booster(b, tmp_path)
    built = first.path.stat().st_mtime_ns
    again, _ = compile_booster(lgb.Booster(model_str=b.model_to_string()), tmp_path)
    assert again.path == first.path == tmp_path / f"{model_sha256(b)}.so"
    assert again.path.stat().st_mtime_ns == built
    assert len(list(tmp_path.iterdir())) == 1  # no temporary file left behind


def test_without_a_compiler_lightgbm_predicts_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    trees, how = compile_booster(booster(seed=3, trees=5), tmp_path / "cache")
    assert trees is None and how.startswith("LightGBM predict (no compiled trees:")


def test_a_present_value_that_reads_as_missing_is_left_to_lightgbm(tmp_path):
    b = booster(seed=4, trees=5)
    trees, _ = compile_booster(b, tmp_path)
    x = random_rows(4)
    x.view(np.int32).reshape(4, F, 2)[1, 2, 0] = -1  # a finite double whose low word is -1
    assert np.isfinite(x[1, 2]) and trees.raw(x) is None


def _features(n=400, seed=5):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"q": rng.random(n), "token": rng.integers(0, 30, n), "task": "t"})
    for c in ("log_q", "sib_rank", "position"):
        df[c] = rng.normal(size=n)
    df["label"] = (rng.random(n) < df["q"]).astype(float)
    df.attrs[META_KEY] = feature_meta("argmax", 4, 0.0)
    return df


def test_gbm_reranker_compiled_and_fallback_agree_and_name_their_path(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path))
    X = _features()
    est = GBMReranker(features=["q", "log_q", "sib_rank", "position", "task", "token_prior"], n_estimators=20,
                      num_leaves=7, min_child_samples=5, n_jobs=1).fit(X)
    fallback = est.predict(X)
    assert est.compile("lightgbm").inference_ == "LightGBM predict" and est.trees_ is None
    fastest = est.compile().inference_  # timed against LightGBM: either path, with its timing
    assert " ms, LightGBM " in fastest and (est.trees_ is not None) == fastest.startswith("compiled trees")
    with pytest.raises(ValueError, match="'gpu' is not one of fastest, compiled, lightgbm"):
        est.compile("gpu")
    assert est.compile("compiled").inference_.startswith("compiled trees") and est.trees_ is not None
    np.testing.assert_allclose(est.predict(X), fallback, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fallback, est.model_.predict(est._matrix(X, est.prior_.transform(X["token"]))),
                               rtol=0, atol=1e-12)
    copy = pickle.loads(pickle.dumps(est))  # the library stays behind; the copy predicts through LightGBM
    assert getattr(copy, "trees_", None) is None and not hasattr(copy, "inference_")
    np.testing.assert_allclose(copy.predict(X), fallback, rtol=0, atol=1e-12)
    est.fit(X.assign(label=1.0 - X["label"]))  # a refit drops the compiled trees of the old model
    assert est.trees_ is None


def test_isotonic_lookup_equals_sklearn_predict():
    rng = np.random.default_rng(6)
    q = rng.random(3000)
    iso = binned_isotonic(q, (rng.random(3000) < q ** 2).astype(float), 50)
    t = rng.random(10_000) * 1.4 - 0.2  # outside the fitted range too
    np.testing.assert_allclose(isotonic_lookup(iso, t), iso.predict(t), rtol=0, atol=1e-12)
    est = IsotonicFirstFactor(n_bins=20).fit(_features())
    assert est.compile().inference_.startswith("array lookup")
    np.testing.assert_allclose(est.predict(_features(seed=7)), np.clip(est.iso_.predict(_features(seed=7)["q"]), 0, 1),
                               rtol=0, atol=1e-12)
