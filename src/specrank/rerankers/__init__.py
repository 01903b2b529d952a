"""Cross-fitted first-factor rerankers (App. D.8) with the scikit-learn estimator API (torch-free), the stacked
score as one reranker, and their compiled per-round inference."""

from specrank.rerankers.compiled import CompiledReranker, compiled
from specrank.rerankers.crossfit import CrossFit, cross_fit_table
from specrank.rerankers.gbm import GBMReranker
from specrank.rerankers.isotonic import IsotonicFirstFactor, PerDepthCalibration
from specrank.rerankers.loader import load_reranker
from specrank.rerankers.base import Reranker, RerankerError, RerankerParamError
from specrank.rerankers.persist import RerankerFileError, save_reranker
from specrank.rerankers.stacked import StackedReranker
from specrank.rerankers.tune import tune

__all__ = [
    "CompiledReranker",
    "CrossFit",
    "GBMReranker",
    "IsotonicFirstFactor",
    "PerDepthCalibration",
    "Reranker",
    "RerankerError",
    "RerankerParamError",
    "RerankerFileError",
    "StackedReranker",
    "compiled",
    "cross_fit_table",
    "load_reranker",
    "save_reranker",
    "tune",
]
