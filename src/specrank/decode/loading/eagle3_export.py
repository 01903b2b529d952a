"""Writing an EAGLE-3 head so that each engine's own loader reads it unchanged, layer ids in its convention.

- ``sglang``: SpecForge's export (``specforge/export/to_sglang.py``): ``LlamaForCausalLMEagle3``, the draft
  module's own names (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``, no embedding; a head of
  SGLang's several layers also ``additional_layers.*``) in ``model.safetensors``, ids in ``eagle_config`` that
  SGLang before and after its PR #25454 read as the same layers when such ids exist (index - 1, the first
  being 1), else those of the chosen convention, recorded.
- ``vllm``: the vLLM speculators layout (``speculators/convert/eagle/eagle3_converter.py``):
  ``Eagle3Speculator`` with ``transformer_layer_config``, ``layers.0.*`` and top-level
  ``eagle_aux_hidden_state_layer_ids`` as ``hidden_states`` indices (vLLM's capture convention); several draft
  layers stacked on the residual stream (``layers.0..N-1``) and Qwen3 ones (``model_type`` qwen3) only here.
- ``eagle``: SafeAILab EAGLE (``eagle/traineagle3/main.py``, ``config.json``): ``pytorch_model.bin`` and a
  ``LlamaForCausalLM`` config without ``target_hidden_size`` (``cnets.py`` would then skip the target's
  embedding); EAGLE hard-codes the layers, so only heads drafting from (2, L//2, L-3) export.

A flag the engine's code does not implement is refused with a one-line ``ExportError`` naming it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from specrank.atomic import atomic_write, write_json_atomic
from specrank.decode.loading.eagle3_formats import EAGLE3_ARCH, SPECULATOR_ARCH, HeadCheckpoint, read_head
from specrank.decode.loading.eagle3_head import FLAGS, build_head, eagle3_config
from specrank.decode.loading.eagle3_specforge import (
    CONVENTION_KEY,
    SGLANG_CONVENTIONS,
    conventions_agree,
    layers_to_sglang_ids,
)

FORMATS = ("sglang", "vllm", "eagle")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
SPECULATORS_VERSION = "0.7.0"  # the speculators release whose layout this writes
CONVENTION_NOTE = "SGLang layer ids"  # the note saying which SGLang convention an export assumes
CONVENTION_WHEN = {"current": "SGLang releases with PR #25454", "legacy": "SGLang releases before PR #25454"}

# Flags (specrank's names, their plain-EAGLE-3 value) and the engines implementing them: SGLang
# models/llama_eagle3.py (fc bias = config.bias, tied lm head); vLLM models/llama_eagle3.py +
# speculators/algos.py (norm_before_residual, norm_before_fc, fc_norm, norm_output, attention/mlp bias);
# EAGLE cnets.py (none).
FLAG_DEFAULTS = {**FLAGS, "attention_bias": False, "mlp_bias": False}
SUPPORTED = {"sglang": {"fc_bias", "tie_word_embeddings"},
             "vllm": {"norm_before_residual", "norm_before_fc", "fc_norm", "feedback_post_norm", "attention_bias",
                      "mlp_bias"},
             "eagle": set()}


class ExportError(ValueError):
    """The head cannot be written so that the chosen engine reads it as specrank does."""


def llama_fields(config: dict) -> dict:
    """The head's Llama shape, normalised through ``LlamaConfig`` (RoPE as ``rope_theta`` + ``rope_scaling``)."""
    c = eagle3_config(config)
    rope = dict(getattr(c, "rope_parameters", None) or {})
    theta = float(rope.pop("rope_theta", getattr(c, "rope_theta", 10000.0)))
    fields = {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
              "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
              "vocab_size": c.vocab_size, "hidden_act": c.hidden_act, "rope_theta": theta}
    if rope.get("rope_type", "default") != "default":
        fields["rope_scaling"] = rope
    return fields


def set_flags(config: dict) -> list[str]:
    """The flags whose value differs from plain EAGLE-3."""
    return [k for k, default in FLAG_DEFAULTS.items() if bool(config.get(k, default)) != default]


def cast(state: dict, dtype) -> dict:
    """Floating tensors in ``dtype`` (``d2t`` int64 and ``t2d`` bool stay), contiguous, on the CPU."""
    return {k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in state.items()}


