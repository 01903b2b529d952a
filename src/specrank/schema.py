"""Column contracts of the recorded tables (torch-free, shared by every stage).

A run directory holds ``manifest.json`` and ``rounds/*.parquet`` (one file per
shard of prompts). Pool columns are fixed-size lists of length M (pool order:
parents precede children; the ``topk`` first-level candidates come first, at
indices ``0..topk-1``, in descending draft probability). Retained-row columns
are lists of length ``topk`` aligned with those first-level candidates.
"""

from __future__ import annotations

# One row per verification round.
ROUND_KEYS = ["prompt_id", "task", "round", "position", "prompt_len", "root_token"]

# Fixed-size list columns of length M, pool order.
POOL_COLUMNS = {
    "token": "int32",  # candidate token id
    "parent": "int16",  # pool index of the parent, -1 = the root
    "depth": "int8",  # 1..D
    "q_edge": "float32",  # drafter probability of the token at its parent
    "draft_logp": "float32",  # cumulative draft log-probability of the path
    "p_edge": "float32",  # target probability at the parent's row (NaN unscored)
    "p_argmax_child": "int8",  # 1 where the token is the target argmax at its parent
}

# Root row summaries (scalars).
ROOT_COLUMNS = {
    "root_entropy": "float32",  # entropy (nats) of the target root row at temperature T
    "root_argmax": "int32",
    "root_argmax_prob": "float32",
}

# Outcome of the round (scalars, except accepted_nodes).
OUTCOME_COLUMNS = {
    "accepted": "int16",  # A, accepted draft tokens
    "accepted_nodes": "list<int16>",  # pool indices of the accepted path, root excluded
    "continuation": "int32",  # the emitted non-draft token (next root)
    # Draft rank (0-based, docs/design.md, ranking and ties) of the emitted address (accepted path +
    # continuation) among pool candidates, -1 when the address is not in the pool.
    # The round is covered by a scored set of the top-m candidates iff 0 <= emitted_rank < m.
    "emitted_rank": "int32",
    "covered": "bool",  # covered by this pass's own scored set
    "n_scored": "int16",  # prefixes scored by the pass (root included)
}

# Retained rows at other addresses, read at the first-level candidates (lists of length topk).
ROW_COLUMNS = {
    "cache_logp": "float32",  # token-keyed cache row, log-probabilities (NaN absent)
    "same_token_logp": "float32",  # same-token row (NaN absent)
    "preceding_logp": "float32",  # preceding row, continuation entry zeroed (NaN absent)
}
ROW_SCALARS = {
    "cache_age": "int32",  # rounds since the cache row was stored, -1 absent
    "prev_tree_root_token_count": "int32",  # previous verified tree's prefixes ending in root token
}

# Diagnostics of retained rows against this round's root row (NaN when absent).
DIAGNOSTIC_COLUMNS = {
    "matched_tv": "float32",  # full-address cache row vs root row
    "matched_argmax_agree": "float32",
    "token_tv": "float32",  # token-keyed cache row vs root row
    "token_argmax_agree": "float32",
}

ROUNDS_COLUMNS = (
    ROUND_KEYS
    + list(POOL_COLUMNS)
    + list(ROOT_COLUMNS)
    + list(OUTCOME_COLUMNS)
    + list(ROW_COLUMNS)
    + list(ROW_SCALARS)
    + list(DIAGNOSTIC_COLUMNS)
)

# One row per (round, first-level candidate).
FEATURE_KEYS = ["prompt_id", "task", "round", "cand"]  # cand: pool index 0..topk-1
LABEL_COLUMN = "label"
FOLD_COLUMN = "fold"


class SchemaError(ValueError):
    """A table lacks columns or has inconsistent shapes."""


def require_columns(columns, required, table: str) -> None:
    """Raise a one-line SchemaError naming the missing columns of ``table``."""
    missing = [c for c in required if c not in set(columns)]
    if missing:
        raise SchemaError(f"{table}: missing columns {', '.join(missing)}")
