"""Atomic file writes: a temporary file beside the target, then ``os.replace``."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write(path, write) -> None:
    """Call ``write(tmp_path)`` then move the file onto ``path``; no partial file is ever visible."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide shared caches from other users
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_json_atomic(path, obj) -> None:
    """Write ``obj`` as indented JSON atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=2)))
