"""The numba kernels of ``featurize.block``: importing this module imports numba; the two called from Python
(``kernels``) compile on their first call and are cached beside this file (``cache=True``), so later processes load
them. One per-round body, ``fill_round``, serves a chunk of recorded rounds and one online round alike.

numba checks a cached kernel against the stamp of its own file only (numba docs, "Cache invalidation": changes in
other files are not detected), while the column indices and absent-value arrays compiled into these kernels come
from other files. Two rules keep a cache from going stale: a cached kernel holds ``frozen_digest`` of what it
compiles in, in a closure cell (numba keys its cache on a closure's cells), and the bodies it calls are not cached
themselves (a cached callee would be loaded from its own cache, stale, and linked into a freshly compiled caller).
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import numba
import numpy as np

from specrank.featurize.columns import (CACHE_AGE, CHILD_ENTROPY, CHILD_MAX_Q, LOG_Q, POSITION, PREV_ACCEPTED,
                                        PREV_COUNT, PROMPT_LEN, Q, REPEATS_ROOT, ROW_LOGP, SIB_ENTROPY, SIB_GAP,
                                        SIB_RANK, SIB_SUM_Q, SIB_TOP_Q, SUBTREE_EXPANDED, SUBTREE_MASS,
                                        SUBTREE_SIZE, WIDTH)
from specrank.featurize.absent import NO_ANCESTOR, NO_ANCESTORS, NO_ROW, NO_ROWS


def frozen_digest(*modules) -> str:
    """sha256 of what numba compiles into a kernel from ``modules``: each one's source file, and the numbers and
    arrays among its globals, which numba freezes into the machine code (those imported from other files
    included)."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
        for name, value in sorted(vars(module).items()):
            if isinstance(value, (int, float, np.number, np.ndarray)):
                value = np.ascontiguousarray(value)
                digest.update(f"{name}:{value.dtype.str}:{value.shape}:".encode() + value.tobytes())
    return digest.hexdigest()


class Kernels(NamedTuple):
    """The features kernels called from Python."""

    block: Callable  # N recorded rounds (``featurize.block.candidate_block``)
    round: Callable  # one online round (``featurize.block.round_block``)


@functools.cache
def kernels() -> Kernels:
    """The kernels, compiled on their first call and cached beside this file, keyed on this module's
    ``frozen_digest``."""
    return compile_kernels(frozen_digest(sys.modules[__name__]))


def compile_kernels(key: str) -> Kernels:
    """The kernels with ``key`` in their closures (``kernels``)."""

    @numba.njit(cache=True, nogil=True)
    def block_kernel(token, parent, depth, q_edge, draft_logp, topk, root_token, prompt_len, position,
                     prev_accepted, cache_logp, same_token_logp, preceding_logp, has_rows, cache_age, prev_count,
                     first_ancestor):
        key  # noqa: B018 (the cache key)
        n, m = parent.shape
        out = np.full((n, topk, WIDTH), np.nan)
        work = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(topk), np.empty(topk)
        for r in range(n):
            fill_round(out[r], token[r], parent[r], depth[r], q_edge[r], draft_logp[r], topk, root_token[r],
                       prompt_len[r], position[r], prev_accepted[r], cache_logp[r] if has_rows else NO_ROW,
                       same_token_logp[r] if has_rows else NO_ROW, preceding_logp[r] if has_rows else NO_ROW, has_rows,
                       cache_age[r], prev_count[r], first_ancestor[r] if first_ancestor.shape[0] else NO_ANCESTOR, work)
        return out

    @numba.njit(cache=True, nogil=True)
    def round_kernel(token, parent, depth, q_edge, draft_logp, topk, root_token, prompt_len, position,
                     prev_accepted, rows, row_index, has_rows, cache_age, prev_count, first_ancestor):
        """One online round (``featurize.block.RoundInputs``): its (topk, WIDTH) features."""
        key  # noqa: B018 (the cache key)
        out = np.full((topk, WIDTH), np.nan)
        fill_online_round(out, token, parent, depth, q_edge, draft_logp, topk, root_token, prompt_len, position,
                          prev_accepted, rows, row_index, has_rows, cache_age, prev_count, first_ancestor)
        return out

    return Kernels(block_kernel, round_kernel)


