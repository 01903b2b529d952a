"""A migrated MLflow SQLite store built once per test session and copied per test (migrations take seconds),
and a real ``mlflow server`` on 127.0.0.1 over such a store."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest


def migrated_db(tmp_path_factory, folder: Path) -> Path:
    """Path of a fresh, already-migrated ``mlflow.db`` in ``folder`` (a copy of the session's template)."""
    template = tmp_path_factory.getbasetemp() / "mlflow_template" / "mlflow.db"
    if not template.is_file():
        from mlflow.tracking import MlflowClient

        template.parent.mkdir(exist_ok=True)
        MlflowClient(f"sqlite:///{template}").search_experiments()  # creates and migrates the schema
    path = folder / "mlflow.db"
    shutil.copy(template, path)
    return path


@pytest.fixture
def mlflow_db(tmp_path_factory, tmp_path):
    """Path of a fresh, already-migrated ``mlflow.db`` inside this test's ``tmp_path``."""
    return migrated_db(tmp_path_factory, tmp_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_server(db: Path):
    """The URI of a tracking server over SQLite ``db`` with proxied artifacts beside it, stopped on exit."""
    root = db.parent
    port = free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{db}", "--artifacts-destination", str(root / "artifacts")]
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
