"""A target spec (a local Hugging Face directory, a ``.gguf`` file, a hub id or a ``NAMED_TARGETS`` name) checked
before anything loads, resolved to a Hugging Face directory, and the config read from that directory."""

from __future__ import annotations

from pathlib import Path

from specrank.decode.core import ModelLoadError
from specrank.decode.loading.gguf_conversion import GGUF_MAGIC, convert_gguf
from specrank.decode.loading.hub import parse_hub_id, snapshot
from specrank.decode.loading.named_targets import installed, named_gguf, named_target
from specrank.files import read_json


def check_model_dir(path: Path, what: str) -> None:
    """Refuse a directory whose ``config.json`` is missing, malformed or not a Hugging Face model config."""

    config = path / "config.json"
    if not config.is_file():
        raise ModelLoadError(f"{what} {path}: no config.json (not a Hugging Face model directory)")
    cfg = read_json(config, f"{what} config")
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ModelLoadError(f"{what} config {config}: no 'model_type' (not a Hugging Face model config)")


def check_target_spec(spec) -> Path | None:
    """Refuse, before anything loads, a target that is missing or cannot be a model: the path of a local
    directory, ``.gguf`` file or hub snapshot (``ORG/NAME[@REVISION]``, see ``hub``), None for a named target
    (``NAMED_TARGETS``: its package must be installed)."""
    if (named := named_target(spec)) is not None:
        installed(named)
        return None
    if parse_hub_id(spec) is not None:
        path = snapshot(spec, "target")
        check_model_dir(path, "target")
        return path
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"target not found: {spec}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"target {spec} is neither a .gguf file nor a Hugging Face model directory")
        with open(path, "rb") as fh:
            if fh.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise ModelLoadError(f"target {spec}: not a GGUF file (no GGUF header)")
    else:
        check_model_dir(path, "target")
    return path


def resolve_target(spec) -> Path:
    """A Hugging Face directory for ``spec`` (directory, ``.gguf`` file, hub id or a ``NAMED_TARGETS`` name)."""
    path = check_target_spec(spec)
    if path is None:
        return convert_gguf(named_gguf(named_target(spec)))
    return convert_gguf(path) if path.is_file() else path


def target_config(spec) -> dict:
    """The target's ``config.json`` (a GGUF converted first, as loading would): what layer indices and
    vocabulary sizes are checked against before the model loads."""

    path = resolve_target(spec)
    config = read_json(path / "config.json", "target config")
    for key in ("num_hidden_layers", "vocab_size"):
        if not isinstance(config.get(key), int) or config[key] < 1:
            raise ModelLoadError(f"target config {path / 'config.json'}: no positive integer {key!r}")
    return config
