"""Loading a target (a local Hugging Face directory, a GGUF file, a hub id or a named target) as a ``Target``, or
its tokenizer alone; and a causal LM with its tokenizer from a local directory, which standalone drafters load
the same way."""

from __future__ import annotations

from pathlib import Path

import torch

from specrank.decode.core import ModelLoadError, parse_device
from specrank.decode.loading.named_targets import DEFAULT_TARGET, prompt_tokenizer
from specrank.decode.loading.target_passes import Target
from specrank.decode.loading.target_spec import resolve_target
from specrank.decode.loading.weight_files import check_bin_weights
from specrank.errors import first_line

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # EAGLE trains in fp16


def parse_dtype(dtype) -> torch.dtype:
    """``float32`` / ``bfloat16`` / ``float16`` (names or torch dtypes)."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise ModelLoadError(f"unsupported dtype {dtype!r} (use {', '.join(DTYPES)})")


def target_tokenizer(spec):
    """The target's tokenizer alone (text lengths are checked with it before the model loads)."""
    from transformers import AutoTokenizer

    path = resolve_target(spec)
    try:
        return prompt_tokenizer(AutoTokenizer.from_pretrained(path), spec)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot load the tokenizer: {first_line(exc)}") from None


def attention_implementation(path: Path) -> str:
    """``sdpa`` where the model class supports it, else ``eager`` (Gemma 2: sdpa has no attention-logit
    softcapping, so transformers refuses it). Both read the decoder's additive masks."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(path))]
    except (KeyError, OSError, ValueError):  # an unknown architecture: from_pretrained says why in its own words
        return "sdpa"
    return "sdpa" if getattr(model_class, "_supports_sdpa", True) else "eager"


def load_causal_lm(path: Path, device, dtype):
    """A Hugging Face causal LM and its tokenizer from a local directory, in eval mode, sdpa attention where the
    model supports it (``attention_implementation``)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_bin_weights(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                     attn_implementation=attention_implementation(path))
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, SafetensorError) as exc:  # damaged weights, tokenizer or config files
        raise ModelLoadError(f"{path}: cannot load the model: {first_line(exc)}") from None
    return model.to(device).eval().requires_grad_(False), tokenizer


def load_target_tokenizer(spec=DEFAULT_TARGET):
    """(tokenizer, context length or None) of a target without loading its weights: prompt lengths are checked
    before any model loads."""
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_target(spec)
    try:
        tokenizer = prompt_tokenizer(AutoTokenizer.from_pretrained(path), spec)
        context = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot load the tokenizer: {first_line(exc)}") from None
    return tokenizer, int(context) if context else None


def load_target(spec=DEFAULT_TARGET, device="cpu", dtype="float32", graphs: bool | None = None) -> Target:
    """Load a target from a local HF directory, a ``.gguf`` file, a hub id ``ORG/NAME[@REVISION]`` or a name
    (``NAMED_TARGETS``: ``"smollm2"``, the default, or ``"gemma3-270m"``). ``graphs``: capture its passes as CUDA graphs (default: on a CUDA device)."""
    dev, dt = parse_device(device), parse_dtype(dtype)
    path = resolve_target(spec)
    model, tokenizer = load_causal_lm(path, dev, dt)
    return Target(model, prompt_tokenizer(tokenizer, spec), path=path, name=str(spec), graphs=graphs)
