"""Selections that draw the first token from the root row: root_draw, PEARL-style, the PEARL
variant, and the equal-mean PEARL-style comparison (target-row reuse, arXiv 2610.29210, §5.1, App. D.2).

Values count the drawn token as one accepted token. A draw outside the pool's first
level is verified alone (value 1, size 1). Sizes are expected non-root node counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrank.selection.pool import PoolBatch, PoolError
from specrank.selection.select import check_budgets, packable, packed_order, rank_order, select_top

DRAW_SELECTIONS = ("root_draw", "pearl", "pearl_variant")


@dataclass(frozen=True)
class DraftGroups:
    """Draft order split by first-level branch.

    ``order`` (N, M): pool indices in draft order; ``within`` (N, M): rank of each depth>=2
    candidate among its branch's descendants in draft order (-1 at depth 1);
    ``n_desc`` (N, n_first): descendants per branch; ``top`` (N,): the drafter's most
    probable first-level candidate.
    """

    order: np.ndarray
    within: np.ndarray
    n_desc: np.ndarray
    top: np.ndarray

    @classmethod
    def of(cls, pool: PoolBatch) -> "DraftGroups":
        """Group ``pool``'s draft order by branch (one packed integer sort for float32 scores)."""
        n, m = pool.shape
        L = pool.n_first
        logp = pool.draft_logp
        order = rank_order(logp, pool.depth)
        below = pool.depth >= 2
        group = np.where(below, pool.first_ancestor, L)  # depth 1 -> dummy group L
        if logp.dtype == np.float32 and L < 255 and packable(pool.depth):
            grouped = packed_order(np.where(np.isnan(logp), np.float32(-np.inf), logp), pool.depth, group)
        else:
            perm = np.argsort(np.take_along_axis(group, order, axis=1), axis=1, kind="stable")
            grouped = np.take_along_axis(order, perm, axis=1)  # (N, M) by branch, then draft order
        slots = (np.arange(n)[:, None] * (L + 1) + group).ravel()
        counts = np.bincount(slots, minlength=n * (L + 1)).reshape(n, L + 1)
        gs = np.take_along_axis(group, grouped, axis=1)  # (N, M) non-decreasing branch labels
        starts = np.ones((n, m), dtype=bool)
        starts[:, 1:] = gs[:, 1:] != gs[:, :-1]
        first = np.maximum.accumulate(np.where(starts, np.arange(m), 0), axis=1)  # branch's first position
        within_sorted = np.arange(m) - first
        within = np.empty(n * m, dtype=np.intp)
        within[(np.arange(n)[:, None] * m + grouped).ravel()] = within_sorted.ravel()
        return cls(order, np.where(below, within.reshape(n, m), -1), counts[:, :L], order[:, 0])


def draw_values(pool: PoolBatch, budgets, law: str = "sampling", groups: DraftGroups | None = None) -> dict:
    """{name: (values (N, nB), sizes (N, nB))} for root_draw, PEARL-style and the PEARL variant."""
    bs = check_budgets(budgets, pool.shape[1])
    groups = groups or DraftGroups.of(pool)
    path = pool.path_prob(law)  # (N, M)
    p1 = pool.first_draw_prob(law)  # (N, L)
    below = pool.depth >= 2
    branch_p1 = np.take_along_axis(p1, pool.first_ancestor, axis=1)  # (N, M) draw prob of u's branch
    on_top = pool.first_ancestor == groups.top[:, None]
    top = groups.top[:, None]
    p1_top = np.take_along_axis(p1, top, axis=1)[:, 0]
    desc_top = np.take_along_axis(groups.n_desc, top, axis=1)[:, 0]
    out = {name: ([], []) for name in DRAW_SELECTIONS}
    for b in bs:
        kept = below & (groups.within < b - 1)  # each branch keeps its b-1 best descendants
        out["root_draw"][0].append(1.0 + np.where(kept, path, 0.0).sum(axis=1))
        out["root_draw"][1].append(1.0 + (p1 * np.minimum(b - 1, groups.n_desc)).sum(axis=1))
        tree = select_top(pool.draft_logp, pool.depth, b) & below  # draft tree, pruned after the draw
        out["pearl"][0].append(1.0 + np.where(tree, path, 0.0).sum(axis=1))
        out["pearl"][1].append(1.0 + np.where(tree, branch_p1, 0.0).sum(axis=1))
        out["pearl_variant"][0].append(1.0 + np.where(kept & on_top, path, 0.0).sum(axis=1))
        out["pearl_variant"][1].append(1.0 + p1_top * np.minimum(b - 1, desc_top))
    return {k: (np.stack(v, axis=1), np.stack(s, axis=1)) for k, (v, s) in out.items()}


def pearl_curves(pool: PoolBatch, law: str = "sampling", max_budget: int | None = None,
                 groups: DraftGroups | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(values, sizes), each (N, max_budget): PEARL-style at every pre-draw budget 1..max_budget."""
    m = pool.shape[1]
    k = m if max_budget is None else int(min(max_budget, m))
    order = (groups or DraftGroups.of(pool)).order[:, :k]
    below = np.take_along_axis(pool.depth >= 2, order, axis=1)
    path = np.take_along_axis(pool.path_prob(law), order, axis=1)
    p1 = pool.first_draw_prob(law)
    branch = np.take_along_axis(p1, np.take_along_axis(pool.first_ancestor, order, axis=1), axis=1)
    values = 1.0 + np.cumsum(np.where(below, path, 0.0), axis=1)
    sizes = 1.0 + np.cumsum(np.where(below, branch, 0.0), axis=1)
    return values, sizes


@dataclass(frozen=True)
class EqualMean:
    """PEARL-style enlarged to a target mean size: ``weight`` on budget ``lower + 1``, rest on ``lower``."""

    budget: float  # the mixed pre-draw budget, lower + weight
    lower: int
    weight: float
    values: np.ndarray  # (N,) per-round mixed values
    sizes: np.ndarray  # (N,) per-round mixed expected sizes


def equal_mean(values_curve: np.ndarray, sizes_curve: np.ndarray, target_size: float) -> EqualMean:
    """Mix the two nearest whole PEARL-style budgets so the mean pruned size equals ``target_size``."""
    means = sizes_curve.mean(axis=0)  # (K,) non-decreasing in the budget
    if not means[0] <= target_size <= means[-1]:
        raise PoolError(
            f"target_size: {target_size:.4g} outside the PEARL-style mean sizes "
            f"[{means[0]:.4g}, {means[-1]:.4g}] of budgets 1..{len(means)}"
        )
    hi = int(np.searchsorted(means, target_size, side="left"))  # first column reaching the target
    if hi == 0 or means[hi] == target_size:
        return EqualMean(float(hi + 1), hi + 1, 0.0, values_curve[:, hi].copy(), sizes_curve[:, hi].copy())
    w = float((target_size - means[hi - 1]) / (means[hi] - means[hi - 1]))
    return EqualMean(hi + w, hi, w, _mix(values_curve, hi, w), _mix(sizes_curve, hi, w))


def _mix(curve: np.ndarray, hi: int, w: float) -> np.ndarray:
    """(N,) weight ``w`` on column ``hi`` and ``1 - w`` on column ``hi - 1``."""
    return (1 - w) * curve[:, hi - 1] + w * curve[:, hi]
