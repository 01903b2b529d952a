"""Named feature sets (docs/design.md, features and labels): ``base`` (draft, subtree, context, token prior),
``rows`` and ``first_step`` (``rows`` without the subtree: what a chain engine knows at its first draft step)."""

from __future__ import annotations

from specrank.featurize.context import CONTEXT_FEATURES
from specrank.featurize.draft import DRAFT_FEATURES
from specrank.featurize.rows import ROW_FEATURES
from specrank.featurize.subtree import SUBTREE_FEATURES

PRIOR_FEATURE = "token_prior"  # computed by the reranker from the ``token`` column (its training half)
CATEGORICAL_FEATURES = ("task",)

# Everything known before verification without retained rows ("Base" reranker).
BASE = tuple(DRAFT_FEATURES + SUBTREE_FEATURES + CONTEXT_FEATURES + [PRIOR_FEATURE])
# Base plus the retained-row features ("Rows" reranker).
ROWS = BASE + tuple(ROW_FEATURES)
# The first draft factor alone (isotonic control).
DRAFT = ("q",)
# What a chain engine knows when it picks its first draft token: Rows without the subtree (nothing drafted below
# the first level yet).
FIRST_STEP = tuple(f for f in ROWS if f not in SUBTREE_FEATURES)

FEATURE_SETS = {"base": BASE, "rows": ROWS, "draft": DRAFT, "first_step": FIRST_STEP}

# One line per feature; x is the first-level candidate, L1 the round's first level.
DESCRIPTIONS = {
    "q": "drafter probability q(x) at the root",
    "log_q": "log q(x)",
    "sib_rank": "rank of q(x) among L1 (0 = most probable, ties by pool index)",
    "sib_top_q": "max over L1 of q",
    "sib_gap": "max over L1 of q minus q(x)",
    "sib_sum_q": "sum over L1 of q",
    "sib_entropy": "entropy (nats) of q over L1, renormalized",
    "child_max_q": "largest drafter probability among x's children in the pool (NaN: none)",
    "child_entropy": "entropy of x's children's renormalized drafter probabilities (NaN: none)",
    "subtree_size": "pool descendants of x",
    "subtree_mass": "sum of exp(cumulative draft log-prob) over x's pool descendants",
    "subtree_expanded": "nodes of x's subtree, x included, with a child in the pool",
    "task": "prompt's task (categorical; unseen in training = missing)",
    "prompt_len": "prompt length in tokens",
    "position": "tokens emitted before the round",
    "prev_accepted": "accepted draft tokens of the previous round (NaN: first round / not recorded)",
    "repeats_root": "1 if x equals the root token",
    "token_prior": "training-half mean label of x's token, shrunk to the mean (pseudo-count 20)",
    "cache_logp": "log r(x) of the token-keyed cache row (NaN: absent)",
    "cache_gap": "cache_logp minus its max over L1",
    "same_token_logp": "log r(x) of the same-token row (NaN: absent)",
    "same_token_gap": "same_token_logp minus its max over L1",
    "preceding_logp": "log r(x) of the preceding row (NaN: absent or x = continuation token)",
    "preceding_gap": "preceding_logp minus its max over L1",
    "cache_age": "rounds since the cache row was stored (NaN: absent)",
    "prev_tree_root_token_count": "previous verified tree's prefixes ending in the root token (NaN: absent)",
}


def resolve_features(features) -> list[str]:
    """A feature-set name (``base``, ``rows``, ``draft``, ``first_step``) or an explicit list -> list of names."""
    if isinstance(features, str):
        if features not in FEATURE_SETS:
            raise ValueError(f"unknown feature set {features!r} (choose from {', '.join(FEATURE_SETS)})")
        return list(FEATURE_SETS[features])
    unknown = [f for f in features if f not in DESCRIPTIONS]
    if unknown:
        raise ValueError(f"unknown feature {unknown[0]!r}")
    return list(features)


def input_columns(features) -> list[str]:
    """Columns a reranker reads from a features table (the prior is computed from ``token``)."""
    return [("token" if f == PRIOR_FEATURE else f) for f in features]
