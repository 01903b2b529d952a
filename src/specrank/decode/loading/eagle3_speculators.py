"""EAGLE-3 heads in the vLLM speculators layout (``Eagle3Speculator`` / ``speculators_model_type``): the top-level
flags vLLM reads, and the draft layers (Llama or Qwen3, any number of them) from ``transformer_layer_config``."""

from __future__ import annotations

from specrank.decode.loading.eagle3_config_fields import (
    INERT,
    SHAPE,
    check_known_fields,
    check_lm_head,
    llama_shape_fields,
    read_flag,
    refuse_field,
)

SPECULATORS_INERT = ("speculators_model_type", "speculators_version", "speculators_config", "embed_requires_grad",
                     "has_no_defaults_at_init", "transformer_layer_config")


def read_speculators_config(cfg: dict, state: dict, notes: list) -> tuple[dict, tuple | None]:
    flags = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "draft_vocab_size",
             "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
    check_known_fields(cfg, INERT + SPECULATORS_INERT + flags, "speculators")
    for name, value in (("speculators_model_type", cfg.get("speculators_model_type")),
                        ("speculators_config", (cfg.get("speculators_config") or {}).get("algorithm"))):
        if value != "eagle3":
            refuse_field(name, f"algorithm {value!r} is not eagle3")
    layer_cfg = dict(cfg.get("transformer_layer_config") or {})
    check_known_fields(layer_cfg, SHAPE + INERT, "speculators transformer_layer_config of the")
    if layer_cfg.get("tie_word_embeddings"):
        refuse_field("tie_word_embeddings", "vLLM's Eagle3LlamaForCausalLM has its own lm_head")
    # speculators models/eagle3/config.py validate_transformer_config: no model_type means Qwen3Config
    # (its default since speculators #620); model_definitions.py builds llama and qwen3 draft layers.
    layer_type = layer_cfg.get("model_type", "qwen3")
    if layer_type not in ("llama", "qwen3"):
        refuse_field("model_type", f"{layer_type!r} draft layers (speculators builds llama or qwen3)")
    out = {**llama_shape_fields(layer_cfg, stacked=True), "draft_layer_type": layer_type}
    out.update({k: cfg[k] for k in ("draft_vocab_size", "target_hidden_size") if cfg.get(k) is not None})
    # vllm transformers_utils/configs/speculators/algos.py update_eagle3: norm_before_residual defaults
    # to true when absent; norm_output (EAGLE 3.1) feeds the normed output to the next step.
    out.update(norm_before_residual=read_flag(cfg, "norm_before_residual", True),
               norm_before_fc=read_flag(cfg, "norm_before_fc"), fc_norm=read_flag(cfg, "fc_norm"),
               feedback_post_norm=read_flag(cfg, "norm_output"))
    if out["norm_before_fc"] and out["fc_norm"]:
        refuse_field("fc_norm", "and norm_before_fc are exclusive (speculators eagle3/config.py)")
    check_lm_head(out, state)
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    return out, tuple(ids) if ids else None
