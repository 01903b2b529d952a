"""MLflow stores for tests: a migrated SQLite store built once per session and copied per test (migrations take
seconds), and a real ``mlflow server`` on 127.0.0.1, started once per test module."""

from __future__ import annotations

import shutil
from contextlib import contextmanager

import pytest

from specrank.tracking.server import local_mlflow


def migrated_db(tmp_path_factory, dest):
    """Copy a fresh, already-migrated ``mlflow.db`` to ``dest``; return ``dest``."""
    template = tmp_path_factory.getbasetemp() / "mlflow_template" / "mlflow.db"
    if not template.is_file():
        from mlflow.tracking import MlflowClient

        template.parent.mkdir(exist_ok=True)
        MlflowClient(f"sqlite:///{template}").search_experiments()  # creates and migrates the schema
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, dest)
    return dest


@pytest.fixture
def mlflow_db(tmp_path_factory, tmp_path):
    """Path of a fresh, already-migrated ``mlflow.db`` inside this test's ``tmp_path``."""
    return migrated_db(tmp_path_factory, tmp_path / "mlflow.db")


@contextmanager
def serve(db, root):
    """The URI of a tracking server with SQLite backend ``db`` and proxied artifacts under ``root``."""
    args = ["--backend-store-uri", f"sqlite:///{db}", "--artifacts-destination", str(root / "artifacts")]
    with local_mlflow("server", args, root / "server.log", cwd=root) as uri:
        yield uri


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """One real tracking server for the test module (its runs accumulate; tests use their own experiments)."""
    root = tmp_path_factory.mktemp("mlflow_server")
    with serve(migrated_db(tmp_path_factory, root / "mlflow.db"), root) as uri:
        yield uri
