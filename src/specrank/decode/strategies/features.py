"""Reranker features of one round's first-level candidates, online: numpy on the pool and the row caches,
through the offline featurizer's own functions (``specrank.featurize.round_features``), no pandas."""

from __future__ import annotations

import numpy as np

from specrank.featurize import round_features
from specrank.featurize.features import FEATURE_GROUPS
from specrank.schema import ROW_COLUMNS, ROW_SCALARS

POOL_FIELDS = ("token", "parent", "depth", "q_edge", "draft_logp")
_ABSENT_ROWS = {**{k: np.nan for k in ROW_COLUMNS}, **{k: -1 for k in ROW_SCALARS}}


def first_level_features(state, pool, config, groups=FEATURE_GROUPS, names=None):
    """Features of ``groups`` of this round's ``topk`` first-level candidates (rows absent when no caches are
    kept; not read unless ``groups`` has them); ``names`` narrows the draft group to what a reranker reads."""
    topk = config.shape.topk
    rows = None
    if "rows" in groups and state.caches is not None:
        rows = state.caches.read(state.rounds, state.root, pool.token[:topk])
    elif "rows" in groups:
        rows = {k: np.full(topk, v, np.float32) if k in ROW_COLUMNS else v for k, v in _ABSENT_ROWS.items()}
    context = {"root_token": state.root, "prompt_len": len(state.prompt_ids), "position": len(state.output),
               "prev_accepted": state.prev_accepted}
    arrays = {k: getattr(pool, k) for k in POOL_FIELDS}
    if pool.first_ancestor is not None:  # carried from growth: the subtree features need not derive it
        arrays["first_ancestor"] = pool.first_ancestor
    return round_features(arrays, context, rows, task=state.task, topk=topk,
                          temperature=config.temperature, groups=groups, names=names)
