"""SGLang's draft tree as specrank's pool arrays: the tensors ``organize_draft_results`` receives, flattened in its
order (SGLang v0.5.18, ``python/sglang/srt/speculative/eagle_utils.py``, ``organize_draft_results``; the lists are
built by ``select_top_k_tokens`` in ``speculative/spec_utils.py``, called from ``draft_forward`` in
``speculative/eagle_worker_v2.py``).

With topk k and num_steps s, per request: ``score_list[0]`` (1, k) holds the first level's draft probabilities
(``fast_topk`` after draft-extend) and ``score_list[i]`` (k, k), i >= 1, the cumulative draft probabilities of the
k children of each of the k frontier nodes; ``token_list`` the same candidates' tokens; ``parents_list[0]`` is
``arange(-1, k)`` and ``parents_list[i]`` (k,) the flattened indices of the k candidates of step i that step i + 1
expands (the best by cumulative score, best first). Flattened, the k + (s - 1) k^2 candidates are
specrank's beam pool of ``PoolShape(k, s, k)`` in the order ``engines.sglang.beam.beam_subpool``
replays: each level after the one above it, parents before their children.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch


@dataclass(frozen=True)
class DraftTree:
    """A batch's drafted candidates in SGLang's flattened order, as numpy (host) arrays."""

    score: np.ndarray  # (b, C) float32 cumulative draft probability, the product SGLang ranks
    token: np.ndarray  # (b, C) int64
    parent: np.ndarray  # (b, C) int64 flattened index of the parent; -1: a child of the root
    depth: np.ndarray  # (C,) int64, 1 for the first level
    topk: int

    @cached_property  # read by the features and by the score: computed once a tree
    def q_edge(self) -> np.ndarray:
        """(b, C) float32 each candidate's own draft factor: its score over its parent's (SGLang keeps products)."""
        above = np.take_along_axis(self.score, np.maximum(self.parent, 0), axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(self.parent < 0, self.score, self.score / above)
        return np.nan_to_num(q, nan=0.0).astype(np.float32)

    @cached_property
    def draft_logp(self) -> np.ndarray:
        """(b, C) float32 cumulative draft log-probability."""
        with np.errstate(divide="ignore"):
            return np.log(self.score)


def host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy()


def draft_tree(score_list, token_list, parents_list) -> DraftTree:
    """``organize_draft_results``' inputs (lists of tensors, one entry per draft step) as a ``DraftTree``."""
    b, k = token_list[0].shape[0], score_list[0].shape[-1]
    score = host(torch.cat([s.reshape(b, -1) for s in score_list], dim=1).float())
    token = host(torch.cat(token_list, dim=1)).astype(np.int64)
    parents = [np.full((b, k), -1, dtype=np.int64)]
    depths = [np.ones(k, dtype=np.int64)]
    for i in range(1, len(score_list)):
        frontier = host(parents_list[i - 1]).astype(np.int64)[:, -k:]  # step 1: arange(-1, k)'s last k
        parents.append(np.repeat(frontier, k, axis=1))  # child c of frontier a sits at a * k + c
        depths.append(np.full(k * k, i + 1, dtype=np.int64))
    return DraftTree(score, token, np.concatenate(parents, axis=1), np.concatenate(depths), k)
