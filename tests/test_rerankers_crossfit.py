"""Cross-fitting without leakage, tuning inside the training part, and planted-signal recovery."""

import numpy as np
import pytest
from sklearn.base import BaseEstimator

from specrank.featurize import featurize_rounds
from specrank.featurize.arrays import round_arrays
from specrank.featurize.synthetic import synthetic_rounds
from specrank.folds import FoldError
from specrank.rerankers import GBMReranker, cross_fit_table, tune
from specrank.rerankers.tune import inner_folds
from specrank.selection import PoolBatch, fixed_values, score_of

SMALL = {"n_estimators": 100, "num_leaves": 15, "n_jobs": 1}


class SharedLog(list):
    """A log that sklearn's ``clone`` (deep copy of parameters) shares instead of copying."""

    def __deepcopy__(self, memo):
        return self


class PromptSpy(BaseEstimator):
    """Predicts 1 for rows whose prompt it was trained on, 0 otherwise; logs every fit's prompts."""

    def __init__(self, log=None):
        self.log = log

    def fit(self, X, y=None):
        self.seen_ = set(X["prompt_id"])
        if self.log is not None:
            self.log.append(self.seen_)
        return self

    def predict(self, X):
        return X["prompt_id"].isin(self.seen_).to_numpy(dtype=float)

    def set_params(self, **params):
        return self  # accepts tuned parameters and ignores them


@pytest.fixture(scope="module")
def feats():
    return featurize_rounds(*synthetic_rounds(8, 6, topk=4, depth=3, seed=2))


def test_no_prompt_is_scored_by_a_model_that_saw_it(feats):
    out = cross_fit_table(PromptSpy(), feats)
    assert np.all(out.predictions == 0.0)
    assert set(out.models) == {0, 1}
    for f, model in out.models.items():  # each fold's model saw exactly the other fold's prompts
        assert model.seen_ == set(feats.prompt_id[feats.fold != f])
    three = cross_fit_table(PromptSpy(), feats, folds=lambda idx: idx % 3)  # the fold rule is a parameter
    assert np.all(three.predictions == 0.0) and len(three.models) == 3


def test_leakage_would_be_visible(feats):
    """Each prompt has its own token and label level: a model that saw a prompt predicts it well."""
    leaky = feats.assign(token=feats.prompt_index * 1000, label=(feats.prompt_index % 4) / 4.0)
    leaky.attrs = feats.attrs
    est = GBMReranker(["token_prior"], **SMALL)
    in_sample = est.fit(leaky).predict(leaky)
    assert np.corrcoef(in_sample, leaky.label)[0, 1] > 0.95  # seen prompts: label recovered
    out = cross_fit_table(est, leaky)
    for f in (0, 1):  # unseen prompts: one constant (the training half's mean), no information
        assert np.ptp(out.predictions[out.folds == f]) < 1e-9


def test_bad_fold_assignments_raise(feats):
    split = np.where(feats["round"] < 3, 0, 1)  # by round: every prompt in both folds
    with pytest.raises(FoldError, match="spans several folds"):
        cross_fit_table(PromptSpy(), feats, folds=split)
    with pytest.raises(FoldError, match="at least two folds"):
        cross_fit_table(PromptSpy(), feats, folds=np.zeros(len(feats), dtype=int))


def test_tune_searches_inside_the_training_part_only(feats):
    log = SharedLog()
    train = feats[feats.fold == 0]
    best = tune(PromptSpy(log), train, n_trials=2)
    assert set(best) == {"n_estimators", "learning_rate", "num_leaves", "min_child_samples", "reg_lambda"}
    inner = inner_folds(train)
    held = [set(train.prompt_id[inner == f]) for f in (0, 1)]
    assert log and all(seen <= set(train.prompt_id) for seen in log)  # never the other half
    assert all(seen.isdisjoint(held[0]) or seen.isdisjoint(held[1]) for seen in log)
    log.clear()
    out = cross_fit_table(PromptSpy(log), feats, tune_trials=1)
    assert set(out.params) == {0, 1} and np.all(out.predictions == 0.0)


def test_gbm_tune_returns_usable_parameters(feats):
    best = tune(GBMReranker("base", n_jobs=1), feats[feats.fold == 0], n_trials=2)
    model = GBMReranker("base", n_jobs=1).set_params(**best).fit(feats)
    assert {k: model.get_params()[k] for k in best} == best
    pred = model.predict(feats)
    assert pred.shape == (len(feats),) and np.isfinite(pred).all() and np.ptp(pred) > 0  # fitted, not constant


def _values(table, predictions, topk):
    pool = PoolBatch(**round_arrays(table, ["token", "parent", "depth", "q_edge", "draft_logp", "p_edge", "p_argmax_child"]))
    v = lambda score: fixed_values(pool, score, [8, 59])[0]  # noqa: E731  (N, 2)
    out = {"draft": v(score_of(pool, "draft")), "root": v(score_of(pool, "root"))}
    out.update({k: v(score_of(pool, "reranked", first_factor=p.reshape(-1, topk))) for k, p in predictions.items()})
    return out


@pytest.mark.parametrize("signal", ["rows", "none"])
def test_rows_reranker_recovers_the_planted_share_of_the_root_gain(signal):
    """Exact cache rows in ~70% of rounds: Rows recovers those rounds' share of the root gain at B=8, 59."""
    table, manifest = synthetic_rounds(40, 40, topk=10, depth=4, signal=signal, row_noise=0.0, seed=1)
    feats = featurize_rounds(table, manifest)
    preds = {name: cross_fit_table(GBMReranker(name, **SMALL), feats).predictions for name in ("base", "rows")}
    y = feats.label.to_numpy()
    mse = {k: np.mean((p - y) ** 2) for k, p in {**preds, "draft": feats.q.to_numpy()}.items()}
    v = _values(table, preds, 10)
    gain = v["root"] - v["draft"]  # (N, 2)
    share = {k: (v[k] - v["draft"]).sum(0) / gain.sum(0) for k in ("base", "rows")}
    if signal == "rows":
        cached = ~np.isnan(feats.cache_logp.to_numpy().reshape(-1, 10)[:, 0])
        known = gain[cached].sum(0) / gain.sum(0)  # what a perfect reranker recovers
        assert np.all(np.abs(share["rows"] - known) < 0.05) and np.all(known > 0.5)
        assert mse["rows"] < 0.6 * min(mse["draft"], mse["base"])
        assert np.all((v["rows"] - v["base"]).mean(0) > 0) and np.all((v["rows"] - v["draft"]).mean(0) > 0)
    else:  # nothing to learn beyond the draft probability
        assert np.all(share["rows"] < 0.05) and np.all(share["base"] < 0.05)
        assert mse["rows"] > 0.97 * mse["draft"]
