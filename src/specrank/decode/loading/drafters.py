"""Drafters behind one interface (``specrank.decode.core.Drafter``), loaded from a spec string.

Specs: ``standalone:PATH`` (a causal LM directory sharing the target's tokenizer),
``early-exit:K`` or ``early-exit:K:HEAD`` (the target's first K layers, optionally with a
fitted linear exit head), ``eagle3:DIR`` or ``eagle3:ORG/NAME[@REVISION]`` (an EAGLE-3 head in its
published format, local or a hub id;
``eagle3:default`` is the head for the embedded default target, ``eagle3:gemma3-270m`` the one for Gemma 3 270M: each
ships in the package, and ``make drafter`` / ``make drafter-gemma3`` train one into the cache that wins).
"""

from __future__ import annotations

from pathlib import Path

from specrank.decode.core import ModelLoadError
from specrank.decode.loading.eagle3 import load_eagle3
from specrank.decode.loading.eagle3_named_heads import NAMED_HEADS, head_dir, missing_named_head
from specrank.decode.loading.early_exit import check_exit_head_file, load_early_exit
from specrank.decode.loading.standalone import load_standalone
from specrank.decode.loading.target_spec import check_model_dir
from specrank.decode.prompts import prompt_digest
from specrank.files import read_json

SPEC_FORMS = ("standalone:PATH, early-exit:K, early-exit:K:HEAD_PATH, eagle3:DIR, eagle3:ORG/NAME[@REV], eagle3:default "
              "or eagle3:gemma3-270m")


def parse_drafter_spec(spec, eagle3_layers=None, specforge_norm_output=None) -> tuple[str, str]:
    """(kind, rest) of a drafter spec, refusing a malformed spec, a missing or unreadable file, or
    ``eagle3_layers`` for a drafter that is not an EAGLE-3 head, before any model loads (what depends on the
    target, such as K against its layers, is checked at load)."""
    kind, _, rest = str(spec).partition(":")
    if eagle3_layers is not None and kind != "eagle3":
        raise ModelLoadError(f"--eagle3-layers applies to eagle3: drafters, not {spec!r}")
    if specforge_norm_output is not None and kind != "eagle3":
        raise ModelLoadError(f"--specforge-norm-output applies to eagle3: drafters, not {spec!r}")
    if kind == "standalone" and rest:
        if not Path(rest).is_dir():
            raise FileNotFoundError(f"standalone drafter: no Hugging Face model directory at {rest}")
        check_model_dir(Path(rest), "standalone drafter")
    elif kind == "early-exit" and rest:
        layers, _, head = rest.partition(":")
        if not layers.isdigit() or int(layers) < 1:
            raise ModelLoadError(f"drafter spec {spec!r}: K must be a positive number of layers")
        if head:
            check_exit_head_file(head)
    elif kind == "eagle3" and rest:
        if rest in NAMED_HEADS and (missing := missing_named_head(rest)):
            raise FileNotFoundError(missing)
        if rest not in NAMED_HEADS:
            directory = head_dir(rest)
            if not Path(directory, "config.json").is_file():
                raise FileNotFoundError(f"EAGLE-3 checkpoint not found: no config.json in {rest}")
            read_json(Path(directory, "config.json"), "EAGLE-3 config")
    else:
        raise ModelLoadError(f"unknown drafter spec {spec!r} (use {SPEC_FORMS})")
    return kind, rest


def load_drafter(spec: str, target, eagle3_layers=None, specforge_norm_output=None):
    """Build the drafter described by ``spec`` for ``target`` (same device, dtype and ``graphs``);
    ``eagle3_layers`` (three ``hidden_states`` indices) chooses an ``eagle3:`` head's target layers and
    ``specforge_norm_output`` how a SpecForge head's ``norm_output`` is read
    (``eagle3_specforge.NORM_OUTPUT_CONVENTIONS``)."""
    kind, rest = parse_drafter_spec(spec, eagle3_layers, specforge_norm_output)
    if kind == "standalone":
        drafter = load_standalone(rest, target, spec)
    elif kind == "early-exit":
        layers, _, head = rest.partition(":")
        drafter = load_early_exit(target, int(layers), head or None, spec)
    else:
        drafter = load_eagle3(rest, target, spec, eagle3_layers, specforge_norm_output)
    drafter.graphs = target.graphs  # captured passes for both or for neither
    return drafter


class SeenPromptError(ValueError):
    """A head would be evaluated on prompts it was trained on."""


def head_directory(spec: str) -> Path | None:
    """The checkpoint directory of an ``eagle3:`` spec (``default`` and hub ids resolved), else None."""
    kind, _, rest = str(spec).partition(":")
    if kind != "eagle3" or not rest:
        return None

    return head_dir(rest)


def trained_on(spec: str, prompts) -> list[str] | None:
    """Ids of ``prompts`` whose text the drafter ``spec`` was trained on, by the prompt digests its head's
    ``training.json`` records; [] for a drafter with no training record, None for a head whose ``training.json``
    (written by an older specrank) does not say which prompts it trained on."""
    head = head_directory(spec)
    if head is None or not (head / "training.json").is_file():
        return []
    record = read_json(head / "training.json", "EAGLE-3 head training summary")
    if not isinstance(record, dict) or not isinstance(record.get("training_prompts"), dict):
        return None
    seen = set(record["training_prompts"].values())
    return [p.prompt_id for p in prompts if prompt_digest(p.text) in seen]


def check_unseen(spec: str, prompts, allow: bool = False, flag: str = "--allow-training-prompts") -> int:
    """Refuse (``SeenPromptError``) to evaluate the drafter ``spec`` on prompts its head trained on, unless
    ``allow``; return how many of ``prompts`` it trained on (recorded in the manifest when allowed)."""
    seen = trained_on(spec, prompts)
    if seen is None:
        if allow:
            return len(prompts)  # unknown: counted as all seen
        raise SeenPromptError(f"drafter {spec}: its training.json does not say which prompts it trained on (an older "
                              f"specrank wrote it): retrain it (`make drafter`), or pass {flag}")
    if seen and not allow:
        raise SeenPromptError(
            f"drafter {spec} was trained on {len(seen)} of these {len(prompts)} prompts (e.g. {seen[0]!r}): its "
            f"acceptance there is inflated; decode other prompts, or pass {flag} to measure it anyway")
    return len(seen)
