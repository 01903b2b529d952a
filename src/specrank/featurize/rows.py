"""Retained-row features (docs/design.md, features: rows): rows at other addresses read at the first level."""

from __future__ import annotations

import numpy as np

ROW_SOURCES = ("cache", "same_token", "preceding")
ROW_FEATURES = [f"{s}_{k}" for s in ROW_SOURCES for k in ("logp", "gap")] + ["cache_age", "prev_tree_root_token_count"]


def row_features(logp: dict[str, np.ndarray], cache_age, prev_tree_root_token_count) -> dict[str, np.ndarray]:
    """Per source: ``log r(x)`` and ``log r(x) - max_{y in L1} log r(y)``; each value (N, K).

    ``logp`` maps each source of ``ROW_SOURCES`` to its (N, K) log-probabilities (NaN absent).
    Negative ``cache_age`` / ``prev_tree_root_token_count`` mean absent and become NaN.
    """
    out = {}
    for source in ROW_SOURCES:
        lp = np.asarray(logp[source], dtype=np.float64)  # (N, K)
        out[f"{source}_logp"] = lp
        out[f"{source}_gap"] = lp - np.fmax.reduce(lp, axis=1, keepdims=True)  # fmax skips NaN
    shape = next(iter(out.values())).shape
    for name, v in (("cache_age", cache_age), ("prev_tree_root_token_count", prev_tree_root_token_count)):
        v = np.asarray(v, dtype=np.float64)
        out[name] = np.broadcast_to(np.where(v < 0, np.nan, v)[:, None], shape)
    return out
