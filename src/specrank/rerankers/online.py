"""The online predictor interface shared by every reranker, and its input checks."""

from __future__ import annotations

import math
import numbers

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

import specrank
from specrank import schema
from specrank.featurize.features import META_KEY, FeatureArrays, features_meta
from specrank.featurize.sets import input_columns
from specrank.law import Law
from specrank.rerankers.persist import save_reranker


class RerankerError(ValueError):
    """Features that do not match what a reranker was trained on."""


def integer(low: int, optional: bool = False):
    """A hyper-parameter constraint: an integer >= ``low`` (or None when ``optional``)."""
    def ok(v):
        return (optional and v is None) or (isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= low)

    return (f"an integer >= {low}" + (" or None" if optional else ""), ok)


def real(low: float, open_low: bool = False):
    """A hyper-parameter constraint: a finite number >= ``low`` (> ``low`` when ``open_low``)."""
    def ok(v):
        return (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                and (v > low if open_low else v >= low))

    return (f"a finite number {'>' if open_low else '>='} {low:g}", ok)


def boolean():
    """A hyper-parameter constraint: true or false (not 0 or 1)."""
    return ("true or false", lambda v: isinstance(v, (bool, np.bool_)))


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
    if kind == "argmax" and not np.isin(y, (0.0, 1.0)).all():
        raise RerankerError("labels: argmax labels must be 0 or 1")
    if kind == "probability" and ((y < 0) | (y > 1)).any():
        raise RerankerError("labels: probability labels must lie in [0, 1]")
    return y


def unit_interval(p: np.ndarray) -> np.ndarray:
    """``p`` clipped to [0, 1], NaN kept: ``np.clip`` without its Python layers, which cost a few microseconds a
    call, and more inside a decoding loop, where every call starts from cold caches."""
    return np.minimum(np.maximum(0.0, p), 1.0)


class Reranker(BaseEstimator):
    """Base of the first-factor rerankers: metadata learned at ``fit`` and checked at ``predict``.

    Subclasses set ``features_`` and implement ``_fit(X, y)`` and ``_predict(X) -> (n,)``; their
    ``_constraints`` ({parameter: (description, predicate)}) are checked first thing in ``fit``.
    """

    _constraints: dict = {}

    def check_params(self) -> None:
        """Raise ValueError naming the first hyper-parameter outside its range (``fit`` calls this first)."""
        for name, (expected, ok) in self._constraints.items():
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"The {name!r} parameter of {type(self).__name__} must be {expected}; got {value!r}")

    def fit(self, X, y=None):
        """Fit on a features table (``specrank.featurize``); labels from ``y`` or ``X["label"]``."""
        self.check_params()
        meta = features_meta(X)
        self.label_kind_, self.topk_ = meta["label_kind"], int(meta["topk"])
        self.version_ = specrank.__version__
        self.rounds_digest_ = meta.get("rounds_digest")  # the recorded run it learned from (None: not known)
        self.__dict__.pop("_round_attrs", None)  # a round's metadata passed for the previous fit
        self._fit(X, labels_of(X, y, self.label_kind_))
        return self

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
        if features.attrs is not self.__dict__.get("_round_attrs"):  # inline: see check_round
            self.check_round(features)
        return self._predict_round(features)

    def round_predictor(self):
        """A callable ``(inputs, task) -> (topk,)`` predictions of one round from the features kernel's inputs
        (``featurize.RoundInputs``), skipping the features object and the per-round checks, for a strategy that
        checked this reranker against its run before decoding; None where inference has no such path (here)."""
        return None

    def _predict_round(self, X: FeatureArrays) -> np.ndarray:
        """One round's predictions; a reranker with a compiled round path overrides this."""
        return unit_interval(np.asarray(self._predict(X), dtype=np.float64))

    def check_round(self, features: FeatureArrays) -> None:
        """``check_meta`` for one round's features, without the table checks. A decode's rounds share one
        metadata record (``featurize.features.round_meta``), so once it has passed, an identity test is enough."""
        if features.attrs is self.__dict__.get("_round_attrs"):
            return
        meta = features.attrs.get(META_KEY) or {}
        if meta.get("label_kind") != getattr(self, "label_kind_", None) or meta.get("topk") != self.topk_:
            self.check_meta(features)
        self._round_attrs = features.attrs

    def compile(self):
        """Prepare inference for per-round use; ``inference_`` names the path. Here the fitted tables are
        already arrays (np.interp lookups); GBM rerankers compile their trees. Returns self."""
        self.inference_ = "array lookup (np.interp on the fitted isotonic thresholds)"
        return self

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
