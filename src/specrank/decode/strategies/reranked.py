"""Reranked selection: r(x1) prod_{i>=2} q_i, with r a reranker's prediction from features known before
verification (target-row reuse, arXiv 2610.29210, App. D.8)."""

from __future__ import annotations

import sys

import numpy as np

from specrank.decode.strategies.base import SelectionStrategy, StrategyError, round_batch, top_tree
from specrank.featurize.features import feature_groups
from specrank.featurize.rows import ROW_FEATURES
from specrank.featurize.sets import resolve_features
from specrank.selection import score_of

PREDICTOR = ("features_", "label_kind_", "topk_", "predict_first_factor")


class RerankedSelection(SelectionStrategy):
    """Top-B under the first draft factor replaced by ``reranker.predict_first_factor(features)``."""

    name = "reranked"
    reranks = True

    def __init__(self, reranker, source: str = ""):
        check_predictor(reranker, source)
        self.reranker, self.source, self.prepared = reranker, source, False
        self.round_predictor = None  # the reranker's compiled round path, once prepared

        self.needs_rows = any(f in ROW_FEATURES for f in online_features(reranker))

        self.groups = feature_groups(online_features(reranker))  # read only the rows the reranker reads

    def check(self, config, *, law: bool = True) -> None:
        check_reranker(self.reranker, config, self.source, law=law)
        self.prepare()

    def prepare(self) -> None:
        """Once, before the first round of a checked reranker: compile its inference, name the path (one line)."""
        if self.prepared or not callable(getattr(self.reranker, "compile", None)):
            return
        self.reranker.compile()
        self.round_predictor = self.reranker.round_predictor() if hasattr(self.reranker, "round_predictor") else None
        self.prepared = True
        print(f"reranker {self.source or type(self.reranker).__name__}: {self.reranker.inference_}", file=sys.stderr)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(prepared=False, round_predictor=None)  # a compiled kernel stays in its process
        return state

    def first_factor(self, pool, ctx) -> np.ndarray:
        """(topk,) predicted first factors of this round's first-level candidates: from the features kernel's
        inputs in one compiled call where the reranker has one (no features object, no checks a round: inside a
        decoding loop each Python call starts from cold caches), else from the round's features."""
        if self.round_predictor is not None and ctx.inputs is not None:
            return self.round_predictor(ctx.inputs(self.needs_rows), ctx.task)
        return np.asarray(self.reranker.predict_first_factor(ctx.features(self.groups)), dtype=np.float64)

    def select(self, pool, ctx):
        factor = (self.first_factor(pool, ctx) if ctx.first_factor is None else ctx.first_factor)[None]
        score = score_of(round_batch(pool, None, 1.0), "reranked", ctx.law, first_factor=factor)[0]
        return top_tree(score, pool.depth, ctx.budget), score


def check_predictor(reranker, source: str = "") -> None:
    """One-line StrategyError unless ``reranker`` is a fitted specrank reranker."""
    missing = [a for a in PREDICTOR if not hasattr(reranker, a)]
    if missing:
        where = f"reranker {source}".strip()
        raise StrategyError(f"{where}: not a fitted specrank reranker (no {missing[0]})")


def online_features(reranker) -> list[str]:
    """The features ``predict_first_factor`` reads (per-depth calibration fits on edges, predicts from ``q``)."""
    return list(getattr(reranker, "first_factor_features_", reranker.features_))


def check_reranker(reranker, config, source: str = "", *, law: bool = True) -> None:
    """One-line StrategyError unless the reranker fits this run's label kind (unless not ``law``), pool topk and
    features."""
    check_predictor(reranker, source)
    where = f"reranker {source}".strip()
    if law and reranker.label_kind_ != config.label_kind:
        raise StrategyError(f"{where}: trained on {reranker.label_kind_} labels, this run needs {config.label_kind}"
                            f" (temperature {config.temperature})")
    if int(reranker.topk_) != config.shape.topk:
        raise StrategyError(f"{where}: trained for pools with topk={reranker.topk_}, this run has topk="
                            f"{config.shape.topk}")
    try:
        resolve_features(online_features(reranker))
    except ValueError as exc:
        raise StrategyError(f"{where}: feature schema mismatch: {exc}") from None
