"""Named feature sets (SPEC §5): ``base`` (draft, subtree, context, token prior) and ``rows``."""

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

FEATURE_SETS = {"base": BASE, "rows": ROWS, "draft": DRAFT}


def resolve_features(features) -> list[str]:
    """A feature-set name (``base``, ``rows``, ``draft``) or an explicit list -> list of names."""
    if isinstance(features, str):
        if features not in FEATURE_SETS:
            raise ValueError(f"unknown feature set {features!r} (choose from {', '.join(FEATURE_SETS)})")
        return list(FEATURE_SETS[features])
    return list(features)
