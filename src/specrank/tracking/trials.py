"""Optuna studies in MLflow: one run per study, its trials as a table and its optimisation history as a figure
(not one run per trial: a study's dozen trial runs would push the stages off the runs table's first page)."""

from __future__ import annotations

import pandas as pd

from specrank.tracking.runs import log_figure, log_params, log_tables

TRIALS_TABLE = "trials"  # tables/trials.json in the study's run
HISTORY_FIGURE = "optimization_history"  # figures/optimization_history.png


class TrialLogger:
    """Optuna callback (``study.optimize(..., callbacks=[TrialLogger()])``) that keeps every finished trial;
    ``log()`` then writes the study to the active run."""

    def __init__(self, metric_name: str = "objective"):
        self.metric_name = metric_name
        self.study_name: str | None = None
        self.direction = "minimize"
        self.rows: list[dict] = []

    def __call__(self, study, trial) -> None:
        self.study_name = study.study_name
        self.direction = study.directions[0].name.lower()
        row = {"trial": trial.number, "state": trial.state.name, self.metric_name: (trial.values or [None])[0]}
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete else None
        row.update({"seconds": seconds, **{f"param.{k}": v for k, v in trial.params.items()}})
        self.rows.append(row)

    def table(self) -> pd.DataFrame:
        """One row per trial: number, state, objective, seconds, the settings tried (``param.*``)."""
        return pd.DataFrame(self.rows)

    def log(self) -> None:
        """The study's name, trial count and best value as params, the trials table and the history figure."""
        if not self.rows:
            return
        table = self.table()
        best = table[self.metric_name].min() if self.direction == "minimize" else table[self.metric_name].max()
        log_params({"study": self.study_name, "study_trials": len(table), f"study_best_{self.metric_name}": best})
        log_tables({TRIALS_TABLE: table})
        log_figure(history_figure(table, self.metric_name, self.study_name, self.direction), HISTORY_FIGURE)


def history_figure(table: pd.DataFrame, metric: str, study: str | None, direction: str = "minimize"):
    """Optuna's optimisation-history plot in matplotlib (no plotly): each trial's objective and the best so far."""
    from matplotlib.figure import Figure

    values = table[metric].astype(float)
    best = values.cummin() if direction == "minimize" else values.cummax()
    fig = Figure(figsize=(6.0, 3.6))
    ax = fig.subplots()
    ax.plot(table["trial"], values, "o", ms=4, color="tab:blue", label=f"trial {metric}")
    ax.step(table["trial"], best, where="post", color="tab:red", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"Optimisation history of study {study}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
