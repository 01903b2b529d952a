"""Reading the files stages hand each other (JSON, Parquet), with errors that name the file.

A truncated, corrupted or foreign file is an input error: it becomes a ``DataFileError`` naming the
path (and the line and column of malformed JSON) instead of the decoder's own message. Parquet is read
with page checksums verified (``specrank.atomic.write_parquet_atomic`` writes them), so flipped bytes
in a page are caught, not decoded into wrong values.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specrank.errors import first_line


class DataFileError(ValueError):
    """A file that exists but cannot be read as what it should be."""


def cache_root() -> Path:
    """Where caches live: ``$SPECRANK_CACHE``, default ``~/.cache/specrank``."""
    return Path(os.environ.get("SPECRANK_CACHE") or Path.home() / ".cache" / "specrank")


def file_hash(path: str | Path, digest=None) -> str:
    """SHA-256 of one file's bytes (or feed them into ``digest``)."""
    digest = hashlib.sha256() if digest is None else digest
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def directory_hash(path: str | Path) -> str:
    """SHA-256 over the relative names and bytes of every file under ``path`` (a run directory's identity)."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"run directory {root} does not exist")
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(root)).encode() + b"\0")
        file_hash(file, digest)
    return digest.hexdigest()


def sha256_files(paths) -> str:
    """SHA-256 over the contents of ``paths`` in the given order."""
    digest = hashlib.sha256()
    for path in paths:
        file_hash(path, digest)
    return digest.hexdigest()


def read_json(path, what: str = "JSON file"):
    """The JSON value in ``path``; a malformed file names its line and column."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFileError(f"{what} {path}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except UnicodeDecodeError:
        raise DataFileError(f"{what} {path}: not a UTF-8 text file") from None


def read_csv(path):
    """The CSV file ``path`` as a pandas DataFrame."""
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataFileError(f"{path}: not a readable CSV file: {first_line(exc)}") from None


def _parquet_error(path, exc) -> DataFileError:
    return DataFileError(f"{path}: not a readable Parquet file (truncated or corrupted?): {first_line(exc)}")


def read_schema(path):
    """The Arrow schema of the Parquet file ``path``."""
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise _parquet_error(path, exc) from None


def read_table(path, columns=None):
    """The Parquet file ``path`` (only ``columns`` when given) as an Arrow table, page checksums verified."""
    try:
        return pq.read_table(path, columns=columns, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as exc:
        raise _parquet_error(path, exc) from None


def parquet_damage(path) -> str | None:
    """Why the Parquet file ``path`` cannot be read whole (truncated, corrupted), or None if it can."""
    try:
        read_table(path)
    except DataFileError as exc:
        return str(exc).split(": ", 1)[1]
    return None


URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")  # models:/NAME@alias, runs:/ID/PATH, s3://... (not C:\ paths)


def names_a_uri(source) -> bool:
    """Whether ``source`` is a URI (``models:/...``, ``runs:/...``) rather than a path that exists here."""
    return bool(URI.match(str(source))) and not Path(str(source)).expanduser().exists()
