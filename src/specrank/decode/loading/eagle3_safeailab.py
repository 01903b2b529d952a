"""EAGLE-3 heads as SafeAILab EAGLE writes them (``eagle/traineagle3``): a ``LlamaForCausalLM`` config whose layer
ids are not read (``eagle/model/modeling_llama_kv.py`` captures the input of layers 2, L//2, L-3), one draft layer
as ``cnets.py`` builds it, and a training checkpoint's copy of the target left out."""

from __future__ import annotations

from specrank.decode.loading.eagle3_config_fields import (
    INERT,
    SHAPE,
    check_known_fields,
    check_lm_head,
    check_no_layer_bias,
    llama_shape_fields,
)

# EAGLE's training module (``eagle/traineagle3/cnets.py`` ``Model``) holds the frozen target as
# ``target_model``; ``save_16bit_model(exclude_frozen_parameters=True)`` in ``traineagle3/main.py`` drops its
# parameters but keeps its persistent buffers (``traineagle3/modeling_llama_kv.py`` registers
# ``rotary_emb.inv_freq`` persistent). EAGLE's inference ``Model`` has no ``target_model``, and its
# ``load_state_dict(strict=False)`` (``eagle/model/ea_model.py``, cb7e0841) drops exactly these keys.
EAGLE_TARGET_PREFIX = "target_model."


def read_eagle_config(cfg: dict, state: dict, notes: list) -> tuple[dict, tuple | None]:
    # eagle/model/cnets.py Model: fc has no bias whatever ``bias`` says, and its own nn.Linear lm head
    # is loaded (strict=False), so tie_word_embeddings has no effect.
    check_known_fields(cfg, SHAPE + INERT + ("bias",), "EAGLE")
    if cfg.get("tie_word_embeddings"):
        notes.append("tie_word_embeddings ignored, as EAGLE's cnets.py loads its own lm_head")
    check_no_layer_bias(cfg, "EAGLE's cnets.py")
    out = llama_shape_fields(cfg)
    check_lm_head(out, state)
    return out, None
