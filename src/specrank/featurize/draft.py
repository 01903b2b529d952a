"""Draft features of each first-level candidate and its siblings (docs/design.md, features: draft)."""

from __future__ import annotations

import numpy as np

DRAFT_FEATURES = ["q", "log_q", "sib_rank", "sib_top_q", "sib_gap", "sib_sum_q", "sib_entropy"]


def draft_features(q1: np.ndarray, names=None) -> dict[str, np.ndarray]:
    """Features from the first-level draft probabilities ``q1`` (N, K); each value (N, K). All of
    ``DRAFT_FEATURES``, unless ``names`` asks only for ``q`` and/or ``log_q``: then only those, without the sibling
    statistics (an online reranker reading ``q`` computes nothing else).

    ``sib_rank`` is 0 for the most probable sibling (ties by pool index); ``sib_gap`` is
    ``max q - q``; ``sib_entropy`` is the entropy (nats) of the first level renormalized.
    """
    q1 = q1.astype(np.float64)
    if names is not None and set(names) <= {"q", "log_q"}:
        with np.errstate(divide="ignore"):
            return {"q": q1, "log_q": np.log(q1)} if "log_q" in names else {"q": q1}
    k = q1.shape[1]
    order = np.argsort(-q1, axis=1, kind="stable")  # (N, K)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(k)[None, :].repeat(len(q1), 0), axis=1)
    top = q1.max(axis=1, keepdims=True)  # (N, 1)
    total = q1.sum(axis=1, keepdims=True)  # (N, 1)
    share = q1 / np.where(total > 0, total, 1.0)
    entropy = -np.sum(share * np.log(np.where(share > 0, share, 1.0)), axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        log_q = np.log(q1)
    return {
        "q": q1,
        "log_q": log_q,
        "sib_rank": rank.astype(np.float64),
        "sib_top_q": np.broadcast_to(top, q1.shape),
        "sib_gap": top - q1,
        "sib_sum_q": np.broadcast_to(total, q1.shape),
        "sib_entropy": np.broadcast_to(entropy, q1.shape),
    }
