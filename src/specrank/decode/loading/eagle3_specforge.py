"""EAGLE-3 heads as SpecForge writes them and SGLang reads them (``LlamaForCausalLMEagle3`` or an ``eagle_config``):
SGLang's two readings of the layer ids, SpecForge's two meanings of ``norm_output``, and the config fields their
code implements (SGLang ``models/llama_eagle3.py``, SpecForge ``modeling/draft/llama3_eagle.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from specrank.decode.core import ModelLoadError
from specrank.decode.loading.eagle3_config_fields import (
    INERT,
    SHAPE,
    check_known_fields,
    check_lm_head,
    check_no_layer_bias,
    llama_shape_fields,
    read_flag,
    refuse_field,
)

# How SGLang reads ``eagle_aux_hidden_state_layer_ids`` (``models/llama.py`` ``set_eagle3_layers_to_capture``):
# ``legacy`` adds 1 to every id (SpecForge's meaning, output of layer k); ``current`` (since SGLang PR #25454)
# keeps the +1 only when the first id is 1 and otherwise reads the ids as ``hidden_states`` indices.
SGLANG_CONVENTIONS = ("current", "legacy")
# In ``eagle_config``, written by specrank when the two conventions read the ids apart.
CONVENTION_KEY = "layer_id_convention"


def sglang_ids_to_layers(ids, convention: str = "legacy") -> tuple[int, ...]:
    """SGLang ids -> ``hidden_states`` indices under ``convention`` (SpecForge's own files: ``legacy``)."""
    if convention == "current" and int(ids[0]) != 1:
        return tuple(int(k) for k in ids)
    return tuple(int(k) + 1 for k in ids)


def conventions_agree(ids) -> bool:
    """Whether SGLang before and after PR #25454 read ``ids`` as the same layers (the first id is 1)."""
    return int(ids[0]) == 1


def layers_to_sglang_ids(layers, convention: str = "legacy") -> list[int] | None:
    """``hidden_states`` indices -> ids that SGLang's ``convention`` reads as them, the ids both conventions read
    alike whenever such ids exist; None when ``convention`` cannot name ``layers`` (legacy: index 0; current:
    a first index of 1, which it always shifts)."""
    legacy = [int(i) - 1 for i in layers]
    if conventions_agree(legacy) or convention == "legacy":
        return legacy if min(legacy) >= 0 else None
    return [int(i) for i in layers] if int(layers[0]) != 1 else None


# What SpecForge's ``norm_output`` means (``modeling/draft/llama3_eagle.py``): up to a6b6b023 it chose whether
# the lm head reads the normed output (default true), the raw output being fed back either way; since PR #879
# the lm head always reads the normed output and ``norm_output`` (default false) feeds the normed one back
# (EAGLE 3.1), as SGLang's ``llama_eagle3.py`` reads it. A file without the field drafts alike under both.
NORM_OUTPUT_CONVENTIONS = ("after-pr879", "before-pr879")


def specforge_norm_output(cfg: dict, convention: str | None, notes: list) -> dict:
    """``logits_from_norm`` and ``feedback_post_norm`` of a SpecForge/SGLang config under ``convention`` (None:
    the current SpecForge's, said in a note when the file's ``norm_output`` makes the two differ)."""
    if "norm_output" not in cfg:
        return {"logits_from_norm": True, "feedback_post_norm": False}
    value = read_flag(cfg, "norm_output")
    if convention is None:
        convention = NORM_OUTPUT_CONVENTIONS[0]
        notes.append(f"norm_output {str(value).lower()} read as SpecForge after PR #879 "
                     "(--specforge-norm-output before-pr879 for heads trained before it)")
    if convention == "after-pr879":
        return {"logits_from_norm": True, "feedback_post_norm": value}
    return {"logits_from_norm": value, "feedback_post_norm": False}


def read_sglang_config(cfg: dict, state: dict, notes: list,
                       norm_convention: str | None = None) -> tuple[dict, tuple | None]:
    flags = ("eagle_config", "bias", "fc_norm", "norm_output", "norm_before_fc", "norm_before_residual")
    check_known_fields(cfg, SHAPE + INERT + flags, "SpecForge/SGLang")
    eagle = cfg.get("eagle_config") or {}
    check_known_fields(eagle, ("eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state", CONVENTION_KEY),
                       "eagle_config of the SGLang")
    if eagle.get(CONVENTION_KEY, "legacy") not in SGLANG_CONVENTIONS:
        refuse_field(CONVENTION_KEY, f"{eagle[CONVENTION_KEY]!r} (expected {' or '.join(SGLANG_CONVENTIONS)})")
    if eagle.get("use_aux_hidden_state") is False:
        refuse_field("use_aux_hidden_state", "false: heads without fused target states are not EAGLE-3")
    if read_flag(cfg, "norm_before_residual"):  # read by vLLM, not by SGLang llama_eagle3.py nor SpecForge
        refuse_field("norm_before_residual", "SGLang and SpecForge ignore it and vLLM applies it: "
                                             "convert the head to the speculators layout to say which")
    check_no_layer_bias(cfg, "SGLang's llama_eagle3.py")
    out = llama_shape_fields(cfg, stacked=True, layout="sglang")
    if out.get("num_hidden_layers", 1) > 1:  # SGLang llama_eagle3.py (03d5a777) LlamaModel.additional_layers
        out["layer_stacking"] = "sglang"
        if read_flag(cfg, "bias"):  # SGLang llama.py LlamaDecoderLayer: attention bias = attention_bias or bias
            refuse_field("bias", "true with several draft layers: SGLang then gives the additional layers' "
                                 "attention biases, which specrank does not build")
    # SGLang llama_eagle3.py: fc bias = config.bias, lm_head = embed_tokens when tied; SpecForge
    # llama3_eagle.py: fc_norm (one norm per state), norm_output (see NORM_OUTPUT_CONVENTIONS).
    out.update(fc_bias=read_flag(cfg, "bias"), fc_norm=read_flag(cfg, "fc_norm"),
               norm_before_fc=read_flag(cfg, "norm_before_fc"),
               tie_word_embeddings=read_flag(cfg, "tie_word_embeddings"),
               **specforge_norm_output(cfg, norm_convention, notes))
    if out["fc_bias"] != ("fc.bias" in state):
        refuse_field("bias", f"{out['fc_bias']} but the weights {'have' if 'fc.bias' in state else 'lack'} fc.bias "
                             "(SGLang would drop or miss it)")
    check_lm_head(out, state)
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    return out, tuple(ids) if ids else None


def check_trained_layers(directory: Path, ids, convention: str) -> None:
    """Refuse a config whose layer ids do not read as the ``hidden_states`` indices that the ``training.json``
    beside it says the head was trained on (``gen_layers``): drafting from other layers than it learned would run,
    and draft badly."""
    path = directory / "training.json"
    if ids is None or not path.is_file():
        return
    trained = json.loads(path.read_text()).get("params", {}).get("gen_layers")
    if trained is not None and tuple(int(i) for i in trained) != sglang_ids_to_layers(ids, convention):
        raise ModelLoadError(f"EAGLE-3 config layer ids {list(ids)} disagree with training.json gen_layers "
                             f"{list(trained)} (a head saved in another layout: re-export it with specrank drafter "
                             "export)")
