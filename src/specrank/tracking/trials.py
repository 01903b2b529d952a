"""Optuna trials as nested MLflow runs of the active parent run."""

from __future__ import annotations

from specrank.tracking.runs import log_metrics, log_params, nested_run


class TrialLogger:
    """Optuna callback (``study.optimize(..., callbacks=[TrialLogger()])``): one nested run per finished trial."""

    def __init__(self, metric_name: str = "objective"):
        self.metric_name = metric_name

    def __call__(self, study, trial) -> None:
        note = (f"Optuna trial {trial.number} of study `{study.study_name}`: `{self.metric_name}` is its objective "
                f"({', '.join(d.name.lower() for d in study.directions)}), `trial.*` the settings it tried.")
        with nested_run(f"trial-{trial.number}", tags={"optuna.study": study.study_name}, description=note):
            log_params({"trial": trial.params, "trial_number": trial.number, "state": trial.state.name})
            values = trial.values or []
            names = [self.metric_name] if len(values) == 1 else [f"{self.metric_name}_{i}" for i in range(len(values))]
            numeric = {f"attr.{k}": v for k, v in trial.user_attrs.items() if isinstance(v, (int, float))}
            log_metrics(dict(zip(names, values)) | numeric)
