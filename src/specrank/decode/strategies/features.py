"""Reranker features of one round's first-level candidates, online: the pool and the row caches through the
offline featurizer's own kernel (``specrank.featurize.round_features``), no pandas."""

from __future__ import annotations

from specrank.featurize import round_features
from specrank.featurize.features import FEATURE_GROUPS

POOL_FIELDS = ("token", "parent", "depth", "q_edge", "draft_logp")


def first_level_features(state, pool, config, groups=FEATURE_GROUPS):
    """Features of ``groups`` of this round's ``topk`` first-level candidates (rows absent when no caches are
    kept; not read unless ``groups`` has them)."""
    topk = config.shape.topk
    rows = None
    if "rows" in groups and state.caches is not None:
        rows = state.caches.read(state.rounds, state.root, pool.token[:topk])
    context = {"root_token": state.root, "prompt_len": len(state.prompt_ids), "position": len(state.output),
               "prev_accepted": state.prev_accepted}
    arrays = {k: getattr(pool, k) for k in POOL_FIELDS}
    if pool.first_ancestor is not None:  # carried from growth: the subtree features need not derive it
        arrays["first_ancestor"] = pool.first_ancestor
    return round_features(arrays, context, rows, task=state.task, topk=topk, temperature=config.temperature,
                          groups=groups)
