"""``specrank online`` in MLflow: the strategies' realized and expected acceptance, speed and time split as
metrics, every table as an MLflow table, the acceptance figure; timed as the decoding was."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pandas as pd

from specrank.evaluation.figures import acceptance_figure
from specrank.tracking.runs import experiment_run, log_figure, log_metrics, log_params, log_tables

DECODER_COLUMNS = ("tokens_per_pass", "tokens_per_s", "passes", "draft_share", "root_pass_share", "tree_pass_share",
                   "rerank_share", "bookkeeping_share", "root_pass_hidden_share")
UNITS = ("`<strategy>.realized.*` / `<strategy>.expected.*` are accepted draft tokens per round (mean and 95% "
         "prompt-bootstrap interval), `*.tokens_per_s` tokens per second, `*_share` fractions of the decoding "
         "time, `*.speed_vs_<base>.*` tokens/s ratios to the base strategy; `wall_s` this run's seconds.")


def online_metrics(tables: Mapping[str, pd.DataFrame]) -> dict[str, float]:
    """``<strategy>.<statistic>.<mean|low|high>``, ``<strategy>.<column>`` and ``<strategy>.speed_vs_<base>.*``."""
    metrics = {}
    for _, r in tables["online_acceptance"].iterrows():
        for k in ("mean", "low", "high"):
            metrics[f"{r['strategy']}.{r['statistic']}.{k}"] = r[k]
    for _, r in tables["online_strategies"].iterrows():
        for k in DECODER_COLUMNS:
            metrics[f"{r['strategy']}.{k}"] = r[k]
    for _, r in tables["online_speed"].iterrows():
        for k in ("ratio", "low", "high"):
            metrics[f"{r['strategy']}.speed_vs_{r['base']}.{k}"] = r[k]
    return metrics


def log_online(uri: str, experiment: str, run_name: str, params: Mapping, tables: Mapping[str, pd.DataFrame],
               started: float | None = None) -> str:
    """One run for one ``specrank online`` whose decoding began at ``started`` (epoch seconds; default now):
    ``params``, ``online_metrics``, the tables and the realized-acceptance figure. Returns its id."""
    strategies = ", ".join(tables["online_strategies"]["strategy"].astype(str))
    note = f"Online decoding with {strategies} in the loop: realized against expected acceptance, and speed.\n\n{UNITS}"
    span = (time.time() if started is None else started, None)
    with experiment_run(experiment, run_name=run_name, tracking_uri=uri, tags={"specrank.stage": "online"},
                        description=note, span=span) as run:
        log_params(params)
        log_metrics(online_metrics(tables))
        log_tables(tables)
        log_figure(acceptance_figure(tables["online_acceptance"]), "realized_acceptance")
        return run.info.run_id
