"""Where a study's results come from: the source's commit and the machine, in words."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch


def source_commit() -> str:
    """The git commit of the package's checkout (with ``+dirty`` when it has changes), else its version."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        try:
            return f"specrank {metadata.version('specrank')}"
        except metadata.PackageNotFoundError:  # a copy of the source on PYTHONPATH, neither a checkout nor installed
            return "unknown"


def machine(device: str, workers=None) -> str:
    """The machine in words: processor, cores, device, workers."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    count = getattr(workers, "n", None)
    return f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, {device}" + (
        f", {count} Ray workers" if count else "")
