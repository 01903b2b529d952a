"""The path score SGLang ranks with specrank's plugin, shared by the plugin and ``specrank tree-config``'s offline
scoring of the same setting (``experiments.tree_config.setting_scores``), so the two cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specrank.selection.pool import PoolBatch
from specrank.selection.scores import score_of, stacked_factors

DeeperFactors = Callable[[np.ndarray, np.ndarray], np.ndarray]  # g_d(q) of (depth, q), both (n,)


def plugin_score(pool: PoolBatch, law: str, first: np.ndarray, deeper: DeeperFactors | None) -> np.ndarray:
    """(N, M) log r(x1) + sum_{d>=2} log g_d(q_d) over the beam SGLang grew by draft scores (``pool``), with
    ``first`` (N, topk) the reranker's first factors and ``deeper`` a stacked reranker's per-depth maps; without
    ``deeper`` the draft factors stay: log r(x1) + sum_{d>=2} log q_d."""
    if deeper is None:
        return score_of(pool, "reranked", law, first_factor=first)
    edge = np.asarray(deeper(pool.depth.reshape(-1), pool.q_edge.reshape(-1)), dtype=np.float64).reshape(pool.shape)
    return score_of(pool, "per_depth", law, edge_factor=stacked_factors(pool, first, edge))
