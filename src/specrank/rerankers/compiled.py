"""A fitted reranker's per-round inference inside a decoding loop: built once from the estimator by the strategy
that decodes with it, and owned by that strategy. The estimator stays a plain scikit-learn estimator (nothing is
added to it, so it pickles, clones and saves as fitted); what inference keeps across rounds (QuickScorer arrays
and their numba kernel, the round plan, task codes, the round metadata already checked) lives here."""

from __future__ import annotations

import os

import numpy as np

from specrank.featurize.features import FeatureArrays
from specrank.rerankers.gbm import GBMReranker, round_plan
from specrank.rerankers.isotonic import IsotonicFirstFactor, PerDepthCalibration, isotonic_lookup
from specrank.rerankers.base import unit_interval
from specrank.rerankers.quickscorer import quickscorer_of
from specrank.rerankers.stacked import StackedReranker

TREE_PATHS = ("quickscorer", "lightgbm")
ARRAY_LOOKUP = "array lookup (np.interp on the fitted isotonic thresholds)"


def compiled(reranker, trees: str | None = None) -> "CompiledReranker":
    """The per-round inference of a fitted ``reranker``; ``inference`` names its path.

    ``trees`` (default ``$SPECRANK_TREES``, else ``quickscorer``), for GBM rerankers: ``quickscorer`` scores the
    trees as QuickScorer arrays through a numba kernel (``rerankers.quickscorer``: equal to LightGBM's margins
    exactly, and the fastest path measured inside a decoding loop, ``docs/benchmarks.md``); ``lightgbm`` keeps
    LightGBM's predict (one thread on a round's rows), also where numba is missing or the model has what the
    arrays cannot hold (more than 64 leaves a tree, categories >= 64).
    """
    choice = trees or os.environ.get("SPECRANK_TREES") or "quickscorer"
    if choice not in TREE_PATHS:
        raise ValueError(f"trees: {choice!r} is not one of {', '.join(TREE_PATHS)}")
    if isinstance(reranker, StackedReranker):
        return CompiledStacked(reranker, choice)
    if isinstance(reranker, GBMReranker):
        return CompiledTrees(reranker, choice)
    if isinstance(reranker, IsotonicFirstFactor):
        return CompiledIsotonic(reranker, reranker.iso_)
    if isinstance(reranker, PerDepthCalibration):
        return CompiledIsotonic(reranker, reranker.first_map())
    return CompiledReranker(reranker)


class CompiledReranker:
    """Per-round inference of a fitted reranker (here: its own ``predict_first_factor``).

    ``predict_first_factor(features)`` predicts one round's first factors; a round's ``FeatureArrays`` has its
    label kind and topk checked once per decode, whose rounds share one metadata record. ``predict_round``
    ((inputs, task) -> (topk,)) predicts straight from the features kernel's inputs (``featurize.RoundInputs``),
    with no features object and no checks a round, or is None where inference has no such path.
    ``predict_deeper_factors`` ((depth, q) -> (n,)) is None unless the reranker calibrates the deeper factors.
    """

    predict_round = None
    predict_deeper_factors = None

    def __init__(self, reranker):
        self.reranker = reranker
        self.inference = f"{type(reranker).__name__}.predict_first_factor"
        self.checked = None  # the round metadata record that passed check_round

    def predict_first_factor(self, features) -> np.ndarray:
        if not isinstance(features, FeatureArrays):
            return self.reranker.predict_first_factor(features)
        if features.attrs is not self.checked:  # inline: from cold caches a call costs µs
            self.reranker.check_round(features)
            self.checked = features.attrs
        return self.predict_checked(features)

    def predict_checked(self, features: FeatureArrays) -> np.ndarray:
        """One round's first factors from its checked features."""
        return np.asarray(self.reranker.predict_first_factor(features), dtype=np.float64)


class CompiledIsotonic(CompiledReranker):
    """An isotonic first factor as one np.interp on the fitted thresholds of ``iso``."""

    def __init__(self, reranker, iso):
        super().__init__(reranker)
        self.iso, self.inference = iso, ARRAY_LOOKUP

    def predict_checked(self, features: FeatureArrays) -> np.ndarray:
        return unit_interval(isotonic_lookup(self.iso, features["q"]))


class CompiledTrees(CompiledReranker):
    """A GBM reranker's round: features and trees in one QuickScorer kernel call where it can (LightGBM, no
    draft margin), else the round's matrix (its plan built once) scored by the QuickScorer arrays or the
    backend's predict."""

    def __init__(self, reranker: GBMReranker, trees: str):
        super().__init__(reranker)
        self.plan, self.codes = round_plan(reranker.features_), {}
        self.trees, self.model, self.inference = None, None, "LightGBM predict"
        if reranker.backend != "lightgbm":
            self.inference = "sklearn predict (QuickScorer arrays are for LightGBM boosters)"
        elif trees == "quickscorer":
            self.trees, self.inference = quickscorer_of(reranker.model_)
        if self.trees is not None and not reranker.boost_from_draft:
            self.model = self.trees.round_model(reranker.round_args(self.plan))  # features and trees: one kernel call
            self.kernel = self.trees.round_kernel
            self.predict_round = self._predict_round

    def task_code(self, task) -> float:
        """The code of one round's task, looked up once per task."""
        code = self.codes.get(task)
        if code is None:
            code = self.codes[task] = self.reranker.task_code(task) if self.plan.task >= 0 else 0.0
        return code

    def _predict_round(self, inputs, task: str) -> np.ndarray:
        """(topk,) predictions of one round from the features kernel's inputs and its task."""
        code = self.codes.get(task)  # inline: from cold caches a call costs µs
        if code is None:
            code = self.task_code(task)
        out = np.empty(inputs.topk)
        self.kernel(*inputs, code, self.model, out)  # QuickScorer.round_probabilities, inline
        return out

    def predict_checked(self, features: FeatureArrays) -> np.ndarray:
        if self.model is not None:
            return self._predict_round(features.inputs, features.task)
        est = self.reranker
        m = est.round_matrix(features, est.prior_of(features), self.plan, self.task_code(features.task))
        margin = None if self.trees is None else self.trees.raw
        return unit_interval(np.asarray(est.probabilities(features, m, margin), dtype=np.float64))


class CompiledStacked(CompiledReranker):
    """A stacked reranker: its first factor's compiled round, and the per-depth maps of the deeper factors."""

    def __init__(self, reranker: StackedReranker, trees: str):
        super().__init__(reranker)
        self.first = compiled(reranker.first_factor_, trees)
        self.inference = f"{self.first.inference}; deeper factors: {ARRAY_LOOKUP}"
        self.predict_round = self.first.predict_round
        self.predict_deeper_factors = reranker.per_depth_.predict_factors

    def predict_first_factor(self, features) -> np.ndarray:
        return self.first.predict_first_factor(features)
