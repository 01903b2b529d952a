"""Features of the pool subtree below each first-level candidate (docs/design.md, features: subtree)."""

from __future__ import annotations

import numpy as np

from specrank.selection.select import ancestors

SUBTREE_FEATURES = ["child_max_q", "child_entropy", "subtree_size", "subtree_mass", "subtree_expanded"]


def subtree_features(parent, depth, q_edge, draft_logp, topk: int, first_ancestor=None) -> dict[str, np.ndarray]:
    """Subtree features of the first ``topk`` pool nodes; each value (N, topk).

    ``child_max_q`` / ``child_entropy``: the largest drafter probability among the candidate's
    children and the entropy (nats) of the children's renormalized probabilities (NaN when the
    candidate has no child in the pool); ``subtree_size``: descendants in the pool;
    ``subtree_mass``: sum of their cumulative draft probabilities exp(draft_logp);
    ``subtree_expanded``: nodes of the subtree (candidate included) with a child in the pool.
    """
    n, m = parent.shape
    size_nk = n * topk
    # (N, M) each node's first-level ancestor: given by what grew the pools (online), else derived
    anc = ancestors(parent, depth, 1) if first_ancestor is None else first_ancestor
    key = (anc + (np.arange(n, dtype=np.int32) * topk)[:, None]).ravel()  # (round, candidate) of every node
    size = np.bincount(key, minlength=size_nk) - 1  # every candidate counts itself once
    below_mass = np.where(depth > 1, np.exp(draft_logp), np.float32(0))  # (N, M), float32 like the input
    mass = np.bincount(key, weights=below_mass.ravel(), minlength=size_nk)

    slot = np.where(parent < 0, m, parent) + (np.arange(n, dtype=np.int32) * (m + 1))[:, None]  # root -> column m
    kids = np.bincount(slot.ravel(), minlength=n * (m + 1)).reshape(n, m + 1)[:, :m]  # (N, M) children per node
    expanded = np.bincount(key, weights=(kids > 0).ravel(), minlength=size_nk)

    child = (depth == 2).ravel()
    ckey = key[child]  # a depth-2 node's first-level ancestor is its parent
    cq = q_edge.ravel()[child].astype(np.float64)
    cmass = np.bincount(ckey, weights=cq, minlength=size_nk)
    cqlogq = np.bincount(ckey, weights=cq * np.log(np.where(cq > 0, cq, 1.0)), minlength=size_nk)
    cmax = np.full(size_nk, -np.inf)
    np.maximum.at(cmax, ckey, cq)
    nochild = (kids[:, :topk] == 0).ravel()
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