@numba.njit(nogil=True)  # not cached: compiled into its callers (the module's docstring)
def fill_online_round(o, token, parent, depth, q_edge, draft_logp, topk, root_token, prompt_len, position,
                      prev_accepted, rows, row_index, has_rows, cache_age, prev_count, first_ancestor):
    """``fill_round`` of one online round: the candidates' row entries gathered here (float32, as recorded)."""
    m = parent.shape[0]
    work = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(topk), np.empty(topk)
    values = np.empty((3, topk if has_rows else 0), np.float32)  # (3, 0) without rows: not read
    for s in range(values.shape[0]):
        for k in range(values.shape[1]):
            values[s, k] = rows[s, row_index[k]]
    fill_round(o, token, parent, depth, q_edge, draft_logp, topk, root_token, prompt_len, position,
               prev_accepted, values[0], values[1], values[2], has_rows, cache_age, prev_count, first_ancestor,
               work)


@numba.njit(nogil=True)  # not cached: compiled into its callers
def fill_round(o, token, parent, depth, q_edge, draft_logp, topk, root_token, prompt_len, position, prev_accepted,
               cache_logp, same_token_logp, preceding_logp, has_rows, cache_age, prev_count, first_ancestor, work):
    """Write one round's (topk, WIDTH) features into ``o`` (NaN-filled); pool arrays (M,)."""
    m = parent.shape[0]
    anc, kids, child_mass, child_qlogq = work
    # draft: the first level's drafter probabilities
    top, total = -np.inf, 0.0
    for k in range(topk):
        q = np.float64(q_edge[k])
        top = max(top, q)
        total += q
    norm = total if total > 0 else 1.0
    entropy = 0.0
    for k in range(topk):
        share = np.float64(q_edge[k]) / norm
        if share > 0:
            entropy -= share * math.log(share)
    for k in range(topk):
        q = np.float64(q_edge[k])
        rank = 0
        for j in range(topk):  # 0 for the most probable sibling, ties by pool index
            qj = np.float64(q_edge[j])
            if qj > q or (qj == q and j < k):
                rank += 1
        o[k, Q] = q
        o[k, LOG_Q] = math.log(q) if q > 0 else -np.inf
        o[k, SIB_RANK] = rank
        o[k, SIB_TOP_Q] = top
        o[k, SIB_GAP] = top - q
        o[k, SIB_SUM_Q] = total
        o[k, SIB_ENTROPY] = entropy
    # subtree below each first-level candidate
    kids[:] = 0
    for i in range(m):
        if parent[i] >= 0:
            kids[parent[i]] += 1
    for k in range(topk):
        o[k, CHILD_MAX_Q] = -np.inf
        o[k, SUBTREE_SIZE] = 0.0
        o[k, SUBTREE_MASS] = 0.0
        o[k, SUBTREE_EXPANDED] = 0.0
        child_mass[k] = 0.0
        child_qlogq[k] = 0.0
    for i in range(m):
        if first_ancestor.shape[0]:
            a = first_ancestor[i]
        else:  # parents precede their children in pool order
            a = i if depth[i] <= 1 else anc[parent[i]]
        anc[i] = a
        if kids[i] > 0:
            o[a, SUBTREE_EXPANDED] += 1.0
        if depth[i] > 1:
            o[a, SUBTREE_SIZE] += 1.0
            o[a, SUBTREE_MASS] += math.exp(np.float64(draft_logp[i]))
        if depth[i] == 2:
            q = np.float64(q_edge[i])
            o[a, CHILD_MAX_Q] = max(o[a, CHILD_MAX_Q], q)
            child_mass[a] += q
            if q > 0:
                child_qlogq[a] += q * math.log(q)
    for k in range(topk):
        if kids[k] == 0:
            o[k, CHILD_MAX_Q] = np.nan
            o[k, CHILD_ENTROPY] = np.nan
        else:  # H(q / S) = log S - sum(q log q) / S
            o[k, CHILD_ENTROPY] = math.log(child_mass[k]) - child_qlogq[k] / child_mass[k]
    # context
    for k in range(topk):
        o[k, PROMPT_LEN] = prompt_len
        o[k, POSITION] = position
        o[k, PREV_ACCEPTED] = prev_accepted
        o[k, REPEATS_ROOT] = 1.0 if token[k] == root_token else 0.0
    # retained rows: log r(x) and its gap to the first level's largest (NaN skipped)
    if has_rows:
        for s, logp in enumerate((cache_logp, same_token_logp, preceding_logp)):
            best = np.nan
            for k in range(topk):
                v = np.float64(logp[k])
                if v == v and not (best >= v):
                    best = v
            for k in range(topk):
                v = np.float64(logp[k])
                o[k, ROW_LOGP + 2 * s] = v
                o[k, ROW_LOGP + 2 * s + 1] = v - best
    for k in range(topk):
        o[k, CACHE_AGE] = cache_age if cache_age >= 0 else np.nan
        o[k, PREV_COUNT] = prev_count if prev_count >= 0 else np.nan
