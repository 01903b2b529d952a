"""The target as the decoder runs it (``Target``): tree passes over a Hugging Face causal LM with a static KV cache,
reading the hidden states a drafter fuses; and the keyword its forward takes that cache by."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from specrank.decode.attention import attention_layout
from specrank.decode.core import ModelLoadError, to_device
from specrank.decode.graphs import CapturedPasses, cached_pass
from specrank.decode.kv_cache import KVStore, StaticKVCache
from specrank.decode.loading.gguf_conversion import SOURCE_FILE
from specrank.decode.loading.hub import revision_of
from specrank.decode.loading.weight_files import weight_files
from specrank.files import sha256_files


class Target:
    """Tree passes over a Hugging Face causal LM with a static KV cache (``decode.kv_cache``).

    The cache holds the committed context; ``forward`` writes ``n`` new positions after it
    under a caller-built additive mask and ``commit`` keeps a subset of them.
    """

    def __init__(self, model, tokenizer, path: Path | None = None, name: str | None = None,
                 graphs: bool | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.store, self.passes = KVStore(), CapturedPasses()  # the KV buffers and the passes captured on them
        self._graphs = graphs
        self.path, self.name = path, name or (str(path) if path else type(model).__name__)
        self.revision = revision_of(path) if path else None  # the hub commit a snapshot resolved to
        config = model.config
        self.layout = attention_layout(model)  # the mask each layer reads; an unsupported pattern is refused here
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.num_layers = int(config.num_hidden_layers)
        self.hidden_size = int(config.hidden_size)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def graphs(self) -> bool:
        """Whether small passes run as captured CUDA graphs: on by default on a CUDA device, off elsewhere (set it
        to choose; on the CPU, True runs the same fixed-shape passes eagerly, which only tests use)."""
        return self.device.type == "cuda" if self._graphs is None else self._graphs

    @graphs.setter
    def graphs(self, value: bool | None) -> None:
        self._graphs = None if value is None else bool(value)

    @property
    def context_length(self) -> int | None:
        """The most positions the model was trained on (``max_position_embeddings``), None if unknown."""
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value else None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @functools.cached_property
    def source_hash(self) -> str:
        """sha256 of the weights: the GGUF's for a converted model, else of the weight files."""
        if self.path is None:
            return ""
        stamp = self.path / SOURCE_FILE
        if stamp.exists():
            return json.loads(stamp.read_text())["sha256"]
        return sha256_files(weight_files(self.path))

    def new_cache(self) -> StaticKVCache:
        """An empty KV cache for one prompt, on this model's store (one prompt at a time: see ``kv_cache``)."""
        return StaticKVCache(self.store)

    @torch.inference_mode()
    def forward(self, input_ids, position_ids, mask, cache, hidden_layers=None, logit_rows=None,
                final_normed: bool = False):
        """Score ``n`` new tokens after the cached ones; write their KV into ``cache`` (a ``new_cache()``).

        input_ids, position_ids: (n,); mask: (n, past + n) additive (0 attend, -inf not), on any device.
        Returns logits (n, V) float32 and, when ``hidden_layers`` is given, the
        concatenated hidden states (n, len(hidden_layers) * H) in float32; layer ``i``
        means the residual stream entering decoder layer ``i`` (Hugging Face ``hidden_states[i]``
        for ``i < num_layers``), and ``i = num_layers`` the last layer's output *before* the final norm,
        which is what vLLM (``models/llama.py``, PR #36063) and SGLang capture for the id at the end of the
        stack (HF's ``hidden_states[num_layers]`` is after the norm). ``final_normed`` appends the
        final normed state (n, H) after them. ``logit_rows`` (k,) (increasing row indices) runs the lm head on those
        rows only and returns their logits (k, V): a prefill computes the rows the row caches keep, or none
        (``()``, logits None).
        With ``graphs`` on, a pass of at most ``graphs.MAX_CAPTURED_ROWS`` rows runs as a CUDA graph captured
        for its shape (``decode.graphs``).
        """
        n, past = input_ids.shape[0], cache.get_seq_length()
        if position_ids.shape != (n,) or mask.shape != (n, past + n):
            raise ValueError(
                f"shapes: input_ids {tuple(input_ids.shape)}, position_ids {tuple(position_ids.shape)}, "
                f"mask {tuple(mask.shape)}; expected ({n},), ({n},), ({n}, {past + n})"
            )
        layers = tuple(hidden_layers or ())
        if any(not 0 <= i <= self.num_layers for i in layers):
            raise ValueError(f"hidden_layers {layers} outside 0..{self.num_layers}")
        dev = self.device
        ids = to_device(torch.as_tensor(input_ids, dtype=torch.long), dev)
        positions = to_device(torch.as_tensor(position_ids, dtype=torch.long), dev)
        rows = None if logit_rows is None else tuple(int(i) for i in logit_rows)  # hashable: part of a graph's key
        options = (layers, rows, final_normed)
        fn = functools.partial(self._pass, options=options)
        return cached_pass(cache, n, dev, fn, (ids, positions), mask, self.dtype,
                           self.passes if self.graphs else None, options)

    def _pass(self, cache, ids, positions, mask, write, options):
        """The model over (n,) new tokens at ``write`` under the additive ``mask`` (n, keys) -> (logits, hidden);
        nothing here waits for the device, so it can be captured."""
        layers, rows, final_normed = options
        cache.write = write
        pre_norm = []

        def keep_input(_, args):  # returns None: the norm's input is read, never replaced
            pre_norm.append(args[0])

        hook = None
        if self.num_layers in layers:  # the final norm's input: the residual stream after the last layer
            hook = self.final_norm.register_forward_pre_hook(keep_input)
        try:
            out = self.model(
                input_ids=ids[None],
                position_ids=positions[None],
                attention_mask=self.layout.masks(mask[None, None], cache, positions),
                **{cache_keyword(): cache},
                use_cache=True,
                output_hidden_states=bool(layers) or final_normed,
                logits_to_keep=keep_rows(rows, ids.device),
            )
        finally:
            if hook is not None:
                hook.remove()
        logits = None if rows == () else out.logits[0].float()  # (n, V), or (k, V) of ``logit_rows``
        states = [pre_norm[0] if i == self.num_layers else out.hidden_states[i] for i in layers]
        states += [out.hidden_states[-1]] if final_normed else []
        hidden = torch.cat([s[0] for s in states], -1).float() if states else None
        return logits, hidden

    @property
    def final_norm(self):
        """The norm between the last decoder layer and the lm head."""
        norm = getattr(self.model.base_model, "norm", None)
        if norm is None:
            raise ModelLoadError(f"{self.name}: no final norm found (model.norm), so layer {self.num_layers} "
                                 "(before the norm) cannot be read")
        return norm

    @staticmethod
    def commit(cache, past_len: int, keep) -> None:
        """Keep the first ``past_len`` cached positions plus ``keep`` (indices into the last forward's new ones)."""
        cache.gather(past_len, keep)


def keep_rows(rows: tuple | None, device):
    """Hugging Face's ``logits_to_keep`` for ``rows``: 0 (every row), 1 (the last only, for none) or the rows."""
    if rows is None:
        return 0
    return torch.tensor(rows, dtype=torch.long, device=device) if rows else 1


@functools.cache
def cache_keyword() -> str:
    """The keyword a Hugging Face model's forward takes its KV cache by: ``cache`` in the transformers releases
    that renamed it (``past_key_values`` is then a deprecated alias), ``past_key_values`` before them, whose
    forwards would swallow an unknown ``cache`` in ``**kwargs`` and run without the cache. The rename was made
    across every model and layer at once, so Llama's signature answers for all of them."""
    import inspect

    from transformers.models.llama.modeling_llama import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"
