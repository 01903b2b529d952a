"""The cost model of tree settings, timed on the user's device with the real models: the drafter's pool for
each (topk, depth, expand), the target's verify pass for each number of tokens, and the host's share of a round.

Timed loops queue their work and synchronize once at the end (a pool's single copy to the host is part of
growing it, as in decoding), so an asynchronous device is charged for its work, not for per-step waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape, causal_mask
from specrank.decode.engine.round import start_prompt
from specrank.decode.engine.timer import Timer


def synchronize(device) -> None:
    """Wait for queued work on ``device`` (nothing to wait for on the CPU)."""
    device = torch.device(device)
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


@dataclass
class CostModel:
    """Seconds per pool (topk, depth, expand), per verify pass (tokens, root included) and of host work per round."""

    draft: dict = field(default_factory=dict)  # (topk, depth, expand[, children]) -> seconds
    verify: dict = field(default_factory=dict)  # num_draft_tokens -> seconds
    host: float = 0.0
    device: str = "cpu"
    context: int = 0  # committed tokens the timings ran at

    def round_seconds(self, setting) -> float:
        """A setting's seconds per round: its pool (``setting.draft_shape``), its verify pass, the host."""
        return self.draft[setting.draft_shape] + self.verify[setting.num_draft_tokens] + self.host

    @classmethod
    def from_rows(cls, rows) -> CostModel:
        """The model back from its ``rows()`` (a list of dicts or a DataFrame, as ``tree_config_cost.parquet``
        keeps them); device and context are not in the rows."""
        records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
        out = cls()
        for r in records:
            if r["part"] == "draft":
                children = int(r.get("children", 0) or 0)  # a fan of chains times (topk, depth, expand, 1)
                key = (int(r["topk"]), int(r["num_steps"]), int(r["expand"])) + ((children,) if children else ())
                out.draft[key] = float(r["seconds"])
            elif r["part"] == "verify":
                out.verify[int(r["num_draft_tokens"])] = float(r["seconds"])
            else:
                out.host = float(r["seconds"])
        return out

    def rows(self) -> list[dict]:
        out = [{"part": "draft", "topk": key[0], "num_steps": key[1], "expand": key[2], "num_draft_tokens": 0,
                "seconds": v} | ({"children": key[3]} if len(key) > 3 else {}) for key, v in sorted(self.draft.items())]
        out += [{"part": "verify", "topk": 0, "num_steps": 0, "expand": 0, "num_draft_tokens": n, "seconds": v}
                for n, v in sorted(self.verify.items())]
        return out + [{"part": "host", "topk": 0, "num_steps": 0, "expand": 0, "num_draft_tokens": 0,
                       "seconds": self.host}]


def _started(target, drafter, prompt_ids):
    config = DecodeConfig(PoolShape(1, 1, 1), budget=1, extra=0)
    return start_prompt(target, drafter, prompt_ids, config, "cost", Timer(), with_rows=False)


def time_drafter(target, drafter, prompt_ids, shapes, repeats: int = 5, done: Callable[[], None] | None = None) -> dict:
    """{(topk, depth, expand[, children]): mean seconds of one pool} at the prompt's context (one warm-up pool);
    ``done()`` after each pool shape."""
    state = _started(target, drafter, prompt_ids)
    out = {}
    for key in shapes:
        shape = PoolShape(*key)
        drafter.grow_pool(state.root, shape)  # warm-up: kernels, allocator
        start = time.perf_counter()
        for _ in range(repeats):
            drafter.grow_pool(state.root, shape)
        out[key] = (time.perf_counter() - start) / repeats
        if done is not None:
            done()
    return out


def time_verify(target, drafter, prompt_ids, token_counts, repeats: int = 5,
                done: Callable[[], None] | None = None) -> dict:
    """{n: seconds of one target pass over n tokens (root + tree) after the prompt, with the hidden states a
    drafter reads}; the pass's KV is dropped after each repeat; ``done()`` after each n."""
    state = _started(target, drafter, prompt_ids)
    past, dev = state.context_len, target.device
    out = {}
    for n in token_counts:
        ids = torch.full((n,), int(state.root), dtype=torch.long)
        pos = torch.arange(past, past + n)
        mask = causal_mask(n, past)  # a chain's mask: the pass's cost depends on n, not on the tree's pattern
        for i in range(repeats + 1):  # the first pass warms up
            if i == 1:
                synchronize(dev)
                start = time.perf_counter()
            logits, _ = target.forward(ids, pos, mask, state.cache, drafter.hidden_layers)
            state.cache.crop(past)
        synchronize(dev)
        out[n] = (time.perf_counter() - start) / repeats
        if done is not None:
            done()
    return out


def cost_parts(settings, widths=()) -> tuple[list, list]:
    """The pools (``setting.draft_shape``) and the verify widths the ``settings`` need, with the extra ``widths``,
    each once."""
    return sorted({s.draft_shape for s in settings}), sorted({s.num_draft_tokens for s in settings} | set(widths))


def measure_cost(target, drafter, prompt_ids, settings, repeats: int = 5, host: float = 0.0,
                 done: Callable[[], None] | None = None, widths=()) -> CostModel:
    """Time every pool and every verify width the ``settings`` need (``cost_parts``) and the extra ``widths``;
    ``done()`` after each."""
    shapes, widths = cost_parts(settings, widths)
    with torch.inference_mode():
        draft = time_drafter(target, drafter, prompt_ids, shapes, repeats, done)
        verify = time_verify(target, drafter, prompt_ids, widths, repeats, done)
    return CostModel(draft, verify, host, str(target.device), len(prompt_ids))
