"""Where a run's inputs come from: its files as MLflow datasets with content digests (decode -> featurize ->
train -> evaluate share them), and the code version it ran."""

from __future__ import annotations

import hashlib
import json
import subprocess
import warnings
from functools import lru_cache
from pathlib import Path

import mlflow
import pyarrow as pa
import pyarrow.parquet as pq
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.types import ColSpec, DataType, Schema
from mlflow.types.schema import Array
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT

import specrank

DIGEST_CHARS = 16  # MLflow stores a dataset digest in 36 characters; 16 hex digits of SHA-256 are plenty
ROUNDS_PARTS = ("rounds", "diagnostics")  # a run directory's recorded tables (not its later outputs)


class FileDataset(MetaDataset):
    """A dataset known by its files: source, digest, schema and row count, no data loaded."""

    def __init__(self, source, name: str, digest: str, schema: Schema | None, rows: int):
        self._rows = rows
        with warnings.catch_warnings():  # MLflow registers its local source twice (schemes "" and "file")
            warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
            resolved = resolve_dataset_source(Path(source).as_uri())
        super().__init__(resolved, name=name, digest=digest, schema=schema)

    @property
    def profile(self) -> dict:
        return {"num_rows": self._rows}  # the key MLflow's own PandasDataset profile uses

    def to_dict(self) -> dict[str, str]:
        return {**super().to_dict(), "profile": json.dumps(self.profile)}


def content_digest(root: str | Path, files) -> str:
    """SHA-256 over the names (relative to ``root``) and bytes of ``files``; a single file named by itself
    hashes its bytes only, so ``sha256sum`` gives its digest too. Cut to ``DIGEST_CHARS``."""
    root, files = Path(root), sorted(Path(f) for f in files)
    digest = hashlib.sha256()
    for file in files:
        if file != root:
            digest.update(str(file.relative_to(root)).encode() + b"\0")
        with open(file, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:DIGEST_CHARS]


def rounds_files(run_dir: str | Path) -> list[Path]:
    """The files a run directory's recording consists of: its manifest and recorded Parquet shards."""
    run_dir = Path(run_dir)
    return [run_dir / "manifest.json"] + sorted(p for part in ROUNDS_PARTS for p in (run_dir / part).glob("*.parquet"))


def rounds_dataset(run_dir: str | Path) -> FileDataset:
    """A run directory's recorded rounds (``<run>-rounds``), digest over manifest and shards."""
    run_dir = Path(run_dir).resolve()
    files = rounds_files(run_dir)
    shards = [f for f in files if f.parent.name == "rounds"]
    return FileDataset(run_dir / "rounds", f"{run_dir.name}-rounds", content_digest(run_dir, files),
                       parquet_schema(shards[0]) if shards else None, parquet_rows(shards))


def file_dataset(path: str | Path, name: str | None = None) -> FileDataset:
    """A Parquet (schema and rows read from its footer) or other file, digest over its bytes; named
    ``<run>-<stem>`` (``t1-features``) after the run directory it lies in, if any."""
    path = Path(path).resolve()
    parquet = path.suffix == ".parquet"
    run = next((d.name for d in path.parents[:3] if (d / "manifest.json").is_file()), None)
    name = name or (f"{run}-{path.stem}" if run else path.stem)
    return FileDataset(path, name, content_digest(path, [path]),
                       parquet_schema(path) if parquet else None, parquet_rows([path]) if parquet else _lines(path))


def log_dataset(dataset: FileDataset, context: str) -> None:
    """Log ``dataset`` to the active run under ``context`` (``input``, ``output``, ``training``, ...)."""
    mlflow.log_input(dataset, context=context)


def parquet_rows(files) -> int:
    return int(sum(pq.ParquetFile(f).metadata.num_rows for f in files))


def parquet_schema(path) -> Schema:
    """The MLflow schema of a Parquet file's columns (lists as arrays, dictionaries as strings)."""
    typed = [(_mlflow_type(field.type), field.name) for field in pq.read_schema(path)]
    return Schema([ColSpec(kind, name) for kind, name in typed if kind is not None])


def _mlflow_type(t):
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _mlflow_type(t.value_type)
        return None if inner is None else Array(inner)
    if pa.types.is_dictionary(t):
        return _mlflow_type(t.value_type)
    for check, kind in ((pa.types.is_boolean, DataType.boolean), (pa.types.is_integer, DataType.long),
                        (pa.types.is_floating, DataType.double), (pa.types.is_string, DataType.string),
                        (pa.types.is_large_string, DataType.string), (pa.types.is_binary, DataType.binary)):
        if check(t):
            return kind
    return None


def _lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


@lru_cache(maxsize=1)
def code_version_tags() -> dict[str, str]:
    """``specrank.version`` and, when the package runs from a git checkout, the commit (MLflow's own
    ``mlflow.source.git.commit``: the runs table's Version column) and whether tracked files differ from it."""
    tags = {"specrank.version": specrank.__version__}
    src = Path(specrank.__file__).resolve().parent
    if _git(src, "ls-files", "--error-unmatch", "__init__.py") is None:  # not tracked here: an installed copy
        return tags
    commit = _git(src, "rev-parse", "HEAD")
    if commit:
        tags[MLFLOW_GIT_COMMIT] = commit
        tags["specrank.git.dirty"] = "true" if _git(src, "status", "--porcelain", "--untracked-files=no") else "false"
    return tags


def _git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()
