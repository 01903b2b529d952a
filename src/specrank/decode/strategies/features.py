"""Reranker features of one round's first-level candidates, online: the pool and the row caches through the
offline featurizer's own kernel (``specrank.featurize.round_features``), no pandas."""

from __future__ import annotations

from specrank.featurize import round_features, round_inputs
from specrank.featurize.features import FEATURE_GROUPS


def first_level_features(state, pool, config, groups=FEATURE_GROUPS):
    """Features of ``groups`` of this round's ``topk`` first-level candidates (rows absent when no caches are
    kept; not read unless ``groups`` has them), computed when a reranker first reads them, or by its own
    kernel from their inputs."""
    topk = config.shape.topk
    rows = index = None
    age = count = -1
    if "rows" in groups and state.caches is not None:
        rows, index, age, count = state.caches.gather(state.rounds, state.root, pool.token)  # read at [:topk]
    inputs = round_inputs(pool.token, pool.parent, pool.depth, pool.q_edge, pool.draft_logp, topk, state.root,
                          len(state.prompt_ids), len(state.output), state.prev_accepted, rows, index, age, count,
                          pool.first_ancestor)  # carried from growth when known
    return round_features(inputs, task=state.task, temperature=config.temperature, groups=groups)
