"""A causal LM drafter with its own KV cache: a standalone model sharing the target's tokenizer
(and the base of the early-exit drafter).

Committed tokens are not forwarded on ``commit``: they wait and go through the drafter in
the next round's root forward, together with the new root (one forward per round saved).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from specrank.decode.attention import attention_layout
from specrank.decode.core import Drafter, ModelLoadError, RootStep, causal_mask, draft_log_probs, to_device
from specrank.decode.graphs import CapturedPasses, cached_pass
from specrank.decode.kv_cache import KVStore, StaticKVCache
from specrank.decode.loading.target_passes import cache_keyword
from specrank.decode.loading.targets import load_causal_lm
from specrank.decode.loading.weight_files import weight_files
from specrank.files import sha256_files


class TokenizerMismatchError(ModelLoadError):
    """A drafter's tokenizer differs from the target's."""


def check_same_tokenizer(target_tokenizer, drafter_tokenizer, what: str = "drafter") -> None:
    """Refuse a drafter whose vocabulary (token -> id) differs from the target's."""
    a, b = target_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
    if a != b:
        differ = len(set(a.items()) ^ set(b.items()))
        raise TokenizerMismatchError(
            f"{what} tokenizer differs from the target's ({len(b)} vs {len(a)} tokens, {differ} entries differ)"
        )


class CausalLMDrafter(Drafter):
    """Drafts with a Hugging Face causal LM over the target's vocabulary."""

    def __init__(self, model, vocab_size: int, spec: str = ""):
        self.model, self.vocab_size, self.spec = model, int(vocab_size), spec
        self.layout = attention_layout(model)
        self.store, self.passes = KVStore(), CapturedPasses()
        self.cache, self.committed = None, 0
        self.pending = torch.zeros(0, dtype=torch.long)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def start(self, prompt_ids, target_hidden=None) -> None:
        self.cache, self.committed = StaticKVCache(self.store), 0
        self.pending = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)  # host tokens

    def commit(self, tokens, target_hidden=None) -> None:
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        self.pending = torch.cat([self.pending, tokens])

    @torch.inference_mode()
    def _forward(self, ids, positions, mask, last_only: bool = False) -> torch.Tensor:
        """Logits (n, V) float32 (or (1, V) with ``last_only``), padded/cropped to the target vocabulary."""
        dev = self.device
        fn = functools.partial(self._pass, last_only=last_only)
        tensors = (to_device(ids, dev), to_device(positions, dev))
        (logits,) = cached_pass(self.cache, len(ids), dev, fn, tensors, mask, self.model.dtype,
                                self.passes if self.graphs else None, last_only)
        return logits

    def _pass(self, cache, ids, positions, mask, write, last_only: bool):
        cache.write = write
        out = self.model(
            input_ids=ids[None],
            position_ids=positions[None],
            attention_mask=self.layout.masks(mask[None, None], cache, positions),
            **{cache_keyword(): cache},
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        logits = out.logits[0].float()[:, : self.vocab_size]
        missing = self.vocab_size - logits.shape[-1]
        return (torch.nn.functional.pad(logits, (0, missing), value=float("-inf")) if missing else logits,)

    def _draft_root(self, root_token: int) -> RootStep:
        if self.cache is None:
            raise RuntimeError("drafter.start() must be called before grow_pool()")
        ids = torch.cat([self.pending, torch.tensor([root_token])])
        n, past = len(ids), self.committed
        logits = self._forward(ids, torch.arange(past, past + n), causal_mask(n, past), last_only=True)
        self.committed, self.pending = past + n - 1, self.pending[:0]
        return RootStep(draft_log_probs(logits[-1]), None, past + n, past + n - 1)

    def _draft_step(self, tokens, positions, mask, feed):
        return draft_log_probs(self._forward(tokens, positions, mask)), None

    def _rewind(self) -> None:
        self.cache.crop(self.committed)


class StandaloneDrafter(CausalLMDrafter):
    """A separate causal LM from a local directory, sharing the target's tokenizer."""

    def __init__(self, model, vocab_size: int, path, spec: str = ""):
        super().__init__(model, vocab_size, spec)
        self.path = path

    @functools.cached_property
    def source_hash(self) -> str:
        """sha256 of the drafter's weight files."""
        return sha256_files(weight_files(self.path))


def load_standalone(path, target, spec: str = "") -> StandaloneDrafter:
    """Load a standalone drafter from a local HF directory onto the target's device and dtype."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"standalone drafter: no Hugging Face model directory at {path}")
    model, tokenizer = load_causal_lm(path, target.device, target.dtype)
    check_same_tokenizer(target.tokenizer, tokenizer)
    return StandaloneDrafter(model, target.vocab_size, path, spec or f"standalone:{path}")
