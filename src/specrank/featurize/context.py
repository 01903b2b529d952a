"""Context features of a round (docs/design.md, features: context): task, prompt length, position, history."""

from __future__ import annotations

import numpy as np

CONTEXT_FEATURES = ["task", "prompt_len", "position", "prev_accepted", "repeats_root"]


def prompt_index(prompt_id: np.ndarray) -> np.ndarray:
    """Stable prompt number: the rank of ``prompt_id`` among the run's sorted distinct prompt ids."""
    return np.unique(prompt_id, return_inverse=True)[1].reshape(-1)


def previous_acceptance(prompt_id: np.ndarray, rnd: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """``accepted`` of round ``r - 1`` of the same prompt, NaN when that round is not in the table, (N,)."""
    pid = prompt_index(prompt_id)
    order = np.lexsort((rnd, pid))
    prev = np.full(len(rnd), np.nan)
    same = (pid[order][1:] == pid[order][:-1]) & (rnd[order][1:] == rnd[order][:-1] + 1)
    prev[order[1:][same]] = accepted[order][:-1][same]
    return prev


def context_features(token1, root_token, prompt_len, position, prev_accepted) -> dict[str, np.ndarray]:
    """Numeric context features, each (N, K); ``task`` is added as a key column by the caller."""
    shape = token1.shape
    col = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64)[:, None], shape)  # noqa: E731
    return {
        "prompt_len": col(prompt_len),
        "position": col(position),
        "prev_accepted": col(prev_accepted),
        "repeats_root": (token1 == np.asarray(root_token)[:, None]).astype(np.float64),
    }
