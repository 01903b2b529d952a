"""Versions of the packages a run records, also where a package is only a source tree on ``PYTHONPATH``."""

from __future__ import annotations

from importlib import metadata

import specrank


def package_version(name: str) -> str | None:
    """The installed version of ``name``, None when it is not installed. specrank answers with its own
    ``__version__``: it also runs from a copy of its source that no installer has seen (on a GPU machine
    that fetches nothing, say)."""
    if name == "specrank":
        return specrank.__version__
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
