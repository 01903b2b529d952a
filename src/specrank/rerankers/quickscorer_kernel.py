"""The numba kernel of ``rerankers.quickscorer``: importing this module imports numba; the kernel compiles on
its first call and is cached beside this file (``cache=True``), so later processes load it."""

from __future__ import annotations

import numba
import numpy as np

ALL_LEAVES = np.uint64(0xFFFFFFFFFFFFFFFF)
# de Bruijn bit scan: the index of the lowest set bit of w is TABLE[((w ^ (w - 1)) * MAGIC) >> 58]
MAGIC = np.uint64(0x03F79D71B4CB0A89)
TABLE = np.array([0, 47, 1, 56, 48, 27, 2, 60, 57, 49, 41, 37, 28, 16, 3, 61, 54, 58, 35, 52, 50, 42, 21, 44, 38,
                  32, 29, 23, 17, 11, 4, 62, 46, 55, 26, 59, 40, 36, 15, 53, 34, 51, 20, 43, 31, 22, 10, 45, 25, 39,
                  14, 33, 19, 30, 9, 24, 13, 18, 8, 12, 7, 6, 5, 63], np.int64)


@numba.njit(cache=True, nogil=True)
def margins(x, offsets, thresholds, trees, clears, nan_offsets, nan_trees, nan_clears, cat_features, cat_trees,
            cat_sets, cat_clears, leaf_offsets, leaf_values):
    """(n,) raw margins of the rows of ``x`` (n, F). A feature with one value in every row (a round's context
    features) is applied once, to the words every row starts from (pass -1 below)."""
    n, n_features = x.shape
    n_trees = leaf_offsets.shape[0]
    constant = np.zeros(n_features, np.bool_)
    for f in range(n_features):
        same = n > 1
        for r in range(1, n):
            a, b = x[r, f], x[0, f]
            if not (a == b or (a != a and b != b)):
                same = False
                break
        constant[f] = same
    shared = np.full(n_trees, ALL_LEAVES)
    words = np.empty(n_trees, np.uint64)
    out = np.empty(n)
    for r in range(-1, n):
        target = shared if r < 0 else words
        row = max(r, 0)
        if r >= 0:
            words[:] = shared
        for f in range(n_features):
            if constant[f] != (r < 0):
                continue
            value = x[row, f]
            if value != value:  # missing: the nodes that send it right
                for k in range(nan_offsets[f], nan_offsets[f + 1]):
                    target[nan_trees[k]] &= nan_clears[k]
                continue
            k, end = offsets[f], offsets[f + 1]
            while k < end and thresholds[k] < value:  # value > threshold: the test fails, the row goes right
                target[trees[k]] &= clears[k]
                k += 1
        if r < 0:
            continue
        for c in range(cat_features.shape[0]):
            v = x[r, cat_features[c]]
            # LightGBM truncates to an int first: -0.5 is category 0; missing and negative go right
            inside = v == v and v > -1.0 and v < 64.0 and (cat_sets[c] >> np.uint64(int(v))) & np.uint64(1) == 1
            if not inside:
                words[cat_trees[c]] &= cat_clears[c]
        total = 0.0
        for t in range(n_trees):  # LightGBM's order: the same float64 sum
            w = words[t]
            total += leaf_values[leaf_offsets[t] + TABLE[((w ^ (w - np.uint64(1))) * MAGIC) >> np.uint64(58)]]
        out[r] = total
    return out


@numba.njit(cache=True, nogil=True)
def round_margins(block, positions, columns, prior_position, prior, task_position, task_code, offsets, thresholds,
                  trees, clears, nan_offsets, nan_trees, nan_clears, cat_features, cat_trees, cat_sets, cat_clears,
                  leaf_offsets, leaf_values):
    """``margins`` of one round's matrix, gathered here from the features kernel's block (topk, W): column
    ``positions[j]`` <- block column ``columns[j]``, the prior (topk,) and the task's code (a position of -1:
    not read)."""
    n = block.shape[0]
    x = np.empty((n, offsets.shape[0] - 1))
    for r in range(n):
        for j in range(positions.shape[0]):
            x[r, positions[j]] = block[r, columns[j]]
        if prior_position >= 0:
            x[r, prior_position] = prior[r]
        if task_position >= 0:
            x[r, task_position] = task_code
    return margins(x, offsets, thresholds, trees, clears, nan_offsets, nan_trees, nan_clears, cat_features,
                   cat_trees, cat_sets, cat_clears, leaf_offsets, leaf_values)
