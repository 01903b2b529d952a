"""Vectorized selection over N recorded rounds x M pool candidates (numpy only, no torch)."""

from specrank.selection.draws import DRAW_SELECTIONS, DraftGroups, draw_values, equal_mean, pearl_curves
from specrank.selection.pool import PoolBatch, PoolError
from specrank.selection.scores import (
    MIXTURE_WEIGHTS,
    SCORES,
    Score,
    first_token_agreement,
    fixed_values,
    score_of,
    stacked_factors,
)
from specrank.selection.select import (
    SelectionError,
    budget_curve,
    cumulate,
    rank_order,
    rank_positions,
    select_top,
    value,
)
from specrank.selection.static_tree import StaticTree, StaticTreeError, static_columns
from specrank.selection.stats import Interval, PromptBootstrap, quintile_labels, score_table
from specrank.selection.synthetic import SyntheticRounds, random_pool, synthetic_pools
from specrank.selection.values import cross_fit_choice, evaluate_scores

__all__ = [
    "DRAW_SELECTIONS",
    "DraftGroups",
    "Interval",
    "MIXTURE_WEIGHTS",
    "PoolBatch",
    "PoolError",
    "PromptBootstrap",
    "SCORES",
    "Score",
    "SelectionError",
    "StaticTree",
    "StaticTreeError",
    "SyntheticRounds",
    "budget_curve",
    "cross_fit_choice",
    "cumulate",
    "draw_values",
    "equal_mean",
    "evaluate_scores",
    "first_token_agreement",
    "fixed_values",
    "pearl_curves",
    "quintile_labels",
    "random_pool",
    "rank_order",
    "rank_positions",
    "score_table",
    "static_columns",
    "score_of",
    "select_top",
    "stacked_factors",
    "synthetic_pools",
    "value",
]
