"""Features of the pool subtree below each first-level candidate (SPEC §5 "subtree")."""

from __future__ import annotations

import numpy as np

SUBTREE_FEATURES = ["child_max_q", "child_entropy", "subtree_size", "subtree_mass", "subtree_expanded"]


def first_level_ancestor(parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Pool index of each node's depth-1 ancestor (itself at depth 1), (N, M), by pointer doubling."""
    n, m = parent.shape
    up = np.where(depth > 1, parent, np.arange(m, dtype=parent.dtype)).astype(np.int32)  # (N, M)
    for _ in range(int(np.ceil(np.log2(max(int(depth.max(initial=1)), 2))))):
        up = np.take_along_axis(up, up, axis=1)  # 2^i steps up, stopping at depth 1
    return up


def subtree_features(parent, depth, q_edge, draft_logp, topk: int) -> dict[str, np.ndarray]:
    """Subtree features of the first ``topk`` pool nodes; each value (N, topk).

    ``child_max_q`` / ``child_entropy``: the largest drafter probability among the candidate's
    children and the entropy (nats) of the children's renormalized probabilities (NaN when the
    candidate has no child in the pool); ``subtree_size``: descendants in the pool;
    ``subtree_mass``: sum of their cumulative draft probabilities exp(draft_logp);
    ``subtree_expanded``: nodes of the subtree (candidate included) with a child in the pool.
    """
    n, m = parent.shape
    anc = first_level_ancestor(parent, depth)  # (N, M)
    rows = np.arange(n, dtype=np.int64)[:, None]
    key = (rows * topk + anc).ravel()  # flat (round, candidate) of every node
    below = (depth > 1).ravel()
    size = np.bincount(key[below], minlength=n * topk)
    mass = np.bincount(key[below], weights=np.exp(draft_logp.ravel()[below].astype(np.float64)), minlength=n * topk)

    has_child = np.zeros(n * m, dtype=bool)
    has_child[(rows * m + parent).ravel()[below]] = True
    expanded = np.bincount(key[has_child], minlength=n * topk)

    child = (depth == 2).ravel()
    ckey = (rows * topk + parent).ravel()[child]
    cq = q_edge.ravel()[child].astype(np.float64)
    cmass = np.bincount(ckey, weights=cq, minlength=n * topk)
    cqlogq = np.bincount(ckey, weights=cq * np.log(np.where(cq > 0, cq, 1.0)), minlength=n * topk)
    cmax = np.full(n * topk, -np.inf)
    np.maximum.at(cmax, ckey, cq)
    nochild = cmass <= 0
    safe = np.where(nochild, 1.0, cmass)
    entropy = np.log(safe) - cqlogq / safe  # H of q/S = log S - sum(q log q)/S
    shape = (n, topk)
    return {
        "child_max_q": np.where(nochild, np.nan, cmax).reshape(shape),
        "child_entropy": np.where(nochild, np.nan, entropy).reshape(shape),
        "subtree_size": size.reshape(shape).astype(np.float64),
        "subtree_mass": mass.reshape(shape),
        "subtree_expanded": expanded.reshape(shape).astype(np.float64),
    }
