"""Retained-row features (docs/design.md, features: rows): rows at other addresses read at the first level.

Per source of ``ROW_SOURCES``: ``log r(x)`` (NaN absent) and ``log r(x) - max_{y in L1} log r(y)`` (the max
skips NaN); ``cache_age`` and ``prev_tree_root_token_count``, negative (absent) read as NaN. Computed by
``featurize.block``.
"""

ROW_SOURCES = ("cache", "same_token", "preceding")
ROW_FEATURES = [f"{s}_{k}" for s in ROW_SOURCES for k in ("logp", "gap")] + ["cache_age", "prev_tree_root_token_count"]
