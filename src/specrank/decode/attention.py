"""Which attention mask each layer of a model reads: the tree mask, cut to a sliding window where a layer has one.

The decoder hands a model one additive tree mask (n, keys): each new token sees the committed context and its own
ancestors in the tree. A sliding-window layer (Mistral, Phi-3, Qwen2 with ``use_sliding_window``, Gemma 2 and 3's
local layers) must further hide every key ``window`` or more positions before the query: Hugging Face's own
mask, ``masking_utils.sliding_window_overlay``, keeps key ``k`` for query ``q`` when ``k > q - window``, with
``k`` and ``q`` cache indices. In plain decoding a cache index is a position; in a tree it is not (siblings
share a position, and a round's drafted levels sit after one another in the cache), so the window is applied to
*positions*: the cache keeps the position of every slot (``kv_cache.KVStore.positions``).

A model whose layers all read one kind of mask gets one tensor (its own mask code passes a 4-D mask through
as it is); a model with both kinds gets ``{layer type: mask}``, the mapping the Gemma and Qwen model classes
accept in place of building their own. An attention pattern the decoder cannot build (chunked, bidirectional,
linear or other layer types) is refused when the model loads, in one line naming it.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch

from specrank.decode.core import ModelLoadError

FULL, SLIDING = "full_attention", "sliding_attention"


class UnsupportedAttentionError(ModelLoadError):
    """A model's attention pattern is one the decoder cannot mask exactly."""


@dataclass(frozen=True)
class AttentionLayout:
    """``window``: keys a sliding-window layer sees (itself included), None when no layer slides; ``mapping``:
    layers of both kinds, so masks go as ``{layer type: mask}``."""

    window: int | None = None
    mapping: bool = False

    def masks(self, mask: torch.Tensor, cache, positions: torch.Tensor):
        """The ``attention_mask`` a forward takes for additive ``mask`` (1, 1, n, keys) over ``cache``'s first
        ``keys`` slots, whose new tokens sit at ``positions`` (n,): device ops only (a captured pass holds them)."""
        if self.window is None:
            return mask
        keys = cache.place(positions)[: mask.shape[-1]]  # (keys,) position of each slot
        far = positions[:, None] - keys[None, :] >= self.window  # (n, keys)
        windowed = mask.masked_fill(far, torch.finfo(mask.dtype).min)
        return {FULL: mask, SLIDING: windowed} if self.mapping else windowed


def attention_layout(model) -> AttentionLayout:
    """The layout of a Hugging Face causal LM's layers, refusing (``UnsupportedAttentionError``) what the decoder
    cannot serve exactly."""
    config = model.config
    name = type(model).__name__
    if getattr(config, "attention_chunk_size", None):
        raise UnsupportedAttentionError(f"{name}: chunked attention (attention_chunk_size="
                                        f"{config.attention_chunk_size}) is not supported by the tree decoder")
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedAttentionError(f"{name}: bidirectional attention (use_bidirectional_attention) cannot "
                                        "verify a tree causally")
    types = list(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    other = sorted(set(types) - {FULL, SLIDING})
    if other:
        raise UnsupportedAttentionError(f"{name}: layer types {', '.join(other)} are not supported by the tree "
                                        "decoder (it masks full and sliding-window attention only)")
    slides = SLIDING in types if types else window is not None
    if not slides:
        return AttentionLayout()
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise UnsupportedAttentionError(f"{name}: sliding-window layers with sliding_window={window!r} "
                                        "(a positive number of positions is needed)")
    mixed = FULL in types
    if mixed and not takes_mask_mapping(type(model.base_model)):
        raise UnsupportedAttentionError(f"{name}: layers of both full and sliding-window attention, and its "
                                        "forward takes no mask per layer type")
    return AttentionLayout(window, mixed)


@functools.cache
def takes_mask_mapping(model_class) -> bool:
    """Whether a Hugging Face base model's forward takes ``attention_mask`` as ``{layer type: mask}`` (the
    transformers idiom ``if not isinstance(causal_mask_mapping := attention_mask, dict)``)."""
    try:
        source = inspect.getsource(model_class.forward)
    except (OSError, TypeError):
        return False
    return "causal_mask_mapping" in source and "dict" in source
