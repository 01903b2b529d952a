"""vLLM's side of the plugin: the functions ``plugin.register`` wraps (vLLM 0.32.0, the release ``plugin.PINNED``
names; everything is read from vLLM's objects by attribute and handed to ``chooser.ChainChooser`` as tensors).

- ``GPUModelRunner.propose_draft_token_ids`` (``vllm/v1/worker/gpu_model_runner.py``, which the CPU runner
  inherits): the runner is noted for the draft step, its batch in ``input_batch`` order.
- ``SpecDecodeBaseProposer.propose`` (``vllm/v1/spec_decode/llm_base_proposer.py``): the step's roots
  (``next_token_ids``, the tokens the chains are drafted from) are noted.
- ``SpecDecodeBaseProposer._greedy_sample``: its first call inside ``propose`` is the chain's first draft token;
  the plugin returns the chooser's token instead of the head's argmax. The later steps draft from it as before.
- ``GPUModelRunner._sample``: after the rejection sampler, each request's target rows at the root and its chain
  (the ``k + 1`` logits rows of the request, in order) go to the chooser, with the accepted count and the token
  emitted after them (the sampled row's last token before vLLM's -1 placeholders).

Only greedy drafting is hooked (vLLM's default ``draft_sample_method``): a probabilistic draft samples its tokens
elsewhere, and the plugin then leaves them as they are.
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)
RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
PROPOSER = "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer"
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID in a rejection sampler's output row


@dataclass
class DraftStep:
    """One ``propose`` call: the runner whose batch it drafts, its roots, the tokens this step emitted per request
    (vLLM drafts from the sampled tokens before its bookkeeping counts them), whether the first token is drawn."""

    runner: object
    roots: torch.Tensor
    emitted: object
    first: bool = True


ACTIVE = True  # the hooks pass everything through while False (``plugin.set_active``)
_runner: contextvars.ContextVar = contextvars.ContextVar("specrank_vllm_runner", default=None)
_step: contextvars.ContextVar = contextvars.ContextVar("specrank_vllm_step", default=None)


def emitted_tokens(sampled) -> object:
    """(b,) tokens each request emitted this step: a sampled tensor's entries before vLLM's placeholders (on its
    device), or a list's lengths."""
    if isinstance(sampled, torch.Tensor):
        return (sampled != PLACEHOLDER).sum(dim=1).double()
    return torch.tensor([len(s) for s in sampled], dtype=torch.float64)


def batch_of(step: DraftStep, b: int) -> tuple[list[str], object, object]:
    """(request ids, prompt lengths, tokens emitted with the root) of the step's first ``b`` requests: the count
    before this step (host) plus what it emitted."""
    batch = step.runner.input_batch
    prompt = batch.num_prompt_tokens[:b]
    before = torch.as_tensor((batch.num_tokens_no_spec[:b] - prompt).astype("float64"))
    emitted = step.emitted[:b]
    return list(batch.req_ids[:b]), prompt, before.to(emitted.device) + emitted


def around_propose_draft_token_ids(original):
    def hook(self, *args, **kwargs):
        sampled = kwargs.get("sampled_token_ids", args[1] if len(args) > 1 else None)
        token = _runner.set((self, sampled))
        try:
            return original(self, *args, **kwargs)
        finally:
            _runner.reset(token)
    return hook


def around_propose(original):
    def hook(self, *args, **kwargs):
        noted = _runner.get()
        roots = kwargs.get("next_token_ids", args[4] if len(args) > 4 else None)
        ok = noted is not None and roots is not None and noted[1] is not None
        token = _step.set(DraftStep(noted[0], roots, emitted_tokens(noted[1])) if ok else None)
        try:
            return original(self, *args, **kwargs)
        finally:
            _step.reset(token)
    return hook


def around_greedy_sample(original, chooser_of):
    """``chooser_of(vocab_size, device)``: the plugin's chooser (built on first use, when the vocabulary is known)."""
    def hook(self, hidden_states):
        step = _step.get()
        if not ACTIVE or step is None or not step.first or getattr(self, "use_heterogeneous_vocab", False):
            return original(self, hidden_states)
        step.first = False
        logits = self.model.compute_logits(hidden_states)  # (b, V) target vocabulary, -inf outside the head's
        chooser = chooser_of(int(logits.shape[-1]), logits.device)
        b = logits.shape[0]
        ids, prompt, position = batch_of(step, b)
        return chooser.choose(ids, logits, step.roots[:b].long(), prompt, position)
    return hook


def around_sample(original, chooser_of):
    def hook(self, logits, spec_decode_metadata, *args, **kwargs):
        if not ACTIVE or spec_decode_metadata is None or logits is None:
            return original(self, logits, spec_decode_metadata, *args, **kwargs)
        counts = list(spec_decode_metadata.num_draft_tokens)
        k = counts[0] if counts else 0
        kept = None
        if k and all(c == k for c in counts):  # the rows' log-probabilities, before the sampler scales them in place
            chooser = chooser_of(int(logits.shape[-1]), logits.device)
            kept = chooser.log_probabilities(logits.view(len(counts), k + 1, -1))
        out = original(self, logits, spec_decode_metadata, *args, **kwargs)
        if kept is not None:
            retain(chooser, self, kept, spec_decode_metadata, out, k)
        return out
    return hook


def retain(chooser, runner, logp: torch.Tensor, metadata, out, k: int) -> None:
    """Each request's verify rows into the chooser (``ChainChooser.retain``); requests of other chain lengths in
    the same step (one finishing) are not kept that step."""
    b = len(metadata.num_draft_tokens)
    tokens = runner.input_ids.gpu[metadata.logits_indices].view(b, k + 1).long()  # root, then the chain
    sampled = out.sampled_token_ids[:b, : k + 1]
    emitted = (sampled != PLACEHOLDER).sum(dim=1)  # accepted + 1
    accepted = emitted - 1
    continuation = torch.gather(sampled, 1, accepted[:, None].clamp_min(0))[:, 0]
    chooser.retain(list(runner.input_batch.req_ids[:b]), logp, tokens, accepted, continuation)
