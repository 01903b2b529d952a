"""Hugging Face hub ids as model specs: ``ORG/NAME`` or ``ORG/NAME@REVISION`` (a branch, tag or commit).

A spec that names an existing local path is that path; otherwise a spec shaped like a hub id is fetched with
``huggingface_hub.snapshot_download`` into the hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``). With ``HF_HUB_OFFLINE=1``, or when the hub cannot be reached, only the local
cache is read. The snapshot's directory name is the commit it resolved to, which the run manifest records.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from specrank.errors import first_line

# huggingface_hub's repo-id format (``validate_repo_id``): one "/", names of letters, digits, "-", "_", "."
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")
TRUE = ("1", "ON", "YES", "TRUE")
# What a model or head directory needs (configs, tokenizers, weights); not Meta's ``original/*.pth`` copies.
FILES = ["*.json", "*.safetensors", "*.bin", "*.model", "*.tiktoken", "*.txt"]


def parse_hub_id(spec) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` when ``spec`` is a hub id rather than a local path, else None."""
    text = str(spec)
    match = HUB_ID.match(text)
    if match is None or Path(text).exists() or text.startswith("."):
        return None
    return match["repo"], match["revision"]


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as it is now (huggingface_hub reads it once, at its import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in TRUE


def cache_dir() -> str | None:
    """The hub cache as the environment names it now (None: huggingface_hub's default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    return str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else None


def snapshot(spec, what: str) -> Path:
    """The local snapshot directory of hub id ``spec`` (downloaded unless offline); a missing id, revision
    or cache entry is one ``FileNotFoundError`` line naming ``spec``."""
    repo, revision = parse_hub_id(spec)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    where = "the local Hugging Face cache" if offline() else "the Hugging Face hub or its local cache"
    try:
        path = snapshot_download(repo, revision=revision, cache_dir=cache_dir(), local_files_only=offline(),
                                 endpoint=os.environ.get("HF_ENDPOINT") or None,
                                 allow_patterns=FILES, ignore_patterns=["original/*"])
    except (HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise FileNotFoundError(f"{what} not found: {spec} (no such local path, nor a hub id in {where}: "
                                f"{type(exc).__name__}: {first_line(exc)[:160]})") from None
    return Path(path)


def revision_of(path) -> str | None:
    """The commit of a hub-cache snapshot directory (``.../snapshots/<commit>``), None elsewhere."""
    path = Path(path)
    return path.name if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name) else None
