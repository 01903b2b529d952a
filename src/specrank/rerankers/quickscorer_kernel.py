"""The numba kernels of ``rerankers.quickscorer``: importing this module imports numba; each kernel compiles on
its first call and is cached beside this file (``cache=True``), so later processes load it."""

from __future__ import annotations

import functools
import math
import sys

import numba
import numpy as np

from specrank.featurize import kernel as features_kernel
from specrank.featurize.columns import WIDTH
from specrank.featurize.kernel import fill_online_round, frozen_digest

ALL_LEAVES = np.uint64(0xFFFFFFFFFFFFFFFF)
# de Bruijn bit scan: the index of the lowest set bit of w is TABLE[((w ^ (w - 1)) * MAGIC) >> 58]
MAGIC = np.uint64(0x03F79D71B4CB0A89)
TABLE = np.array([0, 47, 1, 56, 48, 27, 2, 60, 57, 49, 41, 37, 28, 16, 3, 61, 54, 58, 35, 52, 50, 42, 21, 44, 38,
                  32, 29, 23, 17, 11, 4, 62, 46, 55, 26, 59, 40, 36, 15, 53, 34, 51, 20, 43, 31, 22, 10, 45, 25, 39,
                  14, 33, 19, 30, 9, 24, 13, 18, 8, 12, 7, 6, 5, 63], np.int64)


@numba.njit(cache=True, nogil=True)
def columns_margins(xt, offsets, thresholds, trees, clears, nan_offsets, nan_trees, nan_clears, cat_features,
                    cat_trees, cat_sets, cat_clears, leaf_offsets, leaf_values):
    """(n,) raw margins of the rows whose features are the columns of ``xt`` (F, n).

    A node's test updates the word of its tree for every row at once (the words are (T, n), a feature's values
    (n,) contiguous), so the inner loop over rows is branch-free and vectorizes; per row, the scan of a
    feature's ascending thresholds would branch on every node. A feature's scan stops at the rows' largest
    value, past which no row goes right; below the smallest, every row goes right, and the node clears the
    bits of one word its tree shares across the rows (a round's context features are one value for all its
    rows, so most of their nodes cost one operation, not one a row)."""
    n_features, n = xt.shape
    n_trees = leaf_offsets.shape[0]
    words = np.full((n_trees, n), ALL_LEAVES)
    shared = np.full(n_trees, ALL_LEAVES)
    for f in range(n_features):
        col = xt[f]
        low, top, missing = np.inf, -np.inf, False
        for r in range(n):
            v = col[r]
            if v != v:
                missing = True
            else:
                low, top = min(low, v), max(top, v)
        if missing:  # the nodes that send a missing value right
            low = -np.inf  # ... and a missing row does not go right with the others below the smallest value
            for k in range(nan_offsets[f], nan_offsets[f + 1]):
                t, keep = nan_trees[k], nan_clears[k]
                for r in range(n):
                    if col[r] != col[r]:
                        words[t, r] &= keep
        k, end = offsets[f], offsets[f + 1]
        while k < end and thresholds[k] < low:  # every row's value > threshold: every row goes right
            shared[trees[k]] &= clears[k]
            k += 1
        while k < end and thresholds[k] < top:  # value > threshold: the test fails, the row goes right
            threshold, t, keep = thresholds[k], trees[k], clears[k]
            for r in range(n):
                words[t, r] &= keep if col[r] > threshold else ALL_LEAVES  # NaN compares False: kept
            k += 1
    for c in range(cat_features.shape[0]):
        for r in range(n):
            v = xt[cat_features[c], r]
            # LightGBM truncates to an int first: -0.5 is category 0; missing and negative go right
            inside = v == v and v > -1.0 and v < 64.0 and (cat_sets[c] >> np.uint64(int(v))) & np.uint64(1) == 1
            if not inside:
                words[cat_trees[c], r] &= cat_clears[c]
    out = np.zeros(n)
    for t in range(n_trees):  # LightGBM's order: the same float64 sum per row
        base = leaf_offsets[t]
        for r in range(n):
            w = words[t, r] & shared[t]
            out[r] += leaf_values[base + TABLE[((w ^ (w - np.uint64(1))) * MAGIC) >> np.uint64(58)]]
    return out


@numba.njit(cache=True, nogil=True)
def margins(x, offsets, thresholds, trees, clears, nan_offsets, nan_trees, nan_clears, cat_features, cat_trees,
            cat_sets, cat_clears, leaf_offsets, leaf_values):
    """(n,) raw margins of the rows of ``x`` (n, F)."""
    return columns_margins(np.ascontiguousarray(x.T), offsets, thresholds, trees, clears, nan_offsets, nan_trees,
                           nan_clears, cat_features, cat_trees, cat_sets, cat_clears, leaf_offsets, leaf_values)


# The round kernel's model: every array below as 8-byte words after a header. Inside a decoding loop every
# argument of a numba call is typed and unboxed from cold caches; one array in place of seventeen saves some
# 15 µs a round there (docs/benchmarks.md).
ROUND_PARTS = ("offsets", "thresholds", "trees", "clears", "nan_offsets", "nan_trees", "nan_clears", "cat_features",
               "cat_trees", "cat_sets", "cat_clears", "leaf_offsets", "leaf_values", "positions", "columns",
               "prior_tokens", "prior_means")
PRIOR_POSITION, PRIOR_DEFAULT, TASK_POSITION = len(ROUND_PARTS) + 1, len(ROUND_PARTS) + 2, len(ROUND_PARTS) + 3
HEADER = len(ROUND_PARTS) + 4  # part i is words[words[i]:words[i + 1]]; then the plan's three scalars


