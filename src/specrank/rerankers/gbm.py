"""Gradient-boosted first-factor reranker (App. D.8): LightGBM, or sklearn's histogram boosting."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real

import lightgbm as lgb
import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
from sklearn.utils._param_validation import Interval, StrOptions
from threadpoolctl import threadpool_limits

from specrank import schema
from specrank.featurize.columns import COLUMN
from specrank.featurize.features import FeatureArrays
from specrank.featurize.prior import TokenPrior
from specrank.featurize.sets import CATEGORICAL_FEATURES, PRIOR_FEATURE, input_columns, resolve_features
from specrank.law import SAMPLING, Law
from specrank.rerankers.state import GBM
from specrank.rerankers.base import Reranker
from specrank.rerankers.ranking import fit_ranking, round_groups

BACKENDS = ("lightgbm", "sklearn")
OBJECTIVES = ("pointwise", "lambdarank")
MONOTONE_FEATURES = ("q", "log_q")  # the draft probability of the candidate
SMALL_BATCH = 1024  # rows LightGBM scores on one thread
MARGIN_CLIP = 1e-6  # q is clipped to [c, 1 - c] before its logit becomes the starting margin
NO_PRIOR = np.zeros(0)
NO_TOKENS = np.zeros(0, np.int64)


def draft_margin(X) -> np.ndarray:
    """logit(q) (n,): the drafter's own probability as a starting log-odds."""
    q = np.clip(np.asarray(X["q"], dtype=np.float64), MARGIN_CLIP, 1 - MARGIN_CLIP)
    return np.log(q) - np.log1p(-q)


def category_codes(values, categories) -> np.ndarray:
    """Index of each value (a Series or an array) in the sorted ``categories`` as float, NaN (missing) when
    unseen in training."""
    cats = np.asarray(categories, dtype=str)
    values = np.asarray(values).astype(str)
    if not len(cats):
        return np.full(len(values), np.nan)
    pos = np.minimum(np.searchsorted(cats, values), len(cats) - 1)
    return np.where(cats[pos] == values, pos, np.nan).astype(np.float64)


@dataclass(frozen=True)
class RoundPlan:
    """Where one round's matrix columns come from: ``positions`` <- block ``columns``, the prior and the
    task (-1: not read)."""

    positions: np.ndarray
    columns: np.ndarray
    prior: int
    task: int


def round_plan(features) -> RoundPlan:
    in_block = [(i, COLUMN[f]) for i, f in enumerate(features) if f in COLUMN]
    where = lambda name: features.index(name) if name in features else -1  # noqa: E731
    missing = [f for f in features if f not in COLUMN and f not in (PRIOR_FEATURE, "task")]
    if missing:
        raise ValueError(f"feature {missing[0]!r} is not a column of one round's features")
    return RoundPlan(np.array([i for i, _ in in_block], np.int64), np.array([c for _, c in in_block], np.int64),
                     where(PRIOR_FEATURE), where("task"))


