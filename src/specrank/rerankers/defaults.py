"""Named champions: ``reranker:default``, the champions of the default study (the embedded default target with its
shipped EAGLE-3 head, on Spec-Bench), and ``reranker:gemma3-270m``, those of the study of Gemma 3 270M with
``eagle3:gemma3-270m``; one per law, since a greedy reranker learns argmax labels and a sampled one probabilities.

The package ships one of each; a champion installed into ``$SPECRANK_CACHE/rerankers`` by a rerun of its pair's study
wins, as a head ``make drafter`` trains into the cache wins over the shipped head."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from specrank.files import cache_root
from specrank.law import Law
from specrank.rerankers.loader import load_reranker
from specrank.rerankers.persist import META

DEFAULT = "reranker:default"
DEFAULT_PAIR = "smollm2-eagle3"  # the target/drafter pair the default champions were trained with
DEFAULT_DRAFTER = "eagle3:default"
PREFIX = "reranker:"


@dataclass(frozen=True)
class ChampionPair:
    """The pair a named champion was trained for: its folder (in the cache and the package), target and drafter,
    and what makes one."""

    folder: str
    target: str
    drafter: str
    make: str


CHAMPIONS = {
    "default": ChampionPair(DEFAULT_PAIR, "smollm2", DEFAULT_DRAFTER,
                            "`specrank study` with the default target and drafter installs one"),
    "gemma3-270m": ChampionPair("gemma3-270m-eagle3", "gemma3-270m", "eagle3:gemma3-270m",
                                "`make study-gemma3` installs one"),
}


def champion_name(source) -> str | None:
    """``NAME`` of a ``reranker:NAME`` source (``CHAMPIONS``), None for any other source; an unknown name is refused
    in one line."""
    if not isinstance(source, str) or not source.startswith(PREFIX):
        return None
    name = source[len(PREFIX):]
    if name not in CHAMPIONS:
        raise DefaultRerankerError(f"{source}: no such named champion (named: "
                                   f"{', '.join(PREFIX + n for n in CHAMPIONS)})")
    return name


def champion_for(drafter: str, target: str | None = None) -> str | None:
    """The name of the champions trained with ``drafter`` (a spec; and for ``target`` when given; None: no named
    champion fits)."""
    return next((n for n, pair in CHAMPIONS.items()
                 if pair.drafter == drafter and target in (None, pair.target)), None)


class DefaultRerankerError(FileNotFoundError):
    """No default champion for this law."""


def cached_reranker_dir(law: str, name: str = "default") -> Path:
    """Where a rerun of its pair's study installs the ``law`` champion ``reranker:NAME``:
    ``$SPECRANK_CACHE/rerankers/<pair>/<law>``."""
    return cache_root() / "rerankers" / CHAMPIONS[name].folder / law


def shipped_reranker_dir(law: str, name: str = "default") -> Path:
    """The ``law`` champion ``reranker:NAME`` that ships inside the package: a format-2 zip (its trees are text,
    which the zip compresses to a fraction), its model card in its ``reranker.json``."""
    return Path(str(resources.files("specrank") / "data" / "rerankers" / CHAMPIONS[name].folder / f"{law}.zip"))


def shipped_first_step_dir(law: str) -> Path:
    """The ``law`` first-step reranker that ships inside the package, the vLLM plugin's ``reranker:default``: the
    champions read the pool below the first level, which a chain engine has not drafted when it picks its first
    token (``scripts/ship_first_step.py`` writes it, its model card in its ``reranker.json``)."""
    return Path(str(resources.files("specrank") / "data" / "rerankers" / DEFAULT_PAIR / f"first-step-{law}.zip"))


def load_first_step_reranker(temperature: float, name: str = "default"):
    """The shipped first-step reranker of ``reranker:NAME`` that fits ``temperature``, its file named on stderr in
    one line (only the default pair ships one)."""
    if name != "default":
        raise DefaultRerankerError(f"{PREFIX}{name}: no first-step reranker ships for its pair; give the plugin "
                                   f"{DEFAULT} or a saved reranker's path")
    path = shipped_first_step_dir(Law(temperature).name)
    if not saved_reranker(path):
        raise DefaultRerankerError(f"{DEFAULT}: no {Law(temperature).name} first-step reranker at {path}"
                                   " (`python scripts/ship_first_step.py` writes one)")
    print(f"{DEFAULT} (first step, {Law(temperature).name}): {path}", file=sys.stderr)
    return load_reranker(path)


def saved_reranker(path: Path) -> bool:
    """Whether ``path`` holds a saved reranker (a format-2 directory or zip)."""
    return (path / META).is_file() if path.suffix != ".zip" else path.is_file()


def default_reranker_dir(temperature: float, name: str = "default") -> Path:
    """The champion ``reranker:NAME`` names at ``temperature``: the cache's when there is one, else the shipped."""
    law = Law(temperature).name
    for path in (cached_reranker_dir(law, name), shipped_reranker_dir(law, name)):
        if saved_reranker(path):
            return path
    raise DefaultRerankerError(f"{PREFIX}{name}: no {law} champion in {cached_reranker_dir(law, name)} or "
                               f"{shipped_reranker_dir(law, name)} ({CHAMPIONS[name].make})")


def load_default_reranker(temperature: float, name: str = "default"):
    """The champion ``reranker:NAME`` that fits ``temperature``, its file named on stderr in one line."""
    path = default_reranker_dir(temperature, name)
    print(f"{PREFIX}{name} ({Law(temperature).name}): {path}", file=sys.stderr)
    return load_reranker(path)
