"""Vectorized path products, ranking and top-B selection over N rounds x M candidates.

Ranking is by score descending, then depth ascending, then pool index ascending.
NaN scores rank as -inf. Every function is exact under ties (greedy point masses
give many exact zeros) and works on single rounds (N = 1) as cheaply as numpy allows.
"""

from __future__ import annotations

import numpy as np


class SelectionError(ValueError):
    """Bad input to a selection function; the message names the field."""


def check_budget(budget, m: int) -> int:
    """Return min(budget, m) for an integer budget >= 1, else raise SelectionError."""
    if isinstance(budget, (bool, np.bool_)) or not isinstance(budget, (int, np.integer)) or budget < 1:
        raise SelectionError(f"budget: expected an integer >= 1, got {budget!r}")
    return int(min(budget, m))


def check_budgets(budgets, m: int) -> list[int]:
    """A budget or a sequence of budgets as a list of min(b, m), each checked by ``check_budget``."""
    budgets = [budgets] if np.isscalar(budgets) else list(budgets)
    if not budgets:
        raise SelectionError("budget: expected at least one budget")
    return [check_budget(b, m) for b in budgets]


def _check_same_shape(**arrays) -> tuple[int, int]:
    shapes = {name: np.shape(a) for name, a in arrays.items()}
    first_name, first = next(iter(shapes.items()))
    if len(first) != 2:
        raise SelectionError(f"{first_name}: expected an (N, M) array, got shape {first}")
    for name, shape in shapes.items():
        if shape != first:
            raise SelectionError(f"{name}: shape {shape} differs from {first_name}'s {first}")
    return first


def _uniform_columns(depth: np.ndarray) -> bool:
    """True when every round has the same depth vector (fixed pool shape)."""
    return bool((depth == depth[:1]).all())


def _depth_columns(depth: np.ndarray, d: int):
    """Columns of depth ``d`` in a fixed-shape pool, as a slice when contiguous."""
    cols = np.flatnonzero(depth[0] == d)
    if cols.size and cols[-1] - cols[0] + 1 == cols.size:
        return slice(int(cols[0]), int(cols[-1]) + 1)
    return cols


def cumulate(parent: np.ndarray, depth: np.ndarray, edge: np.ndarray) -> np.ndarray:
    """(N, M) float64 product of ``edge`` along each candidate's path from the root."""
    n, m = _check_same_shape(parent=parent, depth=depth, edge=edge)
    out = np.array(edge, dtype=np.float64)  # (N, M), depth-1 entries are final
    if n == 0:
        return out
    max_depth = int(np.max(depth))
    if _uniform_columns(depth):
        # fixed pool shape: one gather per depth over that depth's columns only
        for d in range(2, max_depth + 1):
            cols = _depth_columns(depth, d)
            out[:, cols] *= np.take_along_axis(out, parent[:, cols].astype(np.intp), axis=1)
        return out
    base = out.copy()
    safe_parent = np.maximum(parent, 0).astype(np.intp)
    for d in range(2, max_depth + 1):
        out = np.where(depth == d, base * np.take_along_axis(out, safe_parent, axis=1), out)
    return out


def ancestors(parent: np.ndarray, depth: np.ndarray, k: int) -> np.ndarray:
    """(N, M) pool index of each candidate's depth-``k`` ancestor (itself when depth <= k)."""
    n, m = _check_same_shape(parent=parent, depth=depth)
    anc = np.broadcast_to(np.arange(m, dtype=np.intp), (n, m)).copy()
    if n == 0:
        return anc
    max_depth = int(np.max(depth))
    if _uniform_columns(depth):
        for d in range(k + 1, max_depth + 1):  # parents' entries are final before their children's
            cols = _depth_columns(depth, d)
            anc[:, cols] = np.take_along_axis(anc, parent[:, cols].astype(np.intp), axis=1)
        return anc
    safe_parent = np.maximum(parent, 0).astype(np.intp)
    for d in range(k + 1, max_depth + 1):
        anc = np.where(depth == d, np.take_along_axis(anc, safe_parent, axis=1), anc)
    return anc


def _clean(score: np.ndarray) -> np.ndarray:
    s = np.asarray(score, dtype=np.float64)
    return np.where(np.isnan(s), -np.inf, s)


PACKED_MIN_ROUNDS = 16  # below this, per-call overhead favours a plain stable argsort


def packable(depth: np.ndarray) -> bool:
    """True when depth and pool index fit the 8 + 16 low bits of a packed key."""
    return depth.shape[1] <= 1 << 16 and int(np.max(depth)) < 256


