"""Every test starts without an MLflow tracking URI and leaves none behind.

MLflow keeps the URI in a global and in ``$MLFLOW_TRACKING_URI`` (``mlflow.set_tracking_uri`` writes
both), so one test that sets it would send every later test's default store there; and a developer's
own ``$MLFLOW_TRACKING_URI`` must not receive test runs.
"""

import os
import sys

import pytest

MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@pytest.fixture(autouse=True)
def no_mlflow_uri(monkeypatch):
    for key in MLFLOW_ENV:
        monkeypatch.delenv(key, raising=False)
    yield
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
    for key in MLFLOW_ENV:
        os.environ.pop(key, None)


@pytest.fixture(autouse=True)
def benchmark_results_elsewhere(monkeypatch, tmp_path_factory):
    """Benchmarks run by tests (tiny shapes) write their results file outside ``benchmarks/results``."""
    monkeypatch.setenv("SPECRANK_BENCH_RESULTS", str(tmp_path_factory.mktemp("bench-results")))
