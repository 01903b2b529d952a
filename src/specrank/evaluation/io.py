"""Atomic file writes for evaluation outputs: a temporary file in the target folder, then os.replace."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path, write) -> Path:
    """Call ``write(tmp_path)`` and move the result onto ``path``; nothing is left behind on failure."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
