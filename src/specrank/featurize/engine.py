"""The features a serving engine's plugin computes, read from a recording of specrank's own decoder.

specrank's decoder seeds its token-keyed row cache with the prompt's prefill rows; an engine's prefill returns the
last position's row only, so a plugin's cache holds only the rows of its own verify passes. A recorded round whose
cache row came from the prompt (stored at round -1, so ``cache_age == round + 1``) has no cache row in the engine;
every later store of that token overwrites the prompt's row, so no other round differs. The engine does not know a
request's task either: the plugin reads it as a task unseen in training (missing).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

CACHE_COLUMNS = ("cache_logp", "cache_gap", "cache_age")  # the token-keyed row's features
UNKNOWN_TASK = ""  # a task no reranker was trained on: its code is missing


def prompt_row_rounds(features: pd.DataFrame) -> np.ndarray:
    """(n,) bool: the feature rows whose token-keyed cache row is the prompt's (stored before round 0)."""
    age = features["cache_age"].to_numpy(dtype=np.float64)
    return age == features["round"].to_numpy(dtype=np.float64) + 1.0


def engine_visible(features: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``features`` (``featurize_rounds``) as an engine plugin computes them: the prompt's cache rows
    absent (NaN) and the task unknown. Tables without row features keep their rows' columns."""
    out = features.copy()
    if "cache_age" in out:
        prompt = prompt_row_rounds(out)
        for column in CACHE_COLUMNS:
            out.loc[prompt, column] = np.nan
    if "task" in out:
        out["task"] = pd.Categorical([UNKNOWN_TASK] * len(out))
    return out
