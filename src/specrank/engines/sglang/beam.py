"""SGLang's tree model: its EAGLE beam named by SGLang's flags (and EAGLE's), every valid setting of a grid, and
the beam replayed on a recorded pool (docs/tree-config.md).

specrank's pool with ``topk = expand = k`` and ``depth = s`` grows exactly SGLang's beam (topk k, num_steps s), so
a recording holds every candidate with its target probability. A smaller beam is read out of a larger recording
by replaying the growth on the recorded candidates (``beam_subpool``); a round whose replayed beam needs a node
the recording did not expand is *outside the recorded pool* and is never scored.
"""

from __future__ import annotations

import numpy as np

from specrank.engines.tree_settings import TreeConfigError, TreeSetting
from specrank.selection.pool import PoolBatch
from specrank.selection.static_tree import first_child


def sglang_setting(topk: int, num_steps: int, num_draft_tokens: int) -> TreeSetting:
    return TreeSetting(topk, num_steps, num_draft_tokens)


def eagle_setting(top_k: int, depth: int, total_token: int) -> TreeSetting:
    """EAGLE's ``top_k``/``depth``/``total_token``: ``depth`` draft steps after the root's, so depth + 1 levels,
    and ``total_token`` tokens verified with the root."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
        raise TreeConfigError(f"depth must be an integer >= 0, got {depth!r}")
    return TreeSetting(top_k, depth + 1, total_token)


def tree_grid(topks, num_steps, num_draft_tokens) -> list[TreeSetting]:
    """Every valid SGLang setting of the grid (topk 1 is a chain: n = s + 1 only), sorted."""
    out = set()
    for k in topks:
        for s in num_steps:
            if k == 1:
                out.add(TreeSetting(1, s, s + 1))
                continue
            for n in num_draft_tokens:
                if 2 <= n <= k + (s - 1) * k * k + 1:
                    out.add(TreeSetting(k, s, n))
    if not out:
        raise TreeConfigError("grid: no valid setting (num_draft_tokens too large for every topk / num_steps)")
    return sorted(out)


def beam_subpool(pool: PoolBatch, topk: int, depth: int) -> tuple[PoolBatch | None, np.ndarray]:
    """The pool SGLang's beam (topk, num_steps = depth) grows, replayed on a recorded pool, and which rounds hold it.

    Returns (sub-pool of the rounds that hold it, in the beam's own pool order, or None; contained (N,) bool).
    The recording must be a specrank pool (children of a node: a block of the recorded topk, best first).
    """
    n, m = pool.shape
    kk, dmax = pool.n_first, int(pool.depth.max())
    if topk > kk or depth > dmax:
        raise TreeConfigError(f"tree topk {topk}, num_steps {depth} lies outside the recorded pool (topk {kk},"
                              f" depth {dmax}): record that shape")
    if not (pool.depth == pool.depth[:1]).all():
        raise TreeConfigError("rounds: pools of different shapes in one recording")
    child_start = first_child(pool.parent)  # first child's pool index, -1: not expanded
    logp = pool.draft_logp
    levels = [np.tile(np.arange(topk), (n, 1))]  # recorded columns of each level, in the beam's order
    parents = [np.full((n, topk), -1, dtype=np.int64)]  # parents as positions in the sub-pool
    contained, offset = np.ones(n, dtype=bool), 0
    for d in range(2, depth + 1):
        prev = levels[-1]
        if d == 2:
            pos = np.tile(np.arange(topk), (n, 1))  # every depth-1 candidate is expanded
        else:  # the k best by cumulative draft log-probability; ties: earlier in the beam's order
            pos = np.argsort(-np.take_along_axis(logp, prev, axis=1), axis=1, kind="stable")[:, :topk]
        frontier = np.take_along_axis(prev, pos, axis=1)  # (N, f)
        start = np.take_along_axis(child_start, frontier, axis=1)
        contained &= (start >= 0).all(axis=1)
        levels.append((np.maximum(start, 0)[:, :, None] + np.arange(topk)).reshape(n, -1))
        parents.append(np.repeat(offset + pos, topk, axis=1))
        offset += prev.shape[1]
    cols, parent = np.concatenate(levels, axis=1), np.concatenate(parents, axis=1)
    if not contained.any():
        return None, contained
    keep = np.flatnonzero(contained)
    cols, parent = cols[keep], parent[keep]

    def take(a):
        return np.take_along_axis(a[keep], cols, axis=1)

    sub = PoolBatch(token=take(pool.token), parent=parent, depth=take(pool.depth), q_edge=take(pool.q_edge),
                    draft_logp=take(pool.draft_logp), p_edge=take(pool.p_edge),
                    p_argmax_child=take(pool.p_argmax_child),
                    prompt_id=None if pool.prompt_id is None else pool.prompt_id[keep],
                    task=None if pool.task is None else pool.task[keep])
    return sub.validate(), contained
