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
from specrank.featurize.absent import NO_ANCESTOR
from specrank.featurize.block import RoundInputs
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
    cache_age: torch.Tensor  # (b,) float64 steps since the cache row was stored (NaN: none)
    prev_count: torch.Tensor  # (b,) float64 the previous verified chain's count of the root token (NaN: unknown)


def _in_order_sum(x: torch.Tensor) -> torch.Tensor:
    """(b, K) -> (b,) summed left to right, as the offline kernel sums (a running sum: a reduction may reorder)."""
    return torch.cumsum(x, dim=1)[:, -1]


CANDIDATE = ("q", "log_q", "sib_rank", "sib_gap", "repeats_root") + tuple(
    f"{s}_{kind}" for kind in ("logp", "gap") for s in ROW_SOURCES)  # a value per candidate
REQUEST = ("sib_top_q", "sib_sum_q", "sib_entropy", "prompt_len", "position", "prev_accepted", "cache_age",
           "prev_tree_root_token_count")  # a value per request, the same for its K candidates
NAMES = CANDIDATE + REQUEST


def feature_block(x: FirstStepInputs) -> torch.Tensor:
    """(b, K, len(NAMES)) float64: each ``FIRST_STEP`` feature but the token prior and the task, in ``NAMES``'
    order, computed for the whole batch at once (a short, fixed list of operations)."""
    q = x.q.double()
    b, k = q.shape
    top, total = q[:, 0], _in_order_sum(q)  # best first: the top is the first; a softmax's top K sum above 0
    share = q / total[:, None]
    entropy = -_in_order_sum(torch.special.xlogy(share, share))  # 0 log 0 = 0
    rank = torch.arange(k, device=q.device, dtype=torch.float64).expand(b, k)  # best first, ties in pool order
    logp = x.rows.double()  # (b, 3, K)
    best = torch.nan_to_num(logp, nan=-math.inf).amax(dim=2, keepdim=True)  # a NaN's gap stays NaN
    per_candidate = torch.cat([torch.stack([q, torch.log(q), rank, top[:, None] - q, x.token == x.root[:, None]],
                                           dim=2), logp.transpose(1, 2), (logp - best).transpose(1, 2)], dim=2)
    per_request = torch.stack([top, total, entropy, x.prompt_len, x.position, x.prev_accepted, x.cache_age,
                               x.prev_count], dim=1)  # (b, 8)
    return torch.cat([per_candidate, per_request[:, None, :].expand(b, k, -1)], dim=2)


def first_step_features(x: FirstStepInputs) -> dict[str, torch.Tensor]:
    """Each ``FIRST_STEP`` feature but the token prior and the task: name -> (b, K) float64."""
    block = feature_block(x)
    return {name: block[:, :, i] for i, name in enumerate(NAMES)}


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
        if "task" in features:  # an engine's task is always unknown: its tests are decided once, here
            self.forest = self.forest.fold(features.index("task"), float(reranker.task_code(UNKNOWN_TASK)))
        columns = NAMES + (PRIOR_FEATURE,)
        # the folded task column reads any column: no node tests it
        self.order = torch.tensor([columns.index(f) if f != "task" else 0 for f in features], device=device)

    def matrix(self, x: FirstStepInputs) -> torch.Tensor:
        """(b * K, F) float64 rows in the reranker's feature order (the task's column: any value)."""
        block = torch.cat([feature_block(x), self.prior[x.token][:, :, None]], dim=2)
        return block.index_select(2, self.order).reshape(-1, len(self.order))

    def probabilities(self, x: FirstStepInputs) -> torch.Tensor:
        """(b, K) the reranker's first factors (a LambdaRank reranker's: ordering scores in [0, 1])."""
        return torch.sigmoid(self.forest.margins(self.matrix(x)).view(x.q.shape))

    def choose(self, x: FirstStepInputs) -> torch.Tensor:
        """(b,) int64 the column of each request's first token: the first factors' argmax (ties: the head's
        order)."""
        return torch.argmax(self.probabilities(x), dim=1)


class HostReranker:
    """``DeviceReranker``'s choice on the CPU, through the decoder's own round kernel
    (``rerankers.compiled.CompiledTrees``: the offline features kernel and the trees in one numba call a request).
    Inside an engine a tensor operation costs some 10 µs from caches the forward pass evicted, and the device path
    is some 40 of them; this is one call. It reads the inputs in place (CPU tensors are host memory: nothing
    waits)."""

    def __init__(self, reranker):
        from specrank.rerankers.compiled import compiled  # numba, compiled or loaded from its cache once, here

        features = list(getattr(reranker, "features_", []))
        unknown = [f for f in features if f not in FIRST_STEP]
        if unknown:
            raise DeviceRerankerError(f"the reranker reads {unknown[0]!r}, which a chain engine does not know at its"
                                      f" first draft step (it reads {', '.join(FIRST_STEP)})")
        self.topk, self.predict_round = int(reranker.topk_), compiled(reranker, "quickscorer").predict_round
        if self.predict_round is None:
            raise DeviceRerankerError("the host path scores LightGBM trees through QuickScorer arrays, without"
                                      " boost_from_draft")
        k = self.topk
        self.parent, self.depth, self.row_index = np.full(k, -1, np.int64), np.ones(k, np.int64), np.arange(k)

    def probabilities(self, x: FirstStepInputs) -> np.ndarray:
        """(b, K) the reranker's first factors, request by request."""
        # the types the decoder's rounds compiled the kernel for (no copy when they are): no compile mid-decode
        q, rows = (np.ascontiguousarray(t.numpy(), dtype=np.float32) for t in (x.q, x.rows))
        token, root = np.ascontiguousarray(x.token.numpy(), dtype=np.int64), x.root.numpy()
        log_q = np.log(q)
        context = [t.numpy() for t in (x.prompt_len, x.position, x.prev_accepted, x.cache_age, x.prev_count)]
        out = np.empty(q.shape)
        for i in range(q.shape[0]):
            prompt_len, position, prev_accepted, age, count = (float(c[i]) for c in context)
            out[i] = self.predict_round(RoundInputs(
                token[i], self.parent, self.depth, q[i], log_q[i], self.topk, int(root[i]), prompt_len, position,
                prev_accepted, rows[i], self.row_index, True, age if age >= 0 else -1.0,
                count if count >= 0 else -1.0, NO_ANCESTOR), UNKNOWN_TASK)
        return out

    def choose(self, x: FirstStepInputs) -> torch.Tensor:
        """(b,) int64 the column of each request's first token (ties: the head's order)."""
        return torch.from_numpy(self.probabilities(x).argmax(axis=1))
