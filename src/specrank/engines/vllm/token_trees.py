"""vLLM's tree model: a chain of ``num_speculative_tokens``, a static ``speculative_token_tree`` (the releases that
served one), and the recorded rounds vLLM drafts (docs/tree-config.md)."""

from __future__ import annotations

import numpy as np

from specrank.engines.tree_settings import StaticTreeSetting, TreeConfigError, TreeSetting
from specrank.selection.pool import PoolBatch
from specrank.selection.static_tree import StaticTree, StaticTreeError


def vllm_chain(num_speculative_tokens: int) -> TreeSetting:
    return TreeSetting(1, num_speculative_tokens, num_speculative_tokens + 1)


def vllm_tree(choices) -> TreeSetting | StaticTreeSetting:
    """vLLM's ``speculative_token_tree`` as a setting; a tree of single children is the chain it drafts."""
    try:
        tree = StaticTree.from_choices(choices)
    except StaticTreeError as exc:
        raise TreeConfigError(str(exc)) from None
    if max(tree.branching) == 1:
        return vllm_chain(tree.depth)
    return StaticTreeSetting(tree)


def engine_rounds(rounds) -> PoolBatch:
    """The pool of the recorded rounds an engine drafts (``rounds``: ``evaluation.data.Rounds``): all but each
    prompt's first. specrank's first round drafts the first output token from the prompt; vLLM samples that token
    from the prefill and drafts from the second token on, so the first round has no counterpart in its counters
    (docs/tree-config.md, "Checked against vLLM")."""
    keep = np.flatnonzero(np.asarray(rounds.round) > 0)
    pool = rounds.pool.take(keep)
    pool.prompt_id = np.asarray(rounds.prompt_id)[keep]
    return pool
