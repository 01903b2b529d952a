"""MLflow runs: one parent run per experiment, nested runs per fold or trial, and their loggers."""

from __future__ import annotations

import hashlib
import math
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import mlflow
from PIL import Image

from specrank.files import directory_hash, file_hash  # noqa: F401  (re-exported)
from specrank.tracking.lineage import code_version_tags
from specrank.tracking.uri import TrackingError, check_tracking_uri, resolve_tracking_uri, tracking_store

_PARAM_VALUE_MAX = 6000  # MLflow's limit on one parameter value
_BATCH = 100  # MLflow's limit on parameters per batch call
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


# MLflow marks an experiment's kind with the experiment tag ``mlflow.experimentKind``;
# ``custom_model_development`` is model training (``ExperimentKind.CUSTOM_MODEL_DEVELOPMENT`` in
# mlflow/server/js/src/experiment-tracking/constants.ts; the experiment page's tab redirect,
# useNavigateToExperimentPageTab, sends it to the Runs tab and ``genai_development`` to Traces; MLflow's demo
# data generator, mlflow/demo/generators/traces.py, sets the tag the same way). MLflow 3.17's own UI ranks the
# browser's view choice above the tag (WorkflowTypeContext.tsx: the ``workflowType`` URL parameter, else the
# choice stored in the browser, default ``genai``), so a first visit needs ``runs_page``'s link.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"
WORKFLOW_PARAM = "workflowType=machine_learning"  # MLflow UI's "Model training" view
MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"  # mlflow.utils.mlflow_tags.MLFLOW_PARENT_RUN_ID
NOTE_TAG = "mlflow.note.content"  # a run's description in the UI (mlflow.utils.mlflow_tags.MLFLOW_RUN_NOTE)
PIPELINE_TAG = "specrank.pipeline"  # the pipeline run a run belongs to (its own name, inherited by its nested runs)
DIGITS = 7  # significant digits a metric keeps: more is noise in the UI, and 7 keeps every figure's meaning
_TAG_VALUE_MAX = 8000  # MLflow's limit on one tag value


@contextmanager
def experiment_run(
    experiment: str,
    run_name: str | None = None,
    tracking_uri: str | None = None,
    tags: Mapping[str, str] | None = None,
    description: str | None = None,
    span: tuple[float, float] | None = None,
) -> Iterator[mlflow.ActiveRun]:
    """A run of ``experiment`` at ``tracking_uri`` (checked reachable first), restoring the previous URI.

    Inside an active run of the same store and experiment (the demo's pipeline run), the run is its child.
    ``span`` (epoch seconds: start, end or None for the block's end) is when the work it records ran, for a
    run logged after the work began; without it the run is live (starts now, ends when the block does).
    Either way the run's metric ``wall_s`` is its duration. A run with such children (a pipeline) also logs
    ``stages_s``, the sum of its children's ``wall_s``, and ``outside_stages_s``, the rest of its own: the time
    its work spent in no stage run (the study's decoding and figures).
    """
    uri = check_tracking_uri(resolve_tracking_uri(tracking_uri))
    parent = mlflow.active_run()
    if parent is not None and mlflow.get_tracking_uri() != uri:
        raise TrackingError(f"a run of {mlflow.get_tracking_uri()} is active: cannot nest a run of {uri} under it")
    with tracking_store(uri):
        exp = ensure_experiment(experiment, uri)
        if parent is not None and parent.info.experiment_id != exp.experiment_id:
            raise TrackingError(f"a run of another experiment is active: cannot nest a run of {experiment!r} under it")
        with timed_run(run_name, exp.experiment_id, run_tags(tags, description), span) as run:
            yield run
        seconds = _WALL_SECONDS.pop(run.info.run_id, 0.0)
        if parent is not None:  # a stage of a pipeline run: its seconds count as the pipeline's stage time
            _STAGE_SECONDS[parent.info.run_id] = _STAGE_SECONDS.get(parent.info.run_id, 0.0) + seconds


@contextmanager
def timed_run(run_name: str | None, experiment_id: str | None, tags: dict, span: tuple[float, float] | None = None):
    """``mlflow.start_run`` (nested under the active run, if any) whose start and end are the work's own:
    now and the block's end, or ``span``'s (the run's duration in the UI then is the work's, not the few
    milliseconds its logging took). Logs ``wall_s``, the work's seconds."""
    parent = mlflow.active_run()
    tags = {**_inherited(parent), **tags}
    if span is None:
        start = time.time()
        with mlflow.start_run(run_name=run_name, experiment_id=experiment_id, nested=parent is not None,
                              tags=tags) as run:
            yield run
            _log_wall(run, time.time() - start)
        return
    client = mlflow.MlflowClient()
    experiment_id = experiment_id or parent.info.experiment_id  # nested_run: always under a parent
    parent_tag = {MLFLOW_PARENT_RUN_ID: parent.info.run_id} if parent else {}
    created = client.create_run(experiment_id, start_time=int(span[0] * 1000), tags={**tags, **parent_tag},
                                run_name=run_name)
    with mlflow.start_run(run_id=created.info.run_id, nested=parent is not None) as run:
        yield run
        end = time.time() if span[1] is None else span[1]
        _log_wall(run, end - span[0])
    client.set_terminated(created.info.run_id, "FINISHED", end_time=int(end * 1000))


