"""``reranker:default``: the champions of the default study (the embedded default target with its shipped EAGLE-3
head, on Spec-Bench), one per law, since a greedy reranker learns argmax labels and a sampled one probabilities.

The package ships one of each; a champion installed into ``$SPECRANK_CACHE/rerankers`` by a rerun of the default
study wins, as a head ``make drafter`` trains into the cache wins over the shipped head."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

from specrank.files import cache_root
from specrank.law import Law
from specrank.rerankers.loader import load_reranker
from specrank.rerankers.persist import META

DEFAULT = "reranker:default"
DEFAULT_PAIR = "smollm2-eagle3"  # the target/drafter pair the default champions were trained with
DEFAULT_DRAFTER = "eagle3:default"


class DefaultRerankerError(FileNotFoundError):
    """No default champion for this law."""


def cached_reranker_dir(law: str) -> Path:
    """Where a rerun of the default study installs its ``law`` champion: ``$SPECRANK_CACHE/rerankers/<pair>/<law>``."""
    return cache_root() / "rerankers" / DEFAULT_PAIR / law


def shipped_reranker_dir(law: str) -> Path:
    """The ``law`` champion that ships inside the package: a format-2 zip (its trees are text, which the zip
    compresses to a fraction), its model card in its ``reranker.json``."""
    return Path(str(resources.files("specrank") / "data" / "rerankers" / DEFAULT_PAIR / f"{law}.zip"))


def shipped_first_step_dir(law: str) -> Path:
    """The ``law`` first-step reranker that ships inside the package, the vLLM plugin's ``reranker:default``: the
    champions read the pool below the first level, which a chain engine has not drafted when it picks its first
    token (``scripts/ship_first_step.py`` writes it, its model card in its ``reranker.json``)."""
    return Path(str(resources.files("specrank") / "data" / "rerankers" / DEFAULT_PAIR / f"first-step-{law}.zip"))


def load_first_step_reranker(temperature: float):
    """The shipped first-step reranker that fits ``temperature``, its file named on stderr in one line."""
    path = shipped_first_step_dir(Law(temperature).name)
    if not saved_reranker(path):
        raise DefaultRerankerError(f"{DEFAULT}: no {Law(temperature).name} first-step reranker at {path}"
                                   " (`python scripts/ship_first_step.py` writes one)")
    print(f"{DEFAULT} (first step, {Law(temperature).name}): {path}", file=sys.stderr)
    return load_reranker(path)


def saved_reranker(path: Path) -> bool:
    """Whether ``path`` holds a saved reranker (a format-2 directory or zip)."""
    return (path / META).is_file() if path.suffix != ".zip" else path.is_file()


def default_reranker_dir(temperature: float) -> Path:
    """The champion ``reranker:default`` names at ``temperature``: the cache's when there is one, else the shipped."""
    law = Law(temperature).name
    for path in (cached_reranker_dir(law), shipped_reranker_dir(law)):
        if saved_reranker(path):
            return path
    raise DefaultRerankerError(f"{DEFAULT}: no {law} champion in {cached_reranker_dir(law)} or "
                               f"{shipped_reranker_dir(law)} (`specrank study` with the default target and drafter "
                               "installs one)")


def is_default(source) -> bool:
    """Whether ``source`` names the default champions."""
    return isinstance(source, str) and source == DEFAULT


def load_default_reranker(temperature: float):
    """The champion that fits ``temperature``, its file named on stderr in one line."""
    path = default_reranker_dir(temperature)
    print(f"{DEFAULT} ({Law(temperature).name}): {path}", file=sys.stderr)
    return load_reranker(path)
