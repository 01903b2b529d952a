"""specrank.tracking against a real ``mlflow server`` on 127.0.0.1, started and stopped by the test module."""

from __future__ import annotations

import pytest

from mlflow_store import mlflow_server  # noqa: F401  (fixture)
from test_tracking import check_logged, log_experiment, small_reranker

# These tests share costly module fixtures: pytest-xdist keeps them on one worker.
pytestmark = pytest.mark.xdist_group("mlflow-server")


def test_server_receives_nested_runs_metrics_figure_and_model(mlflow_server):  # noqa: F811
    reranker, features = small_reranker()
    run_id, model_uri = log_experiment(mlflow_server, reranker, features)
    check_logged(mlflow_server, run_id, model_uri, reranker, features)
