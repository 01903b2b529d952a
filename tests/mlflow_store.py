"""A migrated MLflow SQLite store built once per test session and copied per test (migrations take seconds)."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture
def mlflow_db(tmp_path_factory, tmp_path):
    """Path of a fresh, already-migrated ``mlflow.db`` inside this test's ``tmp_path``."""
    template = tmp_path_factory.getbasetemp() / "mlflow_template" / "mlflow.db"
    if not template.is_file():
        from mlflow.tracking import MlflowClient

        template.parent.mkdir(exist_ok=True)
        MlflowClient(f"sqlite:///{template}").search_experiments()  # creates and migrates the schema
    path = tmp_path / "mlflow.db"
    shutil.copy(template, path)
    return path
