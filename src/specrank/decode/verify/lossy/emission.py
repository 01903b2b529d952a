"""Exact per-position emission diagnostics recorded by the lossy decoders (lossy verification, arXiv 2607.26627, §3,
App. G.3-G.4).

At every emitted position the decoder knows the law its rule emitted from there (the one-position
induced law under chain decoding, the tree form's emission law at a reached row under tree
decoding); these helpers compare that law with the target row and, for truncation rules, with the
matched truncated target ``p_A``.
"""

from __future__ import annotations

import numpy as np
import torch

from specrank.decode.verify.lossy.diagnostics import kl_divergence, total_variation
from specrank.law import Law

# Columns of ``diagnostics/*.parquet``: one row per emitted token (position of a round).
DIAGNOSTIC_KEYS = {"prompt_id": "string", "task": "string", "round": "int32", "position": "int32", "step": "int16"}
DIAGNOSTIC_VALUES = {
    "token": "int32",  # the emitted token
    "accepted": "bool",  # an accepted draft token (False: the round's continuation)
    "acceptance": "float64",  # exact Pr(some draft accepted | position reached); NaN past the drafts
    "tv": "float64",  # TV(emission law, target row)
    "kl": "float64",  # KL(emission law || target row), nats
    "tv_truncated": "float64",  # TV(emission law, p_A); NaN without a truncated target
    "kl_truncated": "float64",
    "ceiling_excess": "float64",  # max_x emission(x) - p(x)/l for lenience (<= 0 when capped); NaN otherwise
    "round_accepted": "int16",  # A of the round
    "expected_accepted": "float64",  # exact E[A] of the round given its rows (tree decoder); NaN for chains
    "prompt_seconds": "float64",  # wall time of the whole prompt (repeated on its rows)
}
DIAGNOSTIC_COLUMNS = list(DIAGNOSTIC_KEYS) + list(DIAGNOSTIC_VALUES)


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Float64 target rows (n, V) at ``temperature``; the argmax point mass under greedy decoding."""
    if Law(temperature).greedy:
        return torch.zeros(logits.shape, dtype=torch.float64).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(logits.double() / temperature, dim=-1)


def emission_diagnostics(emission: torch.Tensor, p: torch.Tensor, truncated: torch.Tensor | None,
                         ell: float | None = None) -> dict[str, np.ndarray]:
    """TV / KL of emission rows (k, V) from target rows ``p`` and truncated rows (or None), each (k,)."""
    nan = np.full(len(emission), np.nan)
    out = {"tv": total_variation(emission, p).numpy(), "kl": kl_divergence(emission, p).numpy(),
           "tv_truncated": nan, "kl_truncated": nan, "ceiling_excess": nan}
    if truncated is not None:
        out["tv_truncated"] = total_variation(emission, truncated).numpy()
        out["kl_truncated"] = kl_divergence(emission, truncated).numpy()
    if ell is not None:
        out["ceiling_excess"] = (emission - p / ell).amax(-1).numpy()
    return out
