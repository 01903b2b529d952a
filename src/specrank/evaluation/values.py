"""Per-round expected accepted draft tokens of every evaluated score over a budget sweep.

Score functions come from ``specrank.selection.scores``, names from ``specrank.evaluation.names``; this module
only decides which inputs
each one gets (reranker predictions, calibrated edges, retained rows) and chooses the
geometric-mixture weight of each prompt half on the other half.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specrank.evaluation.data import Rounds
from specrank.evaluation.names import BUILT_IN, of_kind
from specrank.featurize.features import META_KEY
from specrank.featurize.context import prompt_index
from specrank.featurize.rows import ROW_SOURCES
from specrank.law import Law
from specrank.folds import fold_splits
from specrank.rerankers import PerDepthCalibration, cross_fit_table
from specrank.selection.scores import MIXTURE_WEIGHTS, fixed_values, score_of

BUDGET_SWEEP = (2, 4, 8, 12, 16, 24, 32, 48, 59, 80, 100, 150, 200)
HEADLINE_BUDGETS = (8, 59)
INPUT_FREE = of_kind("draft", "exact")  # scores of the pool and its recorded rows alone


def check_budgets(budgets, m: int) -> tuple[int, ...]:
    """Sorted distinct budgets, each an integer in 1..M; ValueError naming the first bad one."""
    out = sorted({int(b) for b in budgets})
    bad = [b for b in out if not 1 <= b <= m]
    if not out or bad:
        raise ValueError(f"budgets: expected integers in 1..{m} (the pool size), got {bad or 'none'}")
    return tuple(out)


def per_depth_edges(rounds: Rounds) -> np.ndarray:
    """(N, M) cross-fitted per-depth isotonic calibration of every draft factor (App. D.8).

    Each half's maps are fitted on the other half's scored edges (NaN labels left out).
    """
    pool = rounds.pool
    label = pool.edge_prob(rounds.law).reshape(-1)  # (N * M,), NaN where unscored
    every = np.ones(pool.shape, dtype=bool)
    edges = _edges(rounds, every).assign(prompt_id=np.repeat(prompt_index(rounds.prompt_id), pool.shape[1]))
    fit = cross_fit_table(PerDepthCalibration(), edges, label, folds=np.repeat(rounds.fold, pool.shape[1]),
                    fit_rows=~np.isnan(label))
    return fit.predictions.reshape(pool.shape)


def _edges(rounds: Rounds, mask: np.ndarray) -> pd.DataFrame:
    """Edges table (``depth``, ``q_edge``) of the masked pool cells, with the features metadata rerankers check."""
    edges = pd.DataFrame({"depth": rounds.pool.depth[mask], "q_edge": rounds.pool.q_edge[mask].astype(np.float64)})
    edges.attrs[META_KEY] = {"label_kind": Law.named(rounds.law).label_kind, "topk": rounds.topk}
    return edges


def score_inputs(rounds: Rounds, first_factors: dict[str, np.ndarray], edges: np.ndarray | None = None
                ) -> dict[str, tuple[str, dict]]:
    """Evaluated score name -> (registered score function, its inputs) for every score evaluated on ``rounds``;
    ``edges``: the rounds' ``per_depth_edges`` when the caller already has them (they cost a cross-fit over every
    pool edge)."""
    clash = sorted(set(first_factors) & set(BUILT_IN))
    if clash:
        raise ValueError(f"predictions: column {clash[0]!r} clashes with a built-in score name")
    scores = {name: (name, {}) for name in INPUT_FREE}
    for name, factor in first_factors.items():
        scores[name] = ("reranked", {"first_factor": factor})
    scores["per_depth"] = ("per_depth", {"edge_factor": per_depth_edges(rounds) if edges is None else edges})
    for source in ROW_SOURCES:
        scores[f"subst_{source}"] = ("substitution", {"row_logp": rounds.rows[source]})
    return scores


def score_values(rounds: Rounds, scores: dict[str, tuple], budgets) -> dict[str, np.ndarray]:
    """Evaluated score name -> (N, len(budgets)) expected accepted draft tokens of its top-B trees."""
    pool, law = rounds.pool, rounds.law
    return {
        name: fixed_values(pool, score_of(pool, function, law, **inputs), list(budgets), law)[0]
        for name, (function, inputs) in scores.items()
    }


def mixture_values(rounds: Rounds, budgets, weights=MIXTURE_WEIGHTS) -> tuple[dict[str, np.ndarray], dict]:
    """Geometric mixtures of q1 with each retained row, the weight of each half chosen on the other.

    Returns (score name -> (N, nB) values, score name -> (2 halves, nB) chosen weights); the weight
    of a half maximizes the mean value over the other half's rounds at each budget.
    """
    pool, law, fold = rounds.pool, rounds.law, rounds.fold
    values, chosen = {}, {}
    for source in ROW_SOURCES:
        per_w = np.stack([
            fixed_values(pool, score_of(pool, "mixture", law, row_logp=rounds.rows[source], weight=w),
                         list(budgets), law)[0]
            for w in weights
        ])  # (W, N, nB)
        pick = np.stack([per_w[:, train].mean(axis=1).argmax(axis=0) for _, train, _ in fold_splits(fold)])  # (2, nB)
        idx = pick[fold]  # (N, nB) weight index of each round's half
        values[f"mix_{source}"] = np.take_along_axis(per_w, idx[None], axis=0)[0]
        chosen[f"mix_{source}"] = np.asarray(weights)[pick]
    return values, chosen
