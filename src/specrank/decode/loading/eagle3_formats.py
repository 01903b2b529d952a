"""EAGLE-3 heads as other projects write them: which layout a directory holds, what its config fields
mean, and which target hidden states its three layer ids name.

Every layer id is translated to a Hugging Face ``hidden_states`` index (0 = the embeddings,
i = the output of layer i - 1), the convention of ``Target.forward``. Four layouts load:

- ``eagle`` (SafeAILab/EAGLE): no EAGLE-3 architecture in ``config.json`` (``traineagle3/config.json``
  says ``LlamaForCausalLM``); the ids are not read: ``eagle/model/modeling_llama_kv.py`` captures the
  input of layers 2, L//2, L-3, i.e. ``hidden_states`` (2, L//2, L-3).
- ``sglang`` (SpecForge / SGLang): ``LlamaForCausalLMEagle3`` or an ``eagle_config``; id k is the output
  of layer k, ``hidden_states[k + 1]`` (SGLang ``models/llama.py`` ``set_eagle3_layers_to_capture``
  adds 1; SpecForge ``modeling/target/eagle3_target_model.py`` reads ``hidden_states[k + 1]``), unless
  specrank's ``eagle_config.layer_id_convention`` says the ids were written for SGLang's convention since PR #25454.
  Llama draft layers: ``midlayer`` and, when ``num_hidden_layers`` N > 1, ``additional_layers.0..N-2``, each
  reading the previous layer's MLP output without its residual stream (SGLang ``models/llama_eagle3.py``).
- ``speculators`` (vLLM speculators): ``Eagle3Speculator`` / ``speculators_model_type``; id k is
  ``hidden_states[k]`` (vLLM ``models/llama.py`` captures ``hidden_states + residual`` before layer k).
  Llama or Qwen3 draft layers, any number of them.

Index L (the target's layer count) is the last layer's output before the final norm (``Target.forward``).

No ids in the config means every engine's default, ``hidden_states`` (2, L//2, L-3) (``layers`` is None).
A config field that changes the head is implemented as that project's code implements it, or refused
with a one-line ``ModelLoadError`` naming it; fields that do not change drafting are listed as inert.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specrank.decode.loading.targets import ModelLoadError, read_bin

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

EAGLE3_ARCH = "LlamaForCausalLMEagle3"  # SGLang models/llama_eagle3.py EntryClass; SpecForge's draft class
SPECULATOR_ARCH = "Eagle3Speculator"  # speculators convert/eagle/eagle3_legacy_model.py
DIALECTS = ("eagle", "sglang", "speculators")
DIALECT_NAMES = {"eagle": "SafeAILab EAGLE", "sglang": "SpecForge/SGLang", "speculators": "vLLM speculators"}

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
SPECULATORS_INERT = ("speculators_model_type", "speculators_version", "speculators_config", "embed_requires_grad",
                     "has_no_defaults_at_init", "transformer_layer_config")


@dataclass
class HeadCheckpoint:
    """A head in specrank's canonical form: ``config`` for ``eagle3_config`` (flags in specrank's names),
    ``state`` keyed as ``Eagle3Head`` names its tensors, ``layers`` as ``hidden_states`` indices."""

    dialect: str
    config: dict
    state: dict
    layers: tuple[int, ...] | None
    written_ids: tuple[int, ...] | None = None  # the ids as the config writes them
    verifier: str | None = None
    notes: list[str] = field(default_factory=list)


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low/mid/high states, ``hidden_states`` (2, L//2, L-3) (EAGLE, SGLang and vLLM alike)."""
    return (2, num_layers // 2, num_layers - 3)


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


def detect_dialect(cfg: dict) -> str:
    """The layout a ``config.json`` dict is in (``specrank-legacy`` is told apart later, by ``training.json``)."""
    arch = cfg.get("architectures") or []
    if "speculators_model_type" in cfg or SPECULATOR_ARCH in arch:
        return "speculators"
    if EAGLE3_ARCH in arch or "eagle_config" in cfg:
        return "sglang"
    if not arch or arch == ["LlamaForCausalLM"]:
        return "eagle"
    raise ModelLoadError(f"unknown EAGLE-3 layout: architectures {arch} (expected {EAGLE3_ARCH}, "
                         f"{SPECULATOR_ARCH} or EAGLE's LlamaForCausalLM)")


def _refuse(name: str, why: str):
    raise ModelLoadError(f"EAGLE-3 config field {name!r}: {why}")


def _check_known(cfg: dict, allowed, where: str) -> None:
    unknown = sorted(set(cfg) - set(allowed))
    if unknown:
        _refuse(unknown[0], f"not understood by specrank in the {where} layout (known: shape, "
                            "flags and metadata fields only)")


ONE_LAYER = {  # why a layout's several draft layers are refused: what its engine builds for them
    "eagle": "EAGLE's cnets.py builds one midlayer",
}


def _llama_part(cfg: dict, stacked: bool = False, layout: str = "eagle") -> dict:
    """The shape fields, after refusing values that change the head beyond full-attention layers (one
    unless ``stacked``: the layouts whose engine stacks more layers)."""
    n = cfg.get("num_hidden_layers", 1)
    if not isinstance(n, int) or n < 1 or (n != 1 and not stacked):
        _refuse("num_hidden_layers", f"{n} draft layers: {ONE_LAYER[layout]} (multi-layer heads load in the "
                                     "speculators layout, vLLM PR #26164, and in SGLang's)")
    if cfg.get("use_sliding_window") or any(t != "full_attention" for t in cfg.get("layer_types") or []):
        _refuse("use_sliding_window" if cfg.get("use_sliding_window") else "layer_types",
                "sliding-window draft attention is not supported")
    return {k: cfg[k] for k in SHAPE if cfg.get(k) is not None}


def _flag(cfg: dict, name: str, default: bool = False) -> bool:
    value = cfg.get(name, default)
    if not isinstance(value, bool):
        _refuse(name, f"expected true or false, got {value!r}")
    return value


def _no_layer_bias(cfg: dict, where: str) -> None:
    """EAGLE's cnets.py and SGLang's llama_eagle3.py build q/k/v (and the MLP) without bias."""
    for name in ("attention_bias", "mlp_bias"):
        if _flag(cfg, name):
            _refuse(name, f"{where} builds the draft layer without biases")


def _lm_head(config: dict, state: dict) -> None:
    """A tied lm head is the full-vocabulary embedding; an untied one needs its weights and Vd."""
    tied, vd, v = config.get("tie_word_embeddings"), config.get("draft_vocab_size"), config.get("vocab_size")
    if tied and ("lm_head.weight" in state or vd not in (None, v)):
        _refuse("tie_word_embeddings", "true with a draft vocabulary or its own lm_head.weight")
    if not tied and vd is None:
        _refuse("draft_vocab_size", "missing (SGLang would take the target's lm head, EAGLE fails)")


def _eagle(cfg: dict, state: dict, notes: list) -> tuple[dict, tuple | None]:
    # eagle/model/cnets.py Model: fc has no bias whatever ``bias`` says, and its own nn.Linear lm head
    # is loaded (strict=False), so tie_word_embeddings has no effect.
    _check_known(cfg, SHAPE + INERT + ("bias",), "EAGLE")
    if cfg.get("tie_word_embeddings"):
        notes.append("tie_word_embeddings ignored, as EAGLE's cnets.py loads its own lm_head")
    _no_layer_bias(cfg, "EAGLE's cnets.py")
    out = _llama_part(cfg)
    _lm_head(out, state)
    return out, None


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
    value = _flag(cfg, "norm_output")
    if convention is None:
        convention = NORM_OUTPUT_CONVENTIONS[0]
        notes.append(f"norm_output {str(value).lower()} read as SpecForge after PR #879 "
                     "(--specforge-norm-output before-pr879 for heads trained before it)")
    if convention == "after-pr879":
        return {"logits_from_norm": True, "feedback_post_norm": value}
    return {"logits_from_norm": value, "feedback_post_norm": False}


def _sglang(cfg: dict, state: dict, notes: list, norm_convention: str | None = None) -> tuple[dict, tuple | None]:
    flags = ("eagle_config", "bias", "fc_norm", "norm_output", "norm_before_fc", "norm_before_residual")
    _check_known(cfg, SHAPE + INERT + flags, "SpecForge/SGLang")
    eagle = cfg.get("eagle_config") or {}
    _check_known(eagle, ("eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state", CONVENTION_KEY),
                 "eagle_config of the SGLang")
    if eagle.get(CONVENTION_KEY, "legacy") not in SGLANG_CONVENTIONS:
        _refuse(CONVENTION_KEY, f"{eagle[CONVENTION_KEY]!r} (expected {' or '.join(SGLANG_CONVENTIONS)})")
    if eagle.get("use_aux_hidden_state") is False:
        _refuse("use_aux_hidden_state", "false: heads without fused target states are not EAGLE-3")
    if _flag(cfg, "norm_before_residual"):  # read by vLLM, not by SGLang llama_eagle3.py nor SpecForge
        _refuse("norm_before_residual", "SGLang and SpecForge ignore it and vLLM applies it: "
                                        "convert the head to the speculators layout to say which")
    _no_layer_bias(cfg, "SGLang's llama_eagle3.py")
    out = _llama_part(cfg, stacked=True, layout="sglang")
    if out.get("num_hidden_layers", 1) > 1:  # SGLang llama_eagle3.py (03d5a777) LlamaModel.additional_layers
        out["layer_stacking"] = "sglang"
        if _flag(cfg, "bias"):  # SGLang llama.py LlamaDecoderLayer: attention bias = attention_bias or bias
            _refuse("bias", "true with several draft layers: SGLang then gives the additional layers' attention "
                            "biases, which specrank does not build")
    # SGLang llama_eagle3.py: fc bias = config.bias, lm_head = embed_tokens when tied; SpecForge
    # llama3_eagle.py: fc_norm (one norm per state), norm_output (see NORM_OUTPUT_CONVENTIONS).
    out.update(fc_bias=_flag(cfg, "bias"), fc_norm=_flag(cfg, "fc_norm"), norm_before_fc=_flag(cfg, "norm_before_fc"),
               tie_word_embeddings=_flag(cfg, "tie_word_embeddings"), **specforge_norm_output(cfg, norm_convention, notes))
    if out["fc_bias"] != ("fc.bias" in state):
        _refuse("bias", f"{out['fc_bias']} but the weights {'have' if 'fc.bias' in state else 'lack'} fc.bias "
                        "(SGLang would drop or miss it)")
    _lm_head(out, state)
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    return out, tuple(ids) if ids else None


def _speculators(cfg: dict, state: dict, notes: list) -> tuple[dict, tuple | None]:
    flags = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "draft_vocab_size",
             "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
    _check_known(cfg, INERT + SPECULATORS_INERT + flags, "speculators")
    for name, value in (("speculators_model_type", cfg.get("speculators_model_type")),
                        ("speculators_config", (cfg.get("speculators_config") or {}).get("algorithm"))):
        if value != "eagle3":
            _refuse(name, f"algorithm {value!r} is not eagle3")
    layer_cfg = dict(cfg.get("transformer_layer_config") or {})
    _check_known(layer_cfg, SHAPE + INERT, "speculators transformer_layer_config of the")
    if layer_cfg.get("tie_word_embeddings"):
        _refuse("tie_word_embeddings", "vLLM's Eagle3LlamaForCausalLM has its own lm_head")
    # speculators models/eagle3/config.py validate_transformer_config: no model_type means Qwen3Config
    # (its default since speculators #620); model_definitions.py builds llama and qwen3 draft layers.
    layer_type = layer_cfg.get("model_type", "qwen3")
    if layer_type not in ("llama", "qwen3"):
        _refuse("model_type", f"{layer_type!r} draft layers (speculators builds llama or qwen3)")
    out = {**_llama_part(layer_cfg, stacked=True), "draft_layer_type": layer_type}
    out.update({k: cfg[k] for k in ("draft_vocab_size", "target_hidden_size") if cfg.get(k) is not None})
    # vllm transformers_utils/configs/speculators/algos.py update_eagle3: norm_before_residual defaults
    # to true when absent; norm_output (EAGLE 3.1) feeds the normed output to the next step.
    out.update(norm_before_residual=_flag(cfg, "norm_before_residual", True), norm_before_fc=_flag(cfg, "norm_before_fc"),
               fc_norm=_flag(cfg, "fc_norm"), feedback_post_norm=_flag(cfg, "norm_output"))
    if out["norm_before_fc"] and out["fc_norm"]:
        _refuse("fc_norm", "and norm_before_fc are exclusive (speculators eagle3/config.py)")
    _lm_head(out, state)
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    return out, tuple(ids) if ids else None


# EAGLE's training module (``eagle/traineagle3/cnets.py`` ``Model``) holds the frozen target as
# ``target_model``; ``save_16bit_model(exclude_frozen_parameters=True)`` in ``traineagle3/main.py`` drops its
# parameters but keeps its persistent buffers (``traineagle3/modeling_llama_kv.py`` registers
# ``rotary_emb.inv_freq`` persistent). EAGLE's inference ``Model`` has no ``target_model``, and its
# ``load_state_dict(strict=False)`` (``eagle/model/ea_model.py``, cb7e0841) drops exactly these keys.
EAGLE_TARGET_PREFIX = "target_model."


def canonical_state(dialect: str, state: dict) -> dict:
    """Tensors renamed to ``Eagle3Head``'s names (speculators' ``layers.0.`` is ``midlayer.``); an EAGLE
    training checkpoint's copy of the target left out."""
    if dialect == "eagle":
        return {k: v for k, v in state.items() if not k.startswith(EAGLE_TARGET_PREFIX)}
    if dialect != "speculators":
        return dict(state)
    return {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}


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


def read_state(directory: Path) -> dict:
    """The checkpoint's tensors (safetensors preferred)."""
    for name in WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return read_bin(path)
    raise ModelLoadError(f"EAGLE-3 checkpoint {directory} has no {' or '.join(WEIGHT_FILES)}")


def draft_vocab_map(state: dict, config) -> torch.Tensor:
    """(Vd,) target id of every draft id from ``d2t``, checked against ``t2d``."""
    vd, v = config.draft_vocab_size, config.vocab_size
    if "d2t" not in state:
        if vd != v:
            raise ModelLoadError("EAGLE-3 checkpoint has a draft vocabulary but no d2t map")
        return torch.arange(v)
    ids = torch.arange(vd) + state["d2t"].long()
    if ids.min() < 0 or ids.max() >= v:
        raise ModelLoadError("EAGLE-3 d2t maps draft ids outside the target vocabulary")
    t2d = state.get("t2d")
    if t2d is not None and (t2d.numel() != v or int(t2d.sum()) != vd or not t2d.bool()[ids].all()):
        raise ModelLoadError("EAGLE-3 d2t and t2d disagree")
    return ids


def read_head(directory, specforge_norm_output: str | None = None) -> HeadCheckpoint:
    """Read ``directory`` (``config.json`` + weights) into the canonical form; ``specforge_norm_output`` (one of
    ``NORM_OUTPUT_CONVENTIONS``) says which SpecForge wrote a SpecForge/SGLang head's ``norm_output``."""
    if specforge_norm_output not in (None, *NORM_OUTPUT_CONVENTIONS):
        raise ModelLoadError(f"unknown --specforge-norm-output {specforge_norm_output!r} "
                             f"(use {', '.join(NORM_OUTPUT_CONVENTIONS)})")
    directory = Path(directory)
    path = directory / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"EAGLE-3 checkpoint not found: no config.json in {directory}")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"EAGLE-3 config {path} is not JSON: {exc}") from None
    dialect = detect_dialect(cfg)
    raw, notes = read_state(directory), []
    state = canonical_state(dialect, raw)
    if len(state) < len(raw) and dialect == "eagle":
        notes.append(f"{len(raw) - len(state)} {EAGLE_TARGET_PREFIX}* buffers ignored, as EAGLE's loader does")
    if dialect == "sglang":
        config, ids = _sglang(cfg, state, notes, specforge_norm_output)
    else:
        config, ids = {"eagle": _eagle, "speculators": _speculators}[dialect](cfg, state, notes)
    if ids is not None and (len(ids) != 3 or not all(isinstance(i, int) and i >= 0 for i in ids)):
        _refuse("eagle_aux_hidden_state_layer_ids", f"{list(ids)}: EAGLE-3 fuses three layers")
    layers = None
    if dialect == "speculators":
        layers = ids
    elif dialect == "sglang":
        convention = (cfg.get("eagle_config") or {}).get(CONVENTION_KEY, "legacy")
        check_trained_layers(directory, ids, convention)
        if ids is not None:
            layers = sglang_ids_to_layers(ids, convention)
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return HeadCheckpoint(dialect, config, state, layers, ids, verifier, notes)


def choose_layers(head: HeadCheckpoint, num_layers: int, override=None) -> tuple[tuple[int, ...], str]:
    """The ``hidden_states`` indices to draft from and how they were chosen (for the load message)."""
    if override is not None:
        layers, how = tuple(int(i) for i in override), "--eagle3-layers"
        if head.layers is not None and head.layers != layers:
            how += f" (overriding the config's {head.layers})"
    elif head.layers is not None:
        layers = head.layers
        how = f"config ids {list(head.written_ids)}"
        if head.dialect == "sglang":
            shifted = layers == sglang_ids_to_layers(head.written_ids)
            how += (" (outputs of those layers)" if shifted
                    else " (hidden_states indices: SGLang's convention since PR #25454)")
    else:
        layers, how = default_layers(num_layers), "EAGLE-3 default (2, L//2, L-3)"
    if len(layers) != 3 or not all(0 <= i <= num_layers for i in layers):
        raise ModelLoadError(f"EAGLE-3 layers {list(layers)} must be three hidden_states indices in 0..{num_layers}")
    return layers, how
