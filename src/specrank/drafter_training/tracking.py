"""MLflow logging of a head's training; a resumed training continues the same run (its id is kept
beside the checkpoint). The tracking URI is set only while the run is open, then restored."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import mlflow

from specrank.tracking.runs import ensure_experiment
from specrank.tracking.uri import tracking_store

EXPERIMENT = "specrank-drafter"
RUN_ID_FILE = "mlflow_run_id"


class RunLogger:
    """Metrics to one MLflow run, or nowhere when built without a run."""

    def __init__(self, run=None, store: ExitStack | None = None):
        self.run = run
        self._store = store or ExitStack()

    @classmethod
    def open(cls, uri: str | None, params: dict, out_dir) -> RunLogger:
        """Start (or resume) the run of ``out_dir`` at tracking ``uri``; None logs nowhere."""
        if uri is None:
            return cls()
        store = ExitStack()
        store.enter_context(tracking_store(uri))
        try:
            ensure_experiment(EXPERIMENT, uri)  # tagged as a model-training experiment
            id_file = Path(out_dir) / RUN_ID_FILE
            run_id = id_file.read_text().strip() if id_file.exists() else None
            run = mlflow.start_run(run_id=run_id, run_name=None if run_id else f"eagle3-{Path(out_dir).name}")
            if run_id is None:
                mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
                id_file.parent.mkdir(parents=True, exist_ok=True)
                id_file.write_text(run.info.run_id)
        except BaseException:
            store.close()
            raise
        return cls(run, store)

    def log(self, metrics: dict, step: int) -> None:
        if self.run is not None:
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        if self.run is not None:
            mlflow.end_run()
        self._store.close()
