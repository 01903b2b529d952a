"""Where the head of an ``eagle3:`` spec is: a head named by its target (``eagle3:default``, ``eagle3:gemma3-270m``),
trained into the cache by its make target or else shipped in the package; a local path; or a hub snapshot."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from specrank.decode.loading.hub import parse_hub_id, snapshot
from specrank.files import cache_root

DEFAULT_HEAD = "smollm2-eagle3"
# The heads named by their target (``eagle3:NAME``): their folder, in the cache and in the package, and the make
# target that trains one into the cache (which wins over the shipped one).
NAMED_HEADS = {"default": (DEFAULT_HEAD, "make drafter"), "gemma3-270m": ("gemma3-270m-eagle3", "make drafter-gemma3")}


def cached_head_dir(name: str = "default") -> Path:
    """Where the head ``eagle3:NAME`` is trained into the cache: ``$SPECRANK_CACHE/drafters/<folder>``."""
    return cache_root() / "drafters" / NAMED_HEADS[name][0]


def shipped_head_dir(name: str = "default") -> Path:
    """The head ``eagle3:NAME`` that ships inside the package (bf16, its model card in ``README.md`` beside it)."""
    return Path(str(resources.files("specrank") / "data" / "heads" / NAMED_HEADS[name][0]))


def named_head_dir(name: str) -> Path:
    """``eagle3:NAME``: the head its make target trained into the cache when there is one, else the shipped head."""
    cached = cached_head_dir(name)
    return cached if (cached / "config.json").is_file() else shipped_head_dir(name)


def default_head_dir() -> Path:
    """``eagle3:default``: the embedded default target's head (``named_head_dir``)."""
    return named_head_dir("default")


def missing_named_head(name: str) -> str | None:
    """The one-line error for ``eagle3:NAME`` when neither the cache nor the package holds it (None: it is there)."""
    if (named_head_dir(name) / "config.json").is_file():
        return None
    return (f"no EAGLE-3 head eagle3:{name} in {cached_head_dir(name)} nor in {shipped_head_dir(name)}: run "
            f"`{NAMED_HEADS[name][1]}` (trains it into the cache)")


def head_dir(spec) -> Path:
    """The local directory of an ``eagle3:`` spec's rest: a ``NAMED_HEADS`` name, a path, or a hub id (its
    snapshot)."""
    if str(spec) in NAMED_HEADS:
        return named_head_dir(str(spec))
    if parse_hub_id(spec) is not None:
        return snapshot(spec, "EAGLE-3 head")
    return Path(spec)


def has_default_head() -> bool:
    """Whether ``eagle3:default`` names a head (the cached one or the shipped one)."""
    return (default_head_dir() / "config.json").is_file()
