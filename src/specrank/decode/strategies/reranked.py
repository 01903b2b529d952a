"""Reranked selection: r(x1) prod_{i>=2} q_i, with r a reranker's prediction from features known before
verification (target-row reuse, arXiv 2610.29210, App. D.8); with a stacked reranker, r(x1) prod_{i>=2} g_i(q_i),
every deeper draft factor calibrated per depth."""

from __future__ import annotations

import sys

import numpy as np

from specrank.decode.strategies.base import SelectionStrategy, StrategyError, round_batch, top_tree
from specrank.featurize.features import feature_groups
from specrank.featurize.rows import ROW_FEATURES
from specrank.featurize.sets import resolve_features
from specrank.rerankers import compiled
from specrank.selection import score_of, stacked_factors

PREDICTOR = ("features_", "label_kind_", "topk_", "predict_first_factor")


class RerankedSelection(SelectionStrategy):
    """Top-B under the first draft factor replaced by ``reranker.predict_first_factor(features)``, and, where the
    reranker has ``predict_deeper_factors`` (``rerankers.StackedReranker``), every deeper factor by its
    prediction. The strategy builds and owns the reranker's per-round inference (``rerankers.compiled``)."""

    name = "reranked"
    reranks = True

    def __init__(self, reranker, source: str = ""):
        check_predictor(reranker, source)
        self.reranker, self.source = reranker, source
        self.compiled = None  # the reranker's per-round inference, built once checked
        self.round_predictor = None  # its one-call round path from the features kernel's inputs, if any
        self.deeper = callable(getattr(reranker, "predict_deeper_factors", None))
        self.needs_rows = any(f in ROW_FEATURES for f in online_features(reranker))
        self.groups = feature_groups(online_features(reranker))  # read only the rows the reranker reads

    def check(self, config, *, law: bool = True) -> None:
        check_reranker(self.reranker, config, self.source, law=law)
        self.prepare()

    def prepare(self) -> None:
        """Once, before the first round of a checked reranker: compile its inference, name the path (one line)."""
        if self.compiled is not None:
            return
        self.compiled = compiled(self.reranker)
        self.round_predictor = self.compiled.predict_round
        print(f"reranker {self.source or type(self.reranker).__name__}: {self.compiled.inference}", file=sys.stderr)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(compiled=None, round_predictor=None)  # a compiled kernel stays in its process
        return state

    def first_factor(self, pool, ctx) -> np.ndarray:
        """(topk,) predicted first factors of this round's first-level candidates: from the features kernel's
        inputs in one compiled call where the reranker has one (no features object, no checks a round: inside a
        decoding loop each Python call starts from cold caches), else from the round's features."""
        if self.round_predictor is not None and ctx.inputs is not None:
            return self.round_predictor(ctx.inputs(self.needs_rows), ctx.task)
        if self.compiled is None:
            self.prepare()
        return self.compiled.predict_first_factor(ctx.features(self.groups))

    def score(self, batch, law: str, factor) -> np.ndarray:
        """(1, M) this strategy's score of a one-round ``batch`` with first factors ``factor`` (1, topk): the
        ``reranked`` score, or with deeper factors the ``per_depth`` score of the stacked factors, as the
        offline score computes them (``selection.stacked_factors``)."""
        if not self.deeper:
            return score_of(batch, "reranked", law, first_factor=factor)
        if self.compiled is None:
            self.prepare()
        deeper = self.compiled.predict_deeper_factors(batch.depth[0], batch.q_edge[0])[None]
        return score_of(batch, "per_depth", law, edge_factor=stacked_factors(batch, factor, deeper))

    def select(self, pool, ctx):
        factor = (self.first_factor(pool, ctx) if ctx.first_factor is None else ctx.first_factor)[None]
        score = self.score(round_batch(pool, None, 1.0), ctx.law, factor)[0]
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
