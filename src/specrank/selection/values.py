"""Per-round values and expected tree sizes of every score and draw selection at a set of budgets, in one call,
and the cross-fitted choice among a score's variants (the mixture weight)."""

from __future__ import annotations

import numpy as np

from specrank.folds import fold_splits
from specrank.selection.draws import DraftGroups, draw_values, equal_mean, pearl_curves
from specrank.selection.pool import PoolBatch
from specrank.selection.scores import SCORES, fixed_values, score_of
from specrank.selection.select import SelectionError, check_budgets


def evaluate_scores(pool: PoolBatch, budgets, law: str = "sampling", inputs: dict | None = None,
                   scores=None, equal_size: bool = True) -> dict:
    """{name: (values (N, nB), sizes (N, nB))} for fixed-tree scores, draw selections and equal-mean PEARL.

    ``scores`` defaults to every registered score whose inputs are in ``inputs``.
    With ``equal_size``, "pearl_equal_mean" enlarges PEARL-style to root-draw's mean size
    over these rounds (mix of two whole pre-draw budgets) at each budget.
    """
    inputs = inputs or {}
    bs = check_budgets(budgets, pool.shape[1])
    names = [r for r in SCORES if set(SCORES[r].inputs) <= set(inputs)] if scores is None else list(scores)
    out = {name: fixed_values(pool, score_of(pool, name, law, **inputs), bs, law) for name in names}
    groups = DraftGroups.of(pool)
    out.update(draw_values(pool, bs, law, groups))
    if equal_size:
        curve_values, curve_sizes = pearl_curves(pool, law, groups=groups)
        matched = [equal_mean(curve_values, curve_sizes, s.mean()) for s in out["root_draw"][1].T]
        out["pearl_equal_mean"] = (
            np.column_stack([m.values for m in matched]),
            np.column_stack([m.sizes for m in matched]),
        )
    return out


def cross_fit_choice(values, fold) -> tuple[np.ndarray, np.ndarray]:
    """Per-round values of the option chosen on the other fold (e.g. the mixture weight w).

    ``values`` (N, K): each round's value under each of K options; ``fold`` (N,) 0/1 labels
    (prompt halves). Rounds of fold f use the option with the largest mean on fold 1 - f.
    Returns (values (N,), chosen option index (N,)).
    """
    v = np.asarray(values, dtype=np.float64)
    fold = np.asarray(fold)
    if v.ndim != 2 or fold.shape != (len(v),):
        raise SelectionError(f"fold: expected shape ({len(v)},) matching values (N, K), got {fold.shape}")
    if not np.isin(fold, (0, 1)).all() or len(np.unique(fold)) < 2:
        raise SelectionError("fold: expected labels 0 and 1, both present")
    best = np.array([np.argmax(v[other].mean(axis=0)) for _, other, _ in fold_splits(fold)])  # option per fold
    choice = best[fold.astype(np.intp)]
    return v[np.arange(len(v)), choice], choice
