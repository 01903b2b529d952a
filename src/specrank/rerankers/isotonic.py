"""Isotonic controls (App. D.8): the target probability as a monotone map of the draft probability."""

from __future__ import annotations

from numbers import Integral

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.utils._param_validation import Interval

from specrank import schema
from specrank.featurize.features import FeatureArrays
from specrank.rerankers.state import ISOTONIC, PER_DEPTH
from specrank.rerankers.base import Reranker, unit_interval


def binned_isotonic(q, y, n_bins: int) -> IsotonicRegression:
    """Increasing isotonic fit of ``y`` on ``q`` over ``n_bins`` equal-count bins of ``q``."""
    q = np.asarray(q, dtype=np.float64)
    order = np.argsort(q, kind="stable")
    bins = min(n_bins, len(q))
    which = np.empty(len(q), dtype=np.int64)
    which[order] = np.arange(len(q)) * bins // len(q)  # equal-count bins by rank
    count = np.bincount(which, minlength=bins)
    q_mean = np.bincount(which, weights=q, minlength=bins) / count
    y_mean = np.bincount(which, weights=y, minlength=bins) / count
    iso = IsotonicRegression(increasing=True, y_min=0.0, y_max=1.0, out_of_bounds="clip")
    return iso.fit(q_mean, y_mean, sample_weight=count)


def isotonic_lookup(iso: IsotonicRegression, q) -> np.ndarray:
    """``iso.predict(q)`` as one np.interp on its fitted thresholds (no input validation, no scipy
    interpolator per call). The thresholds run from ``X_min_`` to ``X_max_``, and np.interp holds the end values
    beyond them, as ``out_of_bounds="clip"`` does; NaN stays NaN (a single threshold: its value everywhere)."""
    return np.interp(q, iso.X_thresholds_, iso.y_thresholds_)


class IsotonicFirstFactor(Reranker):
    """Replaces q1 by an isotonic estimate of the target probability (200 equal-count bins)."""

    _parameter_constraints = {"n_bins": [Interval(Integral, 1, None, closed="left")]}
    codec = ISOTONIC  # format 2

    def __init__(self, n_bins: int = 200):
        self.n_bins = n_bins

    def _fit(self, X, y):
        schema.require_columns(X.columns, ["q"], "features")
        self.features_ = ["q"]
        self.iso_ = binned_isotonic(X["q"].to_numpy(), y, self.n_bins)

    def _predict(self, X):
        return isotonic_lookup(self.iso_, X["q"])


class PerDepthCalibration(Reranker):
    """Calibrates every draft factor with its own isotonic map per depth (200 equal-count bins each).

    Fitted on an edges table (``specrank.featurize.edges``: columns ``depth``, ``q_edge``, label);
    ``predict`` maps edges, ``predict_first_factor`` maps first-level features (``q``) with the
    depth-1 map. Depths unseen in training use the deepest fitted map.
    """

    _parameter_constraints = {"n_bins": [Interval(Integral, 1, None, closed="left")]}
    codec = PER_DEPTH  # format 2

    def __init__(self, n_bins: int = 200):
        self.n_bins = n_bins

    def _fit(self, X, y):
        schema.require_columns(X.columns, ["depth", "q_edge"], "edges")
        self.features_ = ["depth", "q_edge"]
        depth = X["depth"].to_numpy()
        self.maps_ = {int(d): binned_isotonic(X["q_edge"].to_numpy()[depth == d], y[depth == d], self.n_bins)
                      for d in np.unique(depth)}

    def _map(self, depth, q):
        depth = np.clip(np.asarray(depth), min(self.maps_), max(self.maps_))
        q = np.asarray(q, dtype=np.float64)
        out = np.full(len(q), np.nan)
        for d, iso in self.maps_.items():  # a handful of depths
            sel = depth == d
            if sel.any():
                out[sel] = isotonic_lookup(iso, q[sel])
        return out

    def _predict(self, X):
        return self._map(X["depth"].to_numpy(), X["q_edge"].to_numpy())

    def predict_factors(self, depth, q) -> np.ndarray:
        """(n,) calibrated draft factors of edges at ``depth`` with draft probability ``q`` (arrays, no table)."""
        return unit_interval(self._map(depth, q))

    first_factor_features_ = ("q",)  # what predict_first_factor reads, whatever the edges it was fitted on

    def first_map(self) -> IsotonicRegression:
        """The map of depth 1 (as ``_map`` clips depth 1 to the fitted depths)."""
        return self.maps_[min(max(1, min(self.maps_)), max(self.maps_))]

    def predict_first_factor(self, features) -> np.ndarray:
        """First-level features (column ``q``) -> the depth-1 map's calibrated probability."""
        if isinstance(features, FeatureArrays):
            self.check_round(features)
        else:
            self.check_meta(features)
            schema.require_columns(features.columns, ["q"], "features")
        return unit_interval(isotonic_lookup(self.first_map(), features["q"]))