def _check(ckpt: HeadCheckpoint, fmt: str) -> None:
    layers, layer_type = int(ckpt.config.get("num_hidden_layers") or 1), ckpt.config.get("draft_layer_type", "llama")
    sglang_stacked = layers > 1 and ckpt.config.get("layer_stacking") == "sglang"
    # SGLang llama_eagle3.py (03d5a777) additional_layers read the previous MLP output without the residual
    # stream, speculators' and vLLM's layers.1.. add it: the same tensors make two different networks
    if fmt == "sglang" and layers > 1 and not sglang_stacked:
        raise ExportError(f"cannot export to sglang: the head's {layers} draft layers add each layer's residual, "
                          "SGLang's llama_eagle3.py (03d5a777) stacks additional_layers that do not")
    if fmt == "vllm" and sglang_stacked:
        raise ExportError(f"cannot export to vllm: the head's {layers} draft layers are SGLang's additional_layers, "
                          "which drop the residual that vLLM's layers.1.. add")
    if fmt == "eagle" and (layers != 1 or layer_type != "llama"):  # EAGLE cnets.py
        what = f"{layers} draft layers" if layers != 1 else f"{layer_type} draft layers (q_norm, k_norm)"
        raise ExportError(f"cannot export to {fmt}: its loader builds one Llama draft layer, not the head's {what}")
    if fmt == "sglang" and layer_type != "llama":  # SGLang llama_eagle3.py
        raise ExportError(f"cannot export to {fmt}: its loader builds Llama draft layers, not the head's "
                          f"{layer_type} ones (q_norm, k_norm)")
    unsupported = [f for f in set_flags(ckpt.config) if f not in SUPPORTED[fmt]]
    if unsupported:
        raise ExportError(f"cannot export to {fmt}: its loader does not implement the head's {unsupported[0]}")


def sglang_files(ckpt: HeadCheckpoint, dtype, convention: str = "current") -> tuple[dict, dict, list[str]]:
    """``config.json`` and tensors of the SpecForge/SGLang layout, and notes on how engines read them (the
    first: which SGLang convention the layer ids assume)."""
    c, notes = ckpt.config, []
    if "embed_tokens.weight" in ckpt.state:  # sglang models/llama.py set_embed: the target's replaces it
        raise ExportError("cannot export to sglang: the head has its own embed_tokens, which SGLang replaces "
                          "with the target's")
    cfg = {"architectures": [EAGLE3_ARCH], "model_type": "llama", **llama_fields(c),
           "num_hidden_layers": int(c.get("num_hidden_layers") or 1),
           "draft_vocab_size": int(c.get("draft_vocab_size") or c["vocab_size"]),
           "tie_word_embeddings": bool(c.get("tie_word_embeddings")), "torch_dtype": DTYPE_NAMES[dtype]}
    if c.get("target_hidden_size") not in (None, c["hidden_size"]):
        cfg["target_hidden_size"] = int(c["target_hidden_size"])
    if c.get("fc_bias"):
        cfg["bias"] = True
    if ckpt.layers is not None:
        ids = layers_to_sglang_ids(ckpt.layers, convention)
        if ids is None:
            raise ExportError(f"cannot export to sglang: no layer ids make SGLang's {convention} convention read "
                              f"hidden_states {list(ckpt.layers)}"
                              + (" (try --sglang-convention legacy)" if convention == "current" else ""))
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
        if conventions_agree(ids):
            notes.append(f"{CONVENTION_NOTE}: ids {ids} read as hidden_states {list(ckpt.layers)} by SGLang before "
                         "and after PR #25454")
        else:
            cfg["eagle_config"][CONVENTION_KEY] = convention
            notes.append(f"{CONVENTION_NOTE}: ids {ids} assume SGLang's {convention} convention "
                         f"({CONVENTION_WHEN[convention]}); the other convention reads other layers")
        notes.append("vLLM (since PR #42764) reads these nested ids as hidden_states indices: use --format vllm there")
    return cfg, cast(ckpt.state, dtype), notes


def vllm_files(ckpt: HeadCheckpoint, dtype, verifier: str | None = None) -> tuple[dict, dict, list[str]]:
    """``config.json`` and tensors of the vLLM speculators layout."""
    c = ckpt.config
    layer = {"model_type": c.get("draft_layer_type", "llama"), **llama_fields(c),
             "num_hidden_layers": int(c.get("num_hidden_layers") or 1), "tie_word_embeddings": False,
             "attention_bias": bool(c.get("attention_bias")), "mlp_bias": bool(c.get("mlp_bias")),
             "torch_dtype": DTYPE_NAMES[dtype]}
    cfg = {"architectures": [SPECULATOR_ARCH], "speculators_model_type": "eagle3",
           "speculators_version": SPECULATORS_VERSION,
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "verifier": {"name_or_path": verifier or ckpt.verifier,
                                               "architectures": ["LlamaForCausalLM"]}},
           "transformer_layer_config": layer,
           "draft_vocab_size": int(c.get("draft_vocab_size") or c["vocab_size"]),
           "target_hidden_size": c.get("target_hidden_size") if c.get("target_hidden_size") != c["hidden_size"] else None,
           "norm_before_residual": bool(c.get("norm_before_residual")), "norm_before_fc": bool(c.get("norm_before_fc")),
           "fc_norm": bool(c.get("fc_norm")), "norm_output": bool(c.get("feedback_post_norm")),
           "eagle_aux_hidden_state_layer_ids": list(ckpt.layers) if ckpt.layers is not None else None,
           "torch_dtype": DTYPE_NAMES[dtype]}
    state = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in ckpt.state.items()}
    return cfg, cast(state, dtype), []


