"""MLflow conventions: tracking URI, parent and nested runs, params/metrics/tables/figures, reranker models,
datasets and code version (lineage), the Model Registry."""

import os

# MLflow's usage telemetry would reach for the network on import; this package works offline.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from specrank.tracking.models import RerankerModel, log_reranker, model_name, resolve_reranker  # noqa: E402
from specrank.tracking.registry import register_reranker  # noqa: E402
from specrank.tracking.runs import (  # noqa: E402
    EXPERIMENT_KIND_TAG,
    MODEL_TRAINING,
    directory_hash,
    ensure_experiment,
    experiment_run,
    file_hash,
    flatten_params,
    log_figure,
    log_frame,
    log_metrics,
    log_params,
    log_report,
    log_tables,
    metric_key,
    nested_run,
    set_description,
)
from specrank.tracking.trials import TrialLogger  # noqa: E402
from specrank.tracking.uri import TrackingError, check_tracking_uri, resolve_tracking_uri  # noqa: E402

__all__ = [
    "EXPERIMENT_KIND_TAG",
    "MODEL_TRAINING",
    "RerankerModel",
    "TrackingError",
    "TrialLogger",
    "check_tracking_uri",
    "directory_hash",
    "ensure_experiment",
    "experiment_run",
    "file_hash",
    "flatten_params",
    "log_figure",
    "log_frame",
    "log_metrics",
    "log_params",
    "log_report",
    "log_tables",
    "log_reranker",
    "metric_key",
    "model_name",
    "nested_run",
    "resolve_reranker",
    "register_reranker",
    "resolve_tracking_uri",
    "set_description",
]
