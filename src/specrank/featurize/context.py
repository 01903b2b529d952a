"""Context features of a round (docs/design.md, features: context): task, prompt length, position, history
(computed by ``featurize.block``; ``repeats_root`` is 1 when the candidate is the root token), and the
previous round's acceptance a recorded table gives."""

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
