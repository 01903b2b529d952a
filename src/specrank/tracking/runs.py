"""MLflow runs: one parent run per experiment, nested runs per fold or trial, and their loggers."""

from __future__ import annotations

import hashlib
import math
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import mlflow

from specrank.tracking.uri import check_reachable, resolve_tracking_uri, tracking_store

_PARAM_VALUE_MAX = 6000  # MLflow's limit on one parameter value
_BATCH = 100  # MLflow's limit on parameters per batch call
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


@contextmanager
def experiment_run(
    experiment: str,
    run_name: str | None = None,
    tracking_uri: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """Parent run of ``experiment`` at ``tracking_uri`` (checked reachable first), restoring the previous URI."""
    uri = check_reachable(resolve_tracking_uri(tracking_uri))
    with tracking_store(uri):
        if mlflow.get_experiment_by_name(experiment) is None:
            mlflow.create_experiment(experiment, artifact_location=local_artifact_root(uri))
        mlflow.set_experiment(experiment)
        with mlflow.start_run(run_name=run_name, tags=dict(tags or {})) as run:
            yield run


def local_artifact_root(uri: str) -> str | None:
    """``<db folder>/mlruns`` for a SQLite store, so artifacts sit beside the database whatever the
    working directory; None (the server's choice) for other stores."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///") :]).parent / "mlruns").resolve().as_uri()


@contextmanager
def nested_run(run_name: str, tags: Mapping[str, str] | None = None) -> Iterator[mlflow.ActiveRun]:
    """A child run (a fold, an Optuna trial) of the active run."""
    if mlflow.active_run() is None:
        raise RuntimeError("nested_run needs an active parent run (use experiment_run first)")
    with mlflow.start_run(run_name=run_name, nested=True, tags=dict(tags or {})) as run:
        yield run


def flatten_params(params: Mapping, prefix: str = "") -> dict[str, str]:
    """Nested mapping -> ``{"a.b": "value"}``, lists joined by commas, values cut to MLflow's limit."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, prefix=f"{name}."))
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        flat[metric_key(name)] = str(value)[:_PARAM_VALUE_MAX]
    return flat


def metric_key(name: str) -> str:
    """``name`` with characters MLflow rejects in keys replaced by ``_``."""
    return _BAD_KEY.sub("_", str(name))


def log_params(params: Mapping) -> None:
    """Log a (nested) mapping of parameters to the active run, in MLflow-sized batches."""
    flat = list(flatten_params(params).items())
    for start in range(0, len(flat), _BATCH):
        mlflow.log_params(dict(flat[start : start + _BATCH]))


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log finite metrics to the active run; non-finite values (an undefined share) are skipped."""
    clean = {metric_key(k): float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    items = list(clean.items())
    for start in range(0, len(items), 10 * _BATCH):
        mlflow.log_metrics(dict(items[start : start + 10 * _BATCH]), step=step)


def log_frame(frame, name: str) -> None:
    """Log one DataFrame as an MLflow table (``tables/<name>.json``, shown in the UI) and as Parquet."""
    mlflow.log_table(frame.reset_index(drop=True), artifact_file=f"tables/{name}.json")
    log_tables({name: frame})


def log_tables(frames: Mapping[str, object]) -> None:
    """Log DataFrames as ``tables/<name>.parquet`` and ``.csv`` in one artifact upload."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, frame in frames.items():
            frame.to_parquet(Path(tmp) / f"{name}.parquet", index=False)
            frame.to_csv(Path(tmp) / f"{name}.csv", index=False)
        mlflow.log_artifacts(tmp, artifact_path="tables")


def log_figure(figure, name: str) -> None:
    """Log a matplotlib figure as ``figures/<name>.png``."""
    mlflow.log_figure(figure, f"figures/{name}.png")


def log_report(markdown: str, name: str = "report.md") -> None:
    """Log a Markdown report at the artifact root."""
    mlflow.log_text(markdown, name)


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
