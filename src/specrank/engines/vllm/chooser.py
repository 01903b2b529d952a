"""The plugin's work without vLLM: choose the first token of each request's EAGLE-3 chain with a specrank reranker,
and keep each request's retained target rows from its verify passes, all on the engine's device
(``engines.device``): a step adds no host read to the engine's.

Features are the offline featurizer's (``featurize.kernel``) computed in torch from the head's row at the first
draft step and the request's rows (``engines.device.rows``), equal to ``featurize_rounds`` on the same rounds
as an engine sees them (``featurize.engine``: its prefill keeps no prompt rows, the task is unknown;
``tests/test_engine_vllm_plugin.py``).
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch

from specrank.engines.device.first_token import DeviceReranker, FirstStepInputs, HostReranker
from specrank.engines.device.rows import DeviceRows
from specrank.law import Law


class ChooserError(ValueError):
    """A reranker the chooser cannot serve at this law or shape; the message names it."""


class ChainChooser:
    """A first-step reranker (``featurize.sets.FIRST_STEP``) choosing each chain's first token among the head's
    top ``topk`` (the reranker's), with the retained rows of the ``requests`` most recent requests, ``rows``
    token-keyed rows each (``DeviceRows``), on ``device``. The trees score on the device (``DeviceReranker``), or
    on the CPU through the decoder's round kernel (``HostReranker``; ``host`` None: on a CPU device).
    ``seconds`` collects each call's wall time."""

    def __init__(self, reranker, vocab_size: int, temperature: float = 0.0, device="cpu", requests: int = 16,
                 rows: int = 64, source: str = "", host: bool | None = None):
        law = Law(temperature)
        if reranker.label_kind_ != law.label_kind:
            raise ChooserError(f"reranker {source}: trained on {reranker.label_kind_} labels, the plugin runs at"
                               f" temperature {temperature:g} ({law.label_kind})")
        self.source, self.topk = source, int(reranker.topk_)
        host = torch.device(device).type == "cpu" if host is None else host
        self.scorer = HostReranker(reranker) if host else DeviceReranker(reranker, vocab_size, device)
        self.rows = DeviceRows(requests, rows, vocab_size, temperature, device, host=host)
        self.slots: OrderedDict[str, int] = OrderedDict()  # request id -> slot, least recently used first
        self.seconds: list[float] = []  # a choice's, then a verify pass's (its rows and their retention)
        self.last_ids, self.last_slots, self.rows_seconds = None, None, 0.0

    def slots_of(self, request_ids) -> torch.Tensor:
        """(b,) each request's slot; a request seen for the first time takes a free slot or the least recently
        used one, emptied. A step's choice and its verify pass name the same requests: their slots are made once."""
        ids = tuple(request_ids)
        if ids == self.last_ids:
            return self.last_slots
        out, fresh = [], []
        for rid in ids:
            slot = self.slots.pop(rid, None)
            if slot is None:
                used = set(self.slots.values())
                free = [s for s in range(self.rows.requests) if s not in used]
                slot = free[0] if free else self.slots.pop(next(iter(self.slots)))
                fresh.append(slot)
            self.slots[rid] = slot
            out.append(slot)
        if len(set(out)) < len(out):
            raise ChooserError(f"a step of {len(out)} requests; the plugin holds rows for {self.rows.requests}"
                               " (SPECRANK_VLLM_REQUESTS must be at least the engine's max_num_seqs)")
        slots = torch.tensor(out, dtype=torch.int64, device=self.rows.store.device)
        if fresh:
            self.rows.reset(torch.tensor(fresh, dtype=torch.int64, device=self.rows.store.device))
        self.last_ids, self.last_slots = ids, slots
        return slots

    def inputs(self, request_ids, logits: torch.Tensor, root: torch.Tensor, prompt_len, position) -> FirstStepInputs:
        """The first step's features inputs: ``logits`` (b, V) the head's row at the root (target vocabulary,
        -inf outside the head's), ``root`` (b,) int64, ``prompt_len`` / ``position`` (b,) numbers or tensors (tokens
        of the prompt, tokens emitted with the root)."""
        slot = self.slots_of(request_ids)
        logp, token = torch.log_softmax(logits.float(), dim=-1).topk(self.topk, dim=-1)  # (b, K), best first
        values, age, count = self.rows.read(slot, root, token)
        host = lambda v: torch.as_tensor(v, dtype=torch.float64, device=logits.device)  # noqa: E731 (host or device)
        return FirstStepInputs(logp.exp(), token, root, host(prompt_len), host(position),
                               self.rows.prev_accepted(slot), values, age, count)

    def choose(self, request_ids, logits: torch.Tensor, root: torch.Tensor, prompt_len, position) -> torch.Tensor:
        """(b,) int64 each request's first draft token."""
        start = time.perf_counter()
        x = self.inputs(request_ids, logits, root, prompt_len, position)
        pick = self.scorer.choose(x)
        out = torch.gather(x.token, 1, pick[:, None])[:, 0]
        self.seconds.append(time.perf_counter() - start)
        return out

    def log_probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """(b, k + 1, V) a verify pass's logits -> the rows ``retain`` keeps, taken before the engine's sampler
        (which may scale its logits in place)."""
        start = time.perf_counter()
        out = self.rows.log_probabilities(logits)
        self.rows_seconds = time.perf_counter() - start  # counted with the retention that follows
        return out

    def retain(self, request_ids, logp: torch.Tensor, tokens: torch.Tensor, accepted: torch.Tensor,
               continuation: torch.Tensor) -> None:
        """After a verify pass (``DeviceRows.update``): ``logp`` (b, k + 1, V) ``log_probabilities`` of the target's
        logits at the root and the chain, ``tokens`` (b, k + 1) root first, ``accepted`` (b,), ``continuation``
        (b,)."""
        start = time.perf_counter()
        self.rows.update(self.slots_of(request_ids), logp, tokens.long(), accepted.long(), continuation.long())
        self.seconds.append(time.perf_counter() - start + self.rows_seconds)
        self.rows_seconds = 0.0
