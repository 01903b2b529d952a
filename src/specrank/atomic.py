"""Atomic writes: a temporary file (or directory) beside the destination, then ``os.replace``.

Every stage writes through these so an interrupted run never leaves a half-written
file where a finished one is expected (a rerun resumes from finished files only), and a
failed write leaves nothing: no temporary file, no directory it had to create.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def make_parents(directory: Path) -> list[Path]:
    """Create ``directory`` and its missing parents; return the ones created, outermost first."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
    return missing[::-1]


def remove_empty(directories) -> None:
    """Remove the directories of ``directories`` (innermost last in the list) that are still empty."""
    for d in reversed(list(directories)):
        try:
            d.rmdir()
        except OSError:
            break  # not empty: something else was written there


def atomic_write(path, write) -> Path:
    """Call ``write(tmp_path)``, then move the file onto ``path``; nothing is left behind on failure."""
    path = Path(path)
    created = make_parents(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs and caches are ordinary data files
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except BaseException:
        remove_empty(created)
        raise
    return path


def replace_dir(src: Path, dest: Path) -> None:
    """Move directory ``src`` onto ``dest``, replacing a directory already there (the old one is set aside
    first, so ``dest`` is always either the old or the new directory)."""
    if not dest.exists():
        os.replace(src, dest)
        return
    aside = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".old"))
    os.replace(dest, aside / dest.name)
    try:
        os.replace(src, dest)
    except BaseException:
        os.replace(aside / dest.name, dest)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def atomic_write_dir(path, write) -> Path:
    """Call ``write(tmp_dir)``, then move the directory onto ``path`` (replacing an older one)."""
    path = Path(path)
    created = make_parents(path.parent)
    try:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        try:
            write(tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private
            replace_dir(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        remove_empty(created)
        raise
    return path


def write_json_atomic(path, obj) -> Path:
    """Write ``obj`` as indented JSON atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=2, default=str)))


def write_parquet_atomic(table, path) -> Path:
    """Write an Arrow table (or a pandas DataFrame, without its index) to Parquet atomically, with page
    checksums, so a damaged file is detected when read (``specrank.parquet.read_verified``)."""
    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, write_page_checksum=True))


def remove_temps(directory, pattern: str = ".*.tmp") -> None:
    """Delete the temporary files that killed writes left in ``directory`` (``pattern`` relative to it); never a
    finished file. Call only while nothing writes there."""
    for stale in Path(directory).glob(pattern):
        stale.unlink(missing_ok=True)
