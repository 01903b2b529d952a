"""Draft selection (EAGLE-3's tree) and top-B under any score function (the recorder's ``select``)."""

from __future__ import annotations

import numpy as np

from specrank.decode.strategies.base import SelectionStrategy, top_tree


class DraftSelection(SelectionStrategy):
    """Draft selection: top-B by cumulative draft probability."""


class ScoreSelection(SelectionStrategy):
    """Top-B under any score function ``pool -> (M,)`` (higher is better)."""

    def __init__(self, score_fn, name: str = "draft"):
        self.score_fn, self.name = score_fn, name

    def select(self, pool, ctx):
        score = np.asarray(self.score_fn(pool), dtype=np.float64)
        return top_tree(score, pool.depth, ctx.budget), score
