"""Atomic writes: a temporary file beside the destination, then ``os.replace``.

Every stage writes through these so an interrupted run never leaves a half-written
file where a finished one is expected (a rerun resumes from finished files only).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write(path, write) -> Path:
    """Call ``write(tmp_path)``, then move the file onto ``path``; nothing is left behind on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs and caches are ordinary data files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path, obj) -> Path:
    """Write ``obj`` as indented JSON atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=2, default=str)))


def write_parquet_atomic(table, path) -> Path:
    """Write an Arrow table (or a pandas DataFrame, without its index) to Parquet atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def remove_temps(directory, pattern: str = ".*.tmp") -> None:
    """Delete the temporary files that killed writes left in ``directory`` (``pattern`` relative to it); never a
    finished file. Call only while nothing writes there."""
    for stale in Path(directory).glob(pattern):
        stale.unlink(missing_ok=True)
