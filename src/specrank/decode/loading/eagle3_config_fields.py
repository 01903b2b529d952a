"""The ``config.json`` fields every EAGLE-3 layout shares (the Llama shape, the inert metadata) and the checks the
layouts' readers share: a field that would change the head beyond what specrank builds is refused in one line
naming it."""

from __future__ import annotations

from specrank.decode.core import ModelLoadError

# The Llama shape of the head (read into ``eagle3_config``).
SHAPE = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
         "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act", "rope_theta", "rope_scaling",
         "rope_parameters", "attention_bias", "mlp_bias", "draft_vocab_size", "target_hidden_size", "num_hidden_layers")
# Written by transformers or the trainers, read by nobody when drafting.
INERT = ("architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "bos_token_id",
         "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "attention_dropout", "pretraining_tp",
         "_name_or_path", "max_window_layers", "use_sliding_window", "sliding_window",
         "layer_types", "tie_word_embeddings",
         # in SpecForge's own configs/*-eagle3.json (a6b6b023), read by neither SpecForge nor SGLang's
         # llama_eagle3.py (a LlamaConfig there): Qwen-MoE's decoder_sparse_step, target_model_type
         "decoder_sparse_step", "target_model_type")


def refuse_field(name: str, why: str):
    raise ModelLoadError(f"EAGLE-3 config field {name!r}: {why}")


def check_known_fields(cfg: dict, allowed, where: str) -> None:
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        refuse_field(unknown[0], f"not understood by specrank in the {where} layout (known: shape, "
                                 "flags and metadata fields only)")


ONE_LAYER = {  # why a layout's several draft layers are refused: what its engine builds for them
    "eagle": "EAGLE's cnets.py builds one midlayer",
}


def llama_shape_fields(cfg: dict, stacked: bool = False, layout: str = "eagle") -> dict:
    """The shape fields, after refusing values that change the head beyond full-attention layers (one
    unless ``stacked``: the layouts whose engine stacks more layers)."""
    n = cfg.get("num_hidden_layers", 1)
    if not isinstance(n, int) or n < 1 or (n != 1 and not stacked):
        refuse_field("num_hidden_layers", f"{n} draft layers: {ONE_LAYER[layout]} (multi-layer heads load in "
                                          "the speculators layout, vLLM PR #26164, and in SGLang's)")
    if cfg.get("use_sliding_window") or any(t != "full_attention" for t in cfg.get("layer_types") or []):
        refuse_field("use_sliding_window" if cfg.get("use_sliding_window") else "layer_types",
                     "sliding-window draft attention is not supported")
    return {k: cfg[k] for k in SHAPE if cfg.get(k) is not None}


def read_flag(cfg: dict, name: str, default: bool = False) -> bool:
    value = cfg.get(name, default)
    if not isinstance(value, bool):
        refuse_field(name, f"expected true or false, got {value!r}")
    return value


def check_no_layer_bias(cfg: dict, where: str) -> None:
    """EAGLE's cnets.py and SGLang's llama_eagle3.py build q/k/v (and the MLP) without bias."""
    for name in ("attention_bias", "mlp_bias"):
        if read_flag(cfg, name):
            refuse_field(name, f"{where} builds the draft layer without biases")


def check_lm_head(config: dict, state: dict) -> None:
    """A tied lm head is the full-vocabulary embedding; an untied one needs its weights and Vd."""
    tied, vd, v = config.get("tie_word_embeddings"), config.get("draft_vocab_size"), config.get("vocab_size")
    if tied and ("lm_head.weight" in state or vd not in (None, v)):
        refuse_field("tie_word_embeddings", "true with a draft vocabulary or its own lm_head.weight")
    if not tied and vd is None:
        refuse_field("draft_vocab_size", "missing (SGLang would take the target's lm head, EAGLE fails)")
