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
Each layout's fields are read in a module of its own (``eagle3_safeailab``, ``eagle3_specforge``,
``eagle3_speculators``), the fields and checks they share in ``eagle3_config_fields``; this one tells the
layouts apart and gives the canonical ``HeadCheckpoint``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specrank.decode.core import ModelLoadError
from specrank.decode.loading.eagle3_config_fields import refuse_field
from specrank.decode.loading.eagle3_safeailab import EAGLE_TARGET_PREFIX, read_eagle_config
from specrank.decode.loading.eagle3_specforge import (
    CONVENTION_KEY,
    NORM_OUTPUT_CONVENTIONS,
    check_trained_layers,
    read_sglang_config,
    sglang_ids_to_layers,
)
from specrank.decode.loading.eagle3_speculators import read_speculators_config
from specrank.decode.loading.weight_files import read_bin

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

EAGLE3_ARCH = "LlamaForCausalLMEagle3"  # SGLang models/llama_eagle3.py EntryClass; SpecForge's draft class
SPECULATOR_ARCH = "Eagle3Speculator"  # speculators convert/eagle/eagle3_legacy_model.py
DIALECTS = ("eagle", "sglang", "speculators")
DIALECT_NAMES = {"eagle": "SafeAILab EAGLE", "sglang": "SpecForge/SGLang", "speculators": "vLLM speculators"}


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


def canonical_state(dialect: str, state: dict) -> dict:
    """Tensors renamed to ``Eagle3Head``'s names (speculators' ``layers.0.`` is ``midlayer.``); an EAGLE
    training checkpoint's copy of the target left out."""
    if dialect == "eagle":
        return {k: v for k, v in state.items() if not k.startswith(EAGLE_TARGET_PREFIX)}
    if dialect != "speculators":
        return dict(state)
    return {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}


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
        config, ids = read_sglang_config(cfg, state, notes, specforge_norm_output)
    else:
        config, ids = {"eagle": read_eagle_config, "speculators": read_speculators_config}[dialect](cfg, state, notes)
    if ids is not None and (len(ids) != 3 or not all(isinstance(i, int) and i >= 0 for i in ids)):
        refuse_field("eagle_aux_hidden_state_layer_ids", f"{list(ids)}: EAGLE-3 fuses three layers")
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