def eagle_files(ckpt: HeadCheckpoint, dtype) -> tuple[dict, dict, list[str]]:
    """``config.json`` and tensors as EAGLE's training writes them (``traineagle3/config.json``)."""
    c, fields = ckpt.config, llama_fields(ckpt.config)
    if c.get("target_hidden_size") not in (None, c["hidden_size"]):
        raise ExportError("cannot export to eagle: cnets.py sizes fc from hidden_size unless target_hidden_size "
                          "is set, and then drafts with a random embedding")
    if fields["head_dim"] * fields["num_attention_heads"] != fields["hidden_size"]:
        raise ExportError("cannot export to eagle: cnets.py derives head_dim = hidden_size / num_attention_heads")
    if ckpt.layers is not None:
        low, mid, high = ckpt.layers
        if low != 2 or mid != (high + 3) // 2:  # modeling_llama_kv.py: inputs of layers 2, L//2, L-3
            raise ExportError(f"cannot export to eagle: it drafts from hidden_states (2, L//2, L-3), not "
                              f"{list(ckpt.layers)}")
    fields.pop("head_dim")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **fields, "num_hidden_layers": 1,
           "draft_vocab_size": int(c.get("draft_vocab_size") or c["vocab_size"]), "tie_word_embeddings": False,
           "torch_dtype": DTYPE_NAMES[dtype]}
    state = dict(ckpt.state)
    if cfg["draft_vocab_size"] == cfg["vocab_size"]:  # ea_model.py deletes the maps of a full-vocabulary head
        state.pop("d2t", None), state.pop("t2d", None)
    return cfg, cast(state, dtype), []


WEIGHTS = {"sglang": "model.safetensors", "vllm": "model.safetensors", "eagle": "pytorch_model.bin"}


def export_files(ckpt: HeadCheckpoint, fmt: str, dtype="fp32", verifier=None,
                 sglang_convention="current") -> tuple[dict, dict, list[str]]:
    """``(config, tensors, notes)`` of ``ckpt`` in format ``fmt`` (sglang, vllm, eagle), ``dtype`` bf16|fp16|fp32;
    ``sglang_convention`` (current|legacy): which SGLang layer-id convention to write for, when they differ."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r} (use {', '.join(FORMATS)})")
    if dtype not in DTYPES:
        raise ExportError(f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")
    if sglang_convention not in SGLANG_CONVENTIONS:
        raise ExportError(f"unknown SGLang convention {sglang_convention!r} (use {', '.join(SGLANG_CONVENTIONS)})")
    _check(ckpt, fmt)
    if fmt == "vllm":
        return vllm_files(ckpt, DTYPES[dtype], verifier)
    if fmt == "sglang":
        return sglang_files(ckpt, DTYPES[dtype], sglang_convention)
    return eagle_files(ckpt, DTYPES[dtype])


def write_head(directory, config: dict, state: dict, weights: str) -> Path:
    """Write ``weights`` then ``config.json`` into ``directory``, each atomically; the other weight file
    name is removed so that loaders preferring it never read a stale copy."""
    from safetensors.torch import save_file

    directory = Path(directory)
    if weights.endswith(".safetensors"):
        atomic_write(directory / weights, lambda tmp: save_file(state, tmp))
    else:
        atomic_write(directory / weights, lambda tmp: torch.save(state, tmp))
    for other in set(WEIGHTS.values()) - {weights}:
        (directory / other).unlink(missing_ok=True)
    write_json_atomic(directory / "config.json", config)
    return directory


def export_head(source, out, fmt: str, dtype: str = "fp32", verifier=None, sglang_convention: str = "current",
                specforge_norm_output=None) -> tuple[Path, list[str]]:
    """Read the head in ``source`` (any dialect) and write it for ``fmt`` into the new directory ``out``,
    whole or not at all; returns ``out`` and notes on how the engines read it."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists and is not empty; export writes a new directory")
    ckpt = read_head(source, specforge_norm_output)
    with torch.device("meta"):  # the tensors must make a complete head before anything is written
        build_head(ckpt, torch.nn.Embedding(int(ckpt.config["vocab_size"]), int(ckpt.config["hidden_size"])))
    config, state, notes = export_files(ckpt, fmt, dtype, verifier, sglang_convention)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        write_head(tmp, config, state, WEIGHTS[fmt])
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out, notes
