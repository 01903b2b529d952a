"""Reranker features of one round's first-level candidates, online: the pool and the row caches through the
offline featurizer's own kernel (``specrank.featurize.round_features``), no pandas."""

from __future__ import annotations

from specrank.featurize import RoundInputs, round_features
from specrank.featurize.absent import NO_ANCESTOR, NO_ROWS
from specrank.featurize.features import FEATURE_GROUPS


def first_level_inputs(state, pool, config, rows: bool = True) -> RoundInputs:
    """The features kernel's inputs of this round (``featurize.RoundInputs``), the retained rows read when
    ``rows`` and caches are kept. Built in place, not through ``featurize.round_inputs``: inside a decoding loop
    every Python call starts from cold caches, and the decoder's values already have the kernel's types."""
    block, index, has_rows, age, count = NO_ROWS, NO_ANCESTOR, False, -1, -1
    if rows and state.caches is not None:
        block, index, age, count = state.caches.gather(state.rounds, state.root, pool.token)  # read at [:topk]
        has_rows = True
    ancestor = NO_ANCESTOR if pool.first_ancestor is None else pool.first_ancestor  # carried from growth when known
    return RoundInputs(pool.token, pool.parent, pool.depth, pool.q_edge, pool.draft_logp, config.shape.topk,
                       state.root, float(len(state.prompt_ids)), float(len(state.output)), float(state.prev_accepted),
                       block, index, has_rows, float(age), float(count), ancestor)


def first_level_features(state, pool, config, groups=FEATURE_GROUPS):
    """Features of ``groups`` of this round's ``topk`` first-level candidates (rows absent when no caches are
    kept; not read unless ``groups`` has them), computed when a reranker first reads them, or by its own
    kernel from their inputs."""
    inputs = first_level_inputs(state, pool, config, "rows" in groups)
    return round_features(inputs, task=state.task, temperature=config.temperature, groups=groups)
