"""specrank.tracking against a real ``mlflow server`` on 127.0.0.1, started and stopped by the test."""

from __future__ import annotations

from mlflow_store import mlflow_db, mlflow_server  # noqa: F401  (fixture)
from test_tracking import check_logged, log_experiment, small_reranker


def test_server_receives_nested_runs_metrics_figure_and_model(mlflow_db):  # noqa: F811
    reranker, features = small_reranker()
    with mlflow_server(mlflow_db) as uri:
        run_id, model_uri = log_experiment(uri, reranker, features)
        check_logged(uri, run_id, model_uri, reranker, features)
