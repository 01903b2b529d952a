"""A chain engine's first draft token chosen by a reranker, on the engine's device (docs/vllm.md).

At its first draft step a chain engine knows the head's row at the root and, from its earlier verify passes, the
retained target rows (``engines.device.rows``). ``FirstStepInputs`` holds what the features read, batched over
requests; ``first_step_features`` computes the features a ``FIRST_STEP`` reranker reads, as the offline kernel
(``featurize.kernel.fill_round``) defines them, sums in candidate order in float64; ``DeviceReranker`` scores
them with the reranker's trees (``engines.device.forest``) and picks each request's first token. Everything is
torch on the inputs' device, with fixed shapes and no host read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from specrank.engines.device.forest import forest_of
from specrank.featurize.engine import UNKNOWN_TASK
from specrank.featurize.rows import ROW_SOURCES
from specrank.featurize.sets import FIRST_STEP, PRIOR_FEATURE


class DeviceRerankerError(ValueError):
    """A reranker the device path cannot score; the message says why."""


@dataclass
class FirstStepInputs:
    """One first draft step of b requests, on one device."""

    q: torch.Tensor  # (b, K) float32 the head's top-K probabilities, best first
    token: torch.Tensor  # (b, K) int64 their tokens (target vocabulary)
    root: torch.Tensor  # (b,) int64 the token drafted from (the last emitted)
    prompt_len: torch.Tensor  # (b,) float64
    position: torch.Tensor  # (b,) float64 tokens emitted before this step
    prev_accepted: torch.Tensor  # (b,) float64 draft tokens the previous step accepted (NaN: none yet)
    rows: torch.Tensor  # (b, 3, K) float32 log r(x) of the cache, same-token and preceding rows (NaN: absent)
    cache_age: torch.Tensor  # (b,) float64 steps since the cache row was stored (-1: none)
    prev_count: torch.Tensor  # (b,) float64 the previous verified chain's count of the root token (-1: unknown)


def _in_order_sum(x: torch.Tensor) -> torch.Tensor:
    """(b, K) -> (b,) summed left to right, as the offline kernel sums (a running sum: a reduction may reorder)."""
    return torch.cumsum(x, dim=1)[:, -1]


def first_step_features(x: FirstStepInputs) -> dict[str, torch.Tensor]:
    """Each ``FIRST_STEP`` feature but the token prior and the task: name -> (b, K) float64."""
    q = x.q.double()
    b, k = q.shape
    top, total = q.max(dim=1).values, _in_order_sum(q)
    share = q / torch.where(total > 0, total, torch.ones_like(total))[:, None]
    entropy = -_in_order_sum(torch.where(share > 0, share * torch.log(share.clamp_min(1e-300)), torch.zeros_like(share)))
    j = torch.arange(k, device=q.device)
    ahead = (q[:, None, :] > q[:, :, None]) | ((q[:, None, :] == q[:, :, None]) & (j[None, :] < j[:, None])[None])
    out = {"q": q, "log_q": torch.where(q > 0, torch.log(q.clamp_min(1e-300)), torch.full_like(q, -math.inf)),
           "sib_rank": ahead.sum(dim=2).double(), "sib_top_q": top[:, None].expand(b, k),
           "sib_gap": top[:, None] - q, "sib_sum_q": total[:, None].expand(b, k),
           "sib_entropy": entropy[:, None].expand(b, k)}
    out |= {"prompt_len": x.prompt_len[:, None].expand(b, k), "position": x.position[:, None].expand(b, k),
            "prev_accepted": x.prev_accepted[:, None].expand(b, k),
            "repeats_root": (x.token == x.root[:, None]).double()}
    logp = x.rows.double()
    for s, source in enumerate(ROW_SOURCES):
        v = logp[:, s]
        best = torch.where(torch.isnan(v), torch.full_like(v, -math.inf), v).max(dim=1).values
        best = torch.where(torch.isnan(v).all(dim=1), torch.full_like(best, math.nan), best)
        out[f"{source}_logp"], out[f"{source}_gap"] = v, v - best[:, None]
    nan = torch.full_like(x.cache_age, math.nan)
    out["cache_age"] = torch.where(x.cache_age >= 0, x.cache_age, nan)[:, None].expand(b, k)
    out["prev_tree_root_token_count"] = torch.where(x.prev_count >= 0, x.prev_count, nan)[:, None].expand(b, k)
    return out


class DeviceReranker:
    """A fitted LightGBM ``GBMReranker`` (pointwise or LambdaRank) that reads only what a chain engine knows at its
    first draft step, scored on ``device``: ``probabilities(inputs)`` (b, K) and ``choose(inputs)`` (b,) the
    column of each request's first token. ``vocab_size``: the target's, for the token prior's table."""

    def __init__(self, reranker, vocab_size: int, device="cpu"):
        features = list(getattr(reranker, "features_", []))
        unknown = [f for f in features if f not in FIRST_STEP]
        if unknown:
            raise DeviceRerankerError(f"the reranker reads {unknown[0]!r}, which a chain engine does not know at its"
                                      f" first draft step (it reads {', '.join(FIRST_STEP)})")
        if getattr(reranker, "backend", None) != "lightgbm" or getattr(reranker, "boost_from_draft", False):
            raise DeviceRerankerError("the device path scores LightGBM trees without boost_from_draft")
        self.features, self.topk = features, int(reranker.topk_)
        self.forest = forest_of(reranker.model_, device)
        prior = np.full(vocab_size, np.nan)
        if PRIOR_FEATURE in features:
            p = reranker.prior_
            prior[:] = p.mean_
            inside = p.tokens_ < vocab_size
            prior[p.tokens_[inside]] = p.means_[inside]
        self.prior = torch.from_numpy(prior).to(device)
        self.task_code = float(reranker.task_code(UNKNOWN_TASK)) if "task" in features else math.nan

    def matrix(self, x: FirstStepInputs) -> torch.Tensor:
        """(b * K, F) float64 rows in the reranker's feature order."""
        named = first_step_features(x)
        named[PRIOR_FEATURE] = self.prior[x.token]
        named["task"] = torch.full_like(x.q, self.task_code, dtype=torch.float64)
        return torch.stack([named[f].reshape(-1) for f in self.features], dim=1)

    def probabilities(self, x: FirstStepInputs) -> torch.Tensor:
        """(b, K) the reranker's first factors (a LambdaRank reranker's: ordering scores in [0, 1])."""
        margin = self.forest.margins(self.matrix(x)).view(x.q.shape)
        return torch.sigmoid(margin).clamp(0.0, 1.0)

    def choose(self, x: FirstStepInputs) -> torch.Tensor:
        """(b,) int64 the column of each request's first token: the first factors' argmax (ties: the head's
        order)."""
        return torch.argmax(self.probabilities(x), dim=1)
