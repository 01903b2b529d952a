"""specrank.tracking against a real ``mlflow server`` on 127.0.0.1, started and stopped by the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from mlflow_store import mlflow_db  # noqa: F401  (fixture)
from test_tracking import check_logged, free_port, log_experiment, small_reranker


@pytest.fixture
def mlflow_server(mlflow_db):
    """The URI of a fresh tracking server with a (pre-migrated) SQLite backend and proxied artifacts."""
    root = mlflow_db.parent
    port = free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{mlflow_db}", "--artifacts-destination", str(root / "artifacts")]
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.25)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker share this group
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_server_receives_nested_runs_metrics_figure_and_model(mlflow_server):
    reranker, features = small_reranker()
    run_id, model_uri = log_experiment(mlflow_server, reranker, features)
    check_logged(mlflow_server, run_id, model_uri, reranker, features)