def _descending_bits(score32: np.ndarray) -> np.ndarray:
    """uint64 (N, M) integers whose ascending order is ``score32``'s descending order (ties kept)."""
    bits = (score32 + np.float32(0.0)).view(np.uint32)  # + 0.0 maps -0.0 to +0.0
    ascending = bits ^ np.where(bits >> 31, np.uint32(0xFFFFFFFF), np.uint32(0x80000000))
    return (~ascending).astype(np.uint64)


def packed_order(score32: np.ndarray, depth: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """(N, M) rank order of float32 scores by one integer sort of exact composite keys.

    Key bits: ``[group 8][descending score 32][depth 8][index 16]``; with ``group`` the order
    is grouped first (ascending), then ranked within each group.
    """
    n, m = score32.shape
    key = (_descending_bits(score32) << np.uint64(24)) | (depth.astype(np.uint64) << np.uint64(16))
    key |= np.arange(m, dtype=np.uint64)
    if group is not None:
        key |= group.astype(np.uint64) << np.uint64(56)
    return (np.sort(key, axis=1) & np.uint64(0xFFFF)).astype(np.intp)


def rank_order(score: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """(N, M) pool indices sorted by score desc, depth asc, pool index asc."""
    _check_same_shape(score=score, depth=depth)
    depth = np.asarray(depth)
    if len(depth) >= PACKED_MIN_ROUNDS and np.asarray(score).dtype == np.float32 and packable(depth):
        # float32 scores (recorded draft log-probs) pack with depth and index into one exact key
        s = np.asarray(score)
        return packed_order(np.where(np.isnan(s), np.float32(-np.inf), s), depth)
    neg = -_clean(score)
    if depth.shape[1] < 2 or (np.diff(depth, axis=1) >= 0).all():
        return np.argsort(neg, axis=1, kind="stable")  # pool order is already (depth, index)
    by_depth = np.argsort(depth, axis=1, kind="stable")  # (N, M) positions in (depth, index) order
    within = np.argsort(np.take_along_axis(neg, by_depth, axis=1), axis=1, kind="stable")
    return np.take_along_axis(by_depth, within, axis=1)


def rank_positions(order: np.ndarray) -> np.ndarray:
    """(N, M) rank (0 = best) of every pool index, the inverse of ``rank_order``'s permutation."""
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(order.shape[1]), order.shape), axis=1)
    return pos


def select_top(score: np.ndarray, depth: np.ndarray, budget: int) -> np.ndarray:
    """bool (N, M): the top-``budget`` candidates of each round under the ranking above."""
    n, m = _check_same_shape(score=score, depth=depth)
    b = check_budget(budget, m)
    if b == m:
        return np.ones((n, m), dtype=bool)
    if n < PACKED_MIN_ROUNDS:  # a few rounds (the decoder's hot path): one sort is cheapest
        mask = np.zeros((n, m), dtype=bool)
        np.put_along_axis(mask, rank_order(score, depth)[:, :b], True, axis=1)
        return mask
    s = _clean(score)
    cut = np.partition(s, m - b, axis=1)[:, m - b : m - b + 1]  # (N, 1) b-th largest score
    above = s > cut
    tied = s == cut
    need = b - above.sum(axis=1)  # (N,) tied candidates to admit
    mask = above | tied
    fix = np.flatnonzero(tied.sum(axis=1) > need)
    if fix.size:
        # exact tie-break only where ties straddle the cut: smallest (depth, index) first
        key = np.asarray(depth[fix], dtype=np.int64) * m + np.arange(m)
        key = np.where(tied[fix], key, np.iinfo(np.int64).max)
        kth = np.take_along_axis(np.sort(key, axis=1), (need[fix] - 1)[:, None], axis=1)
        mask[fix] = above[fix] | (key <= kth)
    return mask


def value(mask: np.ndarray, path_prob: np.ndarray) -> np.ndarray:
    """(N,) V(S) = sum of path probabilities over each round's selected set."""
    _check_same_shape(mask=mask, path_prob=path_prob)
    return np.where(mask, path_prob, 0.0).sum(axis=1)


def budget_curve(order: np.ndarray, path_prob: np.ndarray) -> np.ndarray:
    """(N, M) column b-1 = V of the top-b set in ``order``, for every budget b = 1..M."""
    _check_same_shape(order=order, path_prob=path_prob)
    return np.cumsum(np.take_along_axis(np.asarray(path_prob, np.float64), order, axis=1), axis=1)
