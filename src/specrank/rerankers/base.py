"""The online predictor interface shared by every reranker, and its input checks."""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.validation import check_is_fitted

import specrank
from specrank import schema
from specrank.featurize.features import META_KEY, FeatureArrays, features_meta
from specrank.featurize.sets import input_columns
from specrank.law import Law
from specrank.rerankers.persist import save_reranker


class RerankerError(ValueError):
    """Features that do not match what a reranker was trained on."""


class RerankerParamError(ValueError):
    """A hyper-parameter outside its constraints (scikit-learn's validation, said as the package's own error)."""


def labels_of(X, y, kind: str) -> np.ndarray:
    """Labels (``y`` or ``X["label"]``) as float64, checked against the label kind."""
    if y is None:
        schema.require_columns(X.columns, [schema.LABEL_COLUMN], "features")
        y = X[schema.LABEL_COLUMN]
    y = np.asarray(y, dtype=np.float64)
    if len(y) != len(X):
        raise RerankerError(f"labels: {len(y)} values for {len(X)} feature rows")
    if np.isnan(y).any():
        raise RerankerError("labels: contain NaN (unscored first-level candidates?)")
    binary = Law.of_label_kind(kind).binary_labels
    if binary and not np.isin(y, (0.0, 1.0)).all():
        raise RerankerError("labels: argmax labels must be 0 or 1")
    if not binary and ((y < 0) | (y > 1)).any():
        raise RerankerError("labels: probability labels must lie in [0, 1]")
    return y


def unit_interval(p: np.ndarray) -> np.ndarray:
    """``p`` clipped to [0, 1], NaN kept: ``np.clip`` without its Python layers, which cost a few microseconds a
    call, and more inside a decoding loop, where every call starts from cold caches."""
    return np.minimum(np.maximum(0.0, p), 1.0)


class Reranker(BaseEstimator):
    """Base of the first-factor rerankers: metadata learned at ``fit`` and checked at ``predict``.

    Subclasses set ``features_`` and implement ``_fit(X, y)`` and ``_predict(X) -> (n,)``; their
    ``_parameter_constraints`` (scikit-learn's ``sklearn.utils._param_validation``) are checked first thing in
    ``fit``. Per-round inference inside a decoding loop is a separate object, ``rerankers.compiled(est)``:
    the estimator stays a plain scikit-learn estimator, its state only what ``fit`` learned.
    """

    _parameter_constraints: dict = {}

    def check_params(self) -> None:
        """Raise ``RerankerParamError`` naming the first hyper-parameter outside ``_parameter_constraints``
        (scikit-learn's validation); subclasses add their constraints across parameters. ``fit`` calls this first."""
        try:
            self._validate_params()
        except InvalidParameterError as exc:  # raised in scikit-learn's frames: ours to report as an input error
            raise RerankerParamError(str(exc)) from None

    def fit(self, X, y=None):
        """Fit on a features table (``specrank.featurize``); labels from ``y`` or ``X["label"]``."""
        self.check_params()
        meta = features_meta(X)
        self.label_kind_, self.topk_ = meta["label_kind"], int(meta["topk"])
        self.version_ = specrank.__version__
        self.rounds_digest_ = meta.get("rounds_digest")  # the recorded run it learned from (None: not known)
        self._fit(X, labels_of(X, y, self.fit_label_kind()))
        return self

    def fit_label_kind(self) -> str:
        """The label kind ``fit`` checks its labels against: the run's own (``label_kind_``)."""
        return self.label_kind_

    def predict(self, X) -> np.ndarray:
        """First-factor predictions in [0, 1], one per row of ``X``."""
        self.check_features(X)
        return unit_interval(np.asarray(self._predict(X), dtype=np.float64))

    def predict_first_factor(self, features) -> np.ndarray:
        """Online interface: features of one or more rounds' first-level candidates -> predictions. A round's
        ``FeatureArrays`` (``featurize.round_features``, built with this reranker's columns for a strategy that
        checked it before decoding) has only its label kind and topk checked."""
        if not isinstance(features, FeatureArrays):
            return self.predict(features)
        self.check_round(features)
        return unit_interval(np.asarray(self._predict(features), dtype=np.float64))

    def check_round(self, features: FeatureArrays) -> None:
        """``check_meta`` for one round's features, without the table checks (``compiled`` runs it once for a
        decode's rounds, which share one metadata record)."""
        meta = features.attrs.get(META_KEY) or {}
        if meta.get("label_kind") != getattr(self, "label_kind_", None) or meta.get("topk") != self.topk_:
            self.check_meta(features)

    def check_features(self, X) -> None:
        """Raise RerankerError unless ``X`` has this reranker's label kind, pool topk and columns."""
        self.check_meta(X)
        schema.require_columns(X.columns, input_columns(self.features_), "features")

    def check_meta(self, X) -> None:
        """Raise RerankerError unless ``X`` is fitted-compatible: same label kind and pool topk."""
        check_is_fitted(self, "features_")
        meta = features_meta(X)
        if meta["label_kind"] != self.label_kind_:
            raise RerankerError(
                f"reranker trained on {self.label_kind_} labels"
                f" ({Law.of_label_kind(self.label_kind_).name} run) got {meta['label_kind']} features"
            )
        if int(meta["topk"]) != self.topk_:
            raise RerankerError(f"reranker trained on pools with topk={self.topk_} got topk={meta['topk']}")

    def save(self, path):
        """Save in format 2: a directory at ``path``, or a zip if it ends in ``.zip`` (``specrank.rerankers.persist``)."""
        return save_reranker(self, path)