def _inherited(parent) -> dict[str, str]:
    """The tags a nested run takes from its parent: the pipeline it belongs to."""
    if parent is None:
        return {}
    pipeline = mlflow.MlflowClient().get_run(parent.info.run_id).data.tags.get(PIPELINE_TAG)
    return {PIPELINE_TAG: pipeline} if pipeline else {}


# Seconds measured in this process, by run id: each run's ``wall_s`` and, for a pipeline run, its stage runs'
# sum. Kept here rather than read back from the store: MLflow only observes the work.
_WALL_SECONDS: dict[str, float] = {}
_STAGE_SECONDS: dict[str, float] = {}


def _log_wall(run, seconds: float) -> None:
    """``wall_s``, and for a run whose stage runs nested under it, ``stages_s`` and ``outside_stages_s``."""
    run_id = run.info.run_id
    _WALL_SECONDS[run_id] = seconds
    metrics = {"wall_s": seconds}
    if run_id in _STAGE_SECONDS:
        stages = _STAGE_SECONDS.pop(run_id)
        metrics.update(stages_s=stages, outside_stages_s=max(seconds - stages, 0.0))
    mlflow.log_metrics({k: rounded(v) for k, v in metrics.items()})


def ensure_experiment(name: str, uri: str):
    """The experiment called ``name`` in the current store, created (artifacts beside a SQLite store) and
    tagged as a model-training experiment when it is not already of a kind; made the active experiment."""
    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(name)
    if exp is None:
        client.create_experiment(name, artifact_location=local_artifact_root(uri),
                                 tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
    elif EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return mlflow.set_experiment(name)


def runs_page(experiment_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """The MLflow UI's Runs view of an experiment, in its "Model training" view whatever the browser chose before."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{WORKFLOW_PARAM}"


def run_page(experiment_id: str, run_id: str, base: str = "http://127.0.0.1:5000") -> str:
    """The MLflow UI's page of one run, in its "Model training" view (as ``runs_page``)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_PARAM}"


def run_tags(tags: Mapping[str, str] | None = None, description: str | None = None) -> dict[str, str]:
    """A run's tags: ``tags``, the code version (``specrank.tracking.lineage``) and the description."""
    out = {**code_version_tags(), **dict(tags or {})}
    if description:
        out[NOTE_TAG] = description[:_TAG_VALUE_MAX]
    return out


def local_artifact_root(uri: str) -> str | None:
    """``<db folder>/mlruns`` for a SQLite store, so artifacts sit beside the database whatever the
    working directory; None (the server's choice) for other stores."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///") :]).parent / "mlruns").resolve().as_uri()


@contextmanager
def nested_run(run_name: str, tags: Mapping[str, str] | None = None, description: str | None = None,
               span: tuple[float, float] | None = None) -> Iterator[mlflow.ActiveRun]:
    """A child run (a fold, a refit) of the active run, named ``<parent's name>/<run_name>`` (``demo-t1/3-train/
    rows-fold0``): unique across pipelines, and sorted by name it follows its parent; ``span`` as in
    ``experiment_run``."""
    parent = mlflow.active_run()
    if parent is None:
        raise RuntimeError("nested_run needs an active parent run (use experiment_run first)")
    with timed_run(f"{parent.info.run_name}/{run_name}", None, run_tags(tags, description), span) as run:
        yield run
    _WALL_SECONDS.pop(run.info.run_id, None)


def set_description(text: str) -> None:
    """Set the active run's description (the Markdown shown on its overview page)."""
    mlflow.set_tag(NOTE_TAG, text[:_TAG_VALUE_MAX])


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
    """Log finite metrics to the active run, rounded to ``DIGITS`` significant digits; non-finite values (an
    undefined share) are skipped."""
    clean = {metric_key(k): rounded(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    items = list(clean.items())
    for start in range(0, len(items), 10 * _BATCH):
        mlflow.log_metrics(dict(items[start : start + 10 * _BATCH]), step=step)


def rounded(value) -> float:
    """``value`` to ``DIGITS`` significant digits."""
    return float(f"{float(value):.{DIGITS}g}")


def log_frame(frame, name: str) -> None:
    """Log one DataFrame as an MLflow table (``tables/<name>.json``, shown in the UI) and as Parquet."""
    log_tables({name: frame})


def log_tables(frames: Mapping[str, object]) -> None:
    """Log DataFrames as MLflow tables (``tables/<name>.json``: browsable in the UI, read back by
    ``mlflow.load_table``) and as ``tables/<name>.parquet`` (one artifact upload)."""
    for name, frame in frames.items():
        mlflow.log_table(frame.reset_index(drop=True), artifact_file=f"tables/{name}.json")
    with tempfile.TemporaryDirectory() as tmp:
        for name, frame in frames.items():
            frame.to_parquet(Path(tmp) / f"{name}.parquet", index=False)
        mlflow.log_artifacts(tmp, artifact_path="tables")


def log_figure(figure, name: str) -> None:
    """Log a matplotlib figure, or a PNG file already rendered, as the image ``figures/<name>.png``."""
    if isinstance(figure, (str, Path)):
        with Image.open(figure) as image:
            mlflow.log_image(image.copy(), artifact_file=f"figures/{name}.png")
    else:
        mlflow.log_figure(figure, f"figures/{name}.png")


def log_report(markdown: str, name: str = "report.md") -> None:
    """Log a Markdown report at the artifact root."""
    mlflow.log_text(markdown, name)