class GBMReranker(Reranker):
    """Predicts each first-level candidate's target probability (sampling) or argmax indicator (greedy).

    Defaults: 100 trees of at most 15 leaves, learning rate 0.1. On recorded runs of a few thousand
    rounds they recover more of root selection's gain than the paper's 400 trees of 63 leaves at 0.05
    (``n_estimators=400, num_leaves=63, learning_rate=0.05``), which overfit there, and their round
    costs a decoding loop less (``benchmarks/bench_gbm_size.py``, docs/benchmarks.md). LightGBM
    uses the cross-entropy objective for probability labels and the binary one for argmax labels;
    the ``sklearn`` backend uses a histogram-boosting regressor / classifier. ``reg_lambda`` is the L2
    penalty on leaf values (0, as in the paper). ``features`` is a
    set name (``base``, ``rows``) or a list; the token prior (pseudo-count ``prior_pseudo_count``)
    is learned from the training rows and stored in ``prior_``. ``monotone_draft`` constrains the
    prediction to be non-decreasing in ``q`` and ``log_q``. ``boost_from_draft`` (LightGBM only)
    starts boosting from the draft's log-odds logit(q) instead of a constant, so the trees learn a
    correction to the drafter's probability: with little data the prediction stays near ``q``
    instead of fitting noise.

    ``objective="lambdarank"`` (LightGBM only) learns the order of a round's candidates rather than their
    probabilities: LambdaRank grouped by round, with relevance levels from the labels (a probability, an argmax
    indicator, or any value in [0, 1] given as ``y``, such as a chain's expected accepted tokens over its length)
    and a gain linear in the level. The ranking scores are then calibrated onto the label's scale by a logistic
    of an increasing affine map folded into the leaves (``rerankers.ranking``): the predictions order a round's
    candidates as the ranking does, and read as probabilities as the pointwise objective's do.
    """

    codec = GBM  # format 2
    _parameter_constraints = {
        "features": [str, list, tuple],  # a set name or feature names: resolve_features checks them
        "backend": [StrOptions(set(BACKENDS))],
        "n_estimators": [Interval(Integral, 1, None, closed="left")],
        "learning_rate": [Interval(Real, 0.0, None, closed="neither")],
        "num_leaves": [Interval(Integral, 2, None, closed="left")],
        "min_child_samples": [Interval(Integral, 1, None, closed="left")],
        "reg_lambda": [Interval(Real, 0.0, None, closed="left")],
        "monotone_draft": ["boolean"],
        "boost_from_draft": ["boolean"],
        "prior_pseudo_count": [Interval(Real, 0.0, None, closed="left")],
        "n_jobs": [Interval(Integral, 1, None, closed="left"), None],
        "random_state": [Interval(Integral, 0, None, closed="left")],
        "objective": [StrOptions(set(OBJECTIVES))],
    }

    def __init__(self, features="rows", backend="lightgbm", n_estimators=100, learning_rate=0.1,
                 num_leaves=15, min_child_samples=20, reg_lambda=0.0, monotone_draft=False, boost_from_draft=False,
                 prior_pseudo_count=20.0, n_jobs=None, random_state=0, objective="pointwise"):
        self.features = features
        self.backend = backend
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.reg_lambda = reg_lambda
        self.monotone_draft = monotone_draft
        self.boost_from_draft = boost_from_draft
        self.prior_pseudo_count = prior_pseudo_count
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.objective = objective

    def _matrix(self, X, prior) -> np.ndarray:
        """(n, F) float matrix in ``features_`` order; categories coded by ``task_categories_``."""
        if isinstance(X, FeatureArrays):
            return self.round_matrix(X, prior)
        cols = []
        for f in self.features_:
            if f == PRIOR_FEATURE:
                cols.append(prior)
            elif f in CATEGORICAL_FEATURES:
                cols.append(category_codes(X[f], self.task_categories_))
            else:
                cols.append(np.asarray(X[f], dtype=np.float64))
        return np.column_stack(cols) if cols else np.empty((len(X), 0))

    def task_code(self, task) -> float:
        """The code of one round's task (NaN: a task unseen in training)."""
        return float(category_codes([task], self.task_categories_)[0])

    def round_matrix(self, X, prior, plan: RoundPlan | None = None, code: float | None = None) -> np.ndarray:
        """``_matrix`` of one round's ``FeatureArrays``: its numeric columns gathered from the kernel's block at
        once (``plan`` and the task's ``code``: given by a compiled reranker, which holds them across rounds)."""
        plan = round_plan(self.features_) if plan is None else plan
        m = np.empty((len(X), len(self.features_)))
        m[:, plan.positions] = X.block[:, plan.columns]
        if plan.prior >= 0:
            m[:, plan.prior] = prior
        if plan.task >= 0:
            m[:, plan.task] = self.task_code(X.task) if code is None else code
        return m

    def check_params(self) -> None:
        """The ranges of ``_parameter_constraints``, a known feature set, and ``boost_from_draft`` only with
        LightGBM."""
        super().check_params()
        resolve_features(self.features)
        if self.boost_from_draft and self.backend != "lightgbm":
            raise ValueError("boost_from_draft needs the lightgbm backend (sklearn's boosting takes no initial margin)")
        if self.objective == "lambdarank" and (self.backend != "lightgbm" or self.boost_from_draft):
            raise ValueError("objective 'lambdarank' needs the lightgbm backend and no boost_from_draft")

    def fit_label_kind(self) -> str:
        """A ranking objective takes any relevance in [0, 1] (the sampling law's labels), also in a greedy run."""
        if self.objective == "lambdarank":
            return Law.named(SAMPLING).label_kind
        return super().fit_label_kind()

    def _fit(self, X, y):
        self.features_ = resolve_features(self.features)
        schema.require_columns(X.columns, input_columns(self.features_), "features")
        used = [c for c in CATEGORICAL_FEATURES if c in self.features_]
        self.task_categories_ = sorted({t for c in used for t in X[c].astype(str).unique()})
        self.prior_ = TokenPrior(self.prior_pseudo_count)
        prior = self.prior_.fit_transform(X["token"].to_numpy(), y) if PRIOR_FEATURE in self.features_ else None
        margin = draft_margin(X) if self.boost_from_draft else None
        m = self._matrix(X, prior)
        if self.objective == "lambdarank":
            self.model_ = self._fit_ranking(m, y, round_groups(X))
        else:
            self.model_ = self._fit_backend(m, y, margin)

    def _fit_ranking(self, m, y, groups: np.ndarray):
        """LambdaRank over the rounds ``groups`` (n,), calibrated onto the label's scale (``rerankers.ranking``)."""
        params = {"learning_rate": self.learning_rate, "num_leaves": self.num_leaves,
                  "min_data_in_leaf": self.min_child_samples, "lambda_l2": self.reg_lambda,
                  "num_threads": self.n_jobs or 0, "seed": self.random_state, "deterministic": True, "verbose": -1}
        categorical = [i for i, f in enumerate(self.features_) if f in CATEGORICAL_FEATURES]
        return fit_ranking(m, y, groups, params, self.n_estimators, categorical)

    def margin(self, m) -> np.ndarray:
        """(n,) raw LightGBM margins of the feature matrix ``m`` (n, F)."""
        threads = 1 if len(m) <= SMALL_BATCH else (self.n_jobs or 0)  # a thread pool costs more than ~10 rows
        return self.model_.predict(m, raw_score=True, num_threads=threads)

    def round_args(self, plan: RoundPlan) -> tuple:
        """The round kernel's plan (``quickscorer.QuickScorer.round_model``): (positions, columns, prior position,
        prior tokens, means, default, task position)."""
        prior = self.prior_ if plan.prior >= 0 else None
        tokens = NO_TOKENS if prior is None else np.ascontiguousarray(prior.tokens_, dtype=np.int64)
        means = NO_PRIOR if prior is None else np.ascontiguousarray(prior.means_, dtype=np.float64)
        default = 0.0 if prior is None else float(prior.mean_)
        return plan.positions, plan.columns, plan.prior, tokens, means, default, plan.task

    def _predict(self, X):
        return self.probabilities(X, self._matrix(X, self.prior_of(X)))

    def prior_of(self, X):
        """The token prior of each row of ``X`` (None when the features do not read it)."""
        if PRIOR_FEATURE not in self.features_:
            return None
        return self.prior_.lookup(X.token) if isinstance(X, FeatureArrays) else self.prior_.transform(np.asarray(X["token"]))

    def probabilities(self, X, m, margin=None) -> np.ndarray:
        """Predictions of the rows ``X`` from their matrix ``m``; ``margin``: a function of ``m`` -> raw margins
        (default LightGBM's predict)."""
        if self.backend == "lightgbm":  # both objectives map the margin through the logistic function
            raw = (self.margin if margin is None else margin)(m) + (draft_margin(X) if self.boost_from_draft else 0.0)
            return 1.0 / (1.0 + np.exp(-raw))
        with threadpool_limits(self.n_jobs, user_api="openmp"):
            if Law.of_label_kind(self.label_kind_).binary_labels:
                return self.model_.predict_proba(m)[:, list(self.model_.classes_).index(1.0)]
            return self.model_.predict(m)

    def _fit_backend(self, m, y, margin=None):
        categorical = [i for i, f in enumerate(self.features_) if f in CATEGORICAL_FEATURES]
        monotone = [int(self.monotone_draft and f in MONOTONE_FEATURES) for f in self.features_]
        if self.backend == "lightgbm":
            params = {
                "objective": "binary" if Law.of_label_kind(self.label_kind_).binary_labels else "cross_entropy",
                "learning_rate": self.learning_rate,
                "num_leaves": self.num_leaves,
                "min_data_in_leaf": self.min_child_samples,
                "lambda_l2": self.reg_lambda,
                "num_threads": self.n_jobs or 0,
                "seed": self.random_state,
                "deterministic": True,
                "verbose": -1,
            }
            if any(monotone):
                params["monotone_constraints"] = monotone
            data = lgb.Dataset(m, y, init_score=margin, categorical_feature=categorical, free_raw_data=True)
            return lgb.train(params, data, num_boost_round=self.n_estimators)

        empty = [f for i, f in enumerate(self.features_) if np.isnan(m[:, i]).all()]
        if empty:  # sklearn's binning has nothing to cut and fails without naming the column
            raise ValueError(f"features: column {input_columns([empty[0]])[0]!r} is all NaN in the training rows; "
                             "the sklearn backend cannot use it (drop it from the features, or use lightgbm)")
        binary = Law.of_label_kind(self.label_kind_).binary_labels
        cls = HistGradientBoostingClassifier if binary else HistGradientBoostingRegressor
        mask = np.isin(np.arange(m.shape[1]), categorical)
        model = cls(max_iter=self.n_estimators, learning_rate=self.learning_rate, max_leaf_nodes=self.num_leaves,
                    min_samples_leaf=self.min_child_samples, l2_regularization=self.reg_lambda, categorical_features=mask if mask.any() else None,
                    monotonic_cst=monotone if any(monotone) else None, early_stopping=False,
                    random_state=self.random_state)
        if binary and len(np.unique(y)) < 2:
            raise ValueError("labels: argmax labels of the training half are all equal")
        with threadpool_limits(self.n_jobs, user_api="openmp"):  # None = library default
            return model.fit(m, y)