def as_words(a: np.ndarray) -> np.ndarray:
    """``a``'s values as uint64 words: float64 bit for bit, integers widened to int64 first."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint64) if a.dtype in (np.float64, np.uint64) else a.astype(np.int64).view(np.uint64)


def round_words(arrays, plan: tuple) -> np.ndarray:
    """``ROUND_PARTS`` of ``arrays`` (``rerankers.quickscorer.QuickScorerArrays``) and ``plan`` as one uint64
    array: the header's start of each part (and the end), the prior's position, default (float64 bits) and the
    task's position, then the parts."""
    positions, columns, prior_position, prior_tokens, prior_means, prior_default, task_position = plan
    named = {"positions": positions, "columns": columns, "prior_tokens": prior_tokens,
             "prior_means": np.asarray(prior_means, np.float64)}
    parts = [as_words(named[p] if p in named else getattr(arrays, p)) for p in ROUND_PARTS]
    starts = HEADER + np.cumsum([0] + [len(p) for p in parts])
    words = np.empty(starts[-1], np.uint64)
    words[: len(starts)] = starts
    words[PRIOR_POSITION], words[TASK_POSITION] = as_words(np.array([prior_position, task_position]))
    words[PRIOR_DEFAULT] = as_words(np.array([prior_default], np.float64))[0]
    for start, part in zip(starts, parts):
        words[start : start + len(part)] = part
    return words


@numba.njit(nogil=True)
def part(model, i):
    """Part ``i`` of ``ROUND_PARTS`` in a round model's words."""
    return model[model[i] : model[i + 1]]


@functools.cache
def round_kernel():
    """The round kernel, compiled on its first call and cached beside this file (a later process loads it: some
    seconds saved at every reranker's first round). It compiles in the features kernel's code and constants, from
    other files than its own: its cache is keyed on their ``frozen_digest`` and this module's (the rules of
    ``featurize.kernel``'s docstring)."""
    return compile_round_kernel(frozen_digest(features_kernel, sys.modules[__name__]))


def compile_round_kernel(key: str):
    """``round_probabilities`` with ``key`` in its closure (``round_kernel``)."""

    @numba.njit(cache=True, nogil=True)
    def round_probabilities(token, parent, depth, q_edge, draft_logp, topk, root_token, prompt_len, position,
                            prev_accepted, rows, row_index, has_rows, cache_age, prev_count, first_ancestor, task_code,
                            model, out):
        """One online round's first-factor predictions, written into ``out`` (topk,) float64, features and trees in
        one call (nothing is returned: inside a decoding loop, numba's boxing of a returned array costs some 30 µs
        from cold caches, an array allocated by the caller almost nothing): the round's
        features (``featurize.block.RoundInputs``, the features kernel's own code), its matrix's columns
        (``positions[j]`` <- feature ``columns[j]``, the token prior looked up as ``TokenPrior.transform`` does
        and the task's code; a position of -1: not read), the margins, then the logistic function clipped to
        [0, 1]. ``model``: the trees and the plan as words (``round_words``)."""
        key  # noqa: B018 (the cache key)
        offsets, thresholds = part(model, 0).view(np.int64), part(model, 1).view(np.float64)
        trees, clears = part(model, 2).view(np.int64), part(model, 3)
        nan_offsets, nan_trees = part(model, 4).view(np.int64), part(model, 5).view(np.int64)
        nan_clears = part(model, 6)
        cat_features, cat_trees = part(model, 7).view(np.int64), part(model, 8).view(np.int64)
        cat_sets, cat_clears = part(model, 9), part(model, 10)
        leaf_offsets, leaf_values = part(model, 11).view(np.int64), part(model, 12).view(np.float64)
        positions, columns = part(model, 13).view(np.int64), part(model, 14).view(np.int64)
        prior_tokens, prior_means = part(model, 15).view(np.int64), part(model, 16).view(np.float64)
        prior_position, task_position = np.int64(model[PRIOR_POSITION]), np.int64(model[TASK_POSITION])
        prior_default = model[PRIOR_DEFAULT : PRIOR_DEFAULT + 1].view(np.float64)[0]
        block = np.full((topk, WIDTH), np.nan)
        fill_online_round(block, token, parent, depth, q_edge, draft_logp, topk, root_token, prompt_len, position,
                          prev_accepted, rows, row_index, has_rows, cache_age, prev_count, first_ancestor)
        xt = np.empty((offsets.shape[0] - 1, topk))  # (F, topk): the matrix's columns
        for j in range(positions.shape[0]):
            for r in range(topk):
                xt[positions[j], r] = block[r, columns[j]]
        for r in range(topk):
            if prior_position >= 0:
                value = prior_default
                if prior_tokens.shape[0]:
                    i = min(np.searchsorted(prior_tokens, token[r]), prior_tokens.shape[0] - 1)
                    if prior_tokens[i] == token[r]:
                        value = prior_means[i]
                xt[prior_position, r] = value
            if task_position >= 0:
                xt[task_position, r] = task_code
        raw = columns_margins(xt, offsets, thresholds, trees, clears, nan_offsets, nan_trees, nan_clears,
                              cat_features, cat_trees, cat_sets, cat_clears, leaf_offsets, leaf_values)
        for r in range(topk):
            out[r] = min(max(1.0 / (1.0 + math.exp(-raw[r])), 0.0), 1.0)

    return round_probabilities
