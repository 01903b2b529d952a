"""A reranker's per-step work on the engine's device: the trees scored as tensors equal LightGBM's margins."""

import lightgbm as lgb
import numpy as np
import pytest
import torch

from specrank.engines.device.forest import forest_of
from specrank.featurize import featurize_rounds
from specrank.featurize.synthetic import synthetic_rounds
from specrank.rerankers import GBMReranker


@pytest.fixture(scope="module")
def fitted():
    features = featurize_rounds(*synthetic_rounds(12, 20, topk=6, depth=3, expand=4, seed=5))
    model = GBMReranker(features="rows", n_estimators=60, num_leaves=15, min_child_samples=5, n_jobs=1).fit(features)
    return model, features


def test_the_device_forest_scores_a_rerankers_rows_as_lightgbm_does(fitted):
    model, features = fitted
    m = model._matrix(features, model.prior_of(features))  # rows with missing row features and a category
    assert np.isnan(m).any()
    expected = model.model_.predict(m, raw_score=True)
    got = forest_of(model.model_).margins(torch.from_numpy(m)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    # a negative control: the trees read one feature off by one no longer agree
    shifted = forest_of(model.model_)
    shifted.feature = (shifted.feature + 1) % m.shape[1]
    assert np.abs(shifted.margins(torch.from_numpy(m)).numpy() - expected).max() > 1e-3


def test_missing_values_and_categories_take_lightgbms_ways():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 3))
    x[:, 2] = rng.integers(0, 5, 600)
    y = (x[:, 0] > 0.3) * 1.0 + (x[:, 2] == 3) * 2.0 + rng.normal(0, 0.1, 600)
    x[rng.random(600) < 0.2, 0] = np.nan
    for missing in (True, False):  # NaN as missing (a default way) or read as 0.0
        params = {"objective": "regression", "num_leaves": 7, "min_data_in_leaf": 5, "verbose": -1,
                  "use_missing": missing, "deterministic": True}
        booster = lgb.train(params, lgb.Dataset(x, y, categorical_feature=[2]), num_boost_round=20)
        test = np.vstack([x[:50], [[np.nan, 0.0, 3.0], [0.5, 1.0, np.nan], [0.5, 1.0, -2.0], [0.5, 1.0, 70.0]]])
        got = forest_of(booster).margins(torch.from_numpy(test)).numpy()
        np.testing.assert_allclose(got, booster.predict(test, raw_score=True), rtol=0, atol=1e-12)
