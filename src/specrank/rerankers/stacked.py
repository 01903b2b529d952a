"""The stacked score as one reranker: a first-factor reranker, and every deeper draft factor calibrated per depth
(the study's "Rows + per-depth"; target-row reuse, arXiv 2610.29210, App. D.8)."""

from __future__ import annotations

import numpy as np
from sklearn.base import clone
from sklearn.utils._param_validation import HasMethods
from sklearn.utils.validation import check_is_fitted

import specrank
from specrank.featurize.storage import check_same_rounds, rounds_of
from specrank.rerankers.gbm import GBMReranker
from specrank.rerankers.isotonic import PerDepthCalibration
from specrank.rerankers.base import Reranker, RerankerError


class StackedReranker(Reranker):
    """A path scores r(x1) * prod_{d>=2} g_d(q_d): ``first_factor`` (default ``GBMReranker("rows")``) predicts
    r(x1) from the first-level features, ``per_depth`` (default ``PerDepthCalibration()``) maps each deeper draft
    factor q_d through the isotonic map g_d of its depth.

    ``fit(features, edges)`` fits clones of both, the first factor on a features table and the per-depth maps on
    the edges table of the same rounds; the fitted parts are ``first_factor_`` and ``per_depth_``.
    ``from_fitted(first_factor, per_depth)`` stacks two parts fitted already. The online interface is the first
    factor's (``features_``, ``predict_first_factor``), plus ``predict_deeper_factors``, which the reranked
    strategy reads to score every depth.
    """

    _parameter_constraints = {
        "first_factor": [HasMethods(["fit", "predict_first_factor"]), None],
        "per_depth": [HasMethods(["fit", "predict_factors"]), None],
    }

    def __init__(self, first_factor=None, per_depth=None):
        self.first_factor = first_factor
        self.per_depth = per_depth

    def fit(self, features, edges):
        """Fit the first factor on ``features`` (``specrank.featurize``) and the per-depth maps on ``edges``
        (``featurize.edges``) of the same rounds (a table that records its rounds digest must record the same)."""
        self.check_params()
        check_same_rounds("edges", rounds_of(edges), rounds_of(features), "the features are from rounds")
        first = clone(GBMReranker("rows") if self.first_factor is None else self.first_factor).fit(features)
        per_depth = clone(PerDepthCalibration() if self.per_depth is None else self.per_depth).fit(edges)
        return self._stack(first, per_depth)

    @classmethod
    def from_fitted(cls, first_factor, per_depth) -> "StackedReranker":
        """The stacked reranker of two parts fitted on the same rounds (kept, not refitted); its parameters are
        their unfitted clones."""
        return cls(first_factor=clone(first_factor), per_depth=clone(per_depth))._stack(first_factor, per_depth)

    def _stack(self, first, per_depth) -> "StackedReranker":
        check_is_fitted(first, "features_")
        check_is_fitted(per_depth, "maps_")
        if first.label_kind_ != per_depth.label_kind_:
            raise RerankerError(f"per_depth: fitted on {per_depth.label_kind_} labels, the first factor on "
                                f"{first.label_kind_}")
        if first.topk_ != per_depth.topk_:
            raise RerankerError(f"per_depth: fitted on pools with topk={per_depth.topk_}, the first factor on "
                                f"topk={first.topk_}")
        check_same_rounds("per_depth", per_depth.rounds_digest_, first.rounds_digest_,
                          "the first factor is from rounds")
        self.first_factor_, self.per_depth_ = first, per_depth
        self.features_ = list(first.features_)
        self.label_kind_, self.topk_ = first.label_kind_, first.topk_
        self.version_ = specrank.__version__
        self.rounds_digest_ = first.rounds_digest_ or per_depth.rounds_digest_
        return self

    def _predict(self, X):
        return self.first_factor_._predict(X)

    def predict_first_factor(self, features) -> np.ndarray:
        """The first factor r(x1) of first-level features (``first_factor_.predict_first_factor``)."""
        return self.first_factor_.predict_first_factor(features)

    def predict_deeper_factors(self, depth, q) -> np.ndarray:
        """(n,) g_d(q) of edges at ``depth`` d with draft probability ``q`` (meant for d >= 2: the first level's
        factor is the first factor's)."""
        return self.per_depth_.predict_factors(depth, q)
