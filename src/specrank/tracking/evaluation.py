"""An offline evaluation as MLflow metrics, tables, figures and report, with one nested run per fold."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd

from specrank.tracking.models import log_reranker
from specrank.tracking.runs import log_figure, log_metrics, log_report, log_tables, nested_run

STATS = ("mean", "gain", "gain_pct", "oracle_share", "root_share")
FOLD_SPLIT = "fold"


def _stat_metrics(table: pd.DataFrame, prefix: pd.Series, stats=STATS) -> dict[str, float]:
    """``{<prefix>.<stat>[_low|_high]: value}`` for every row of ``table`` and stat column present (NaN skipped)."""
    cols = [f"{stat}{suffix}" for stat in stats for suffix in ("", "_low", "_high") if f"{stat}{suffix}" in table]
    if table.empty or not cols:
        return {}
    long = table[cols].set_axis(prefix.to_numpy(), axis=0).stack().dropna()  # (prefix, column) -> value
    keys = [f"{p}.{c}" for p, c in long.index]
    return dict(zip(keys, long.to_numpy(dtype=float)))


def _prefix(table: pd.DataFrame, *columns: str, budget: bool = True) -> pd.Series:
    """Dot-joined key prefix per row: the given columns, then ``B<budget>``."""
    parts = [table[c].astype(str) for c in columns] + ([("B" + table["budget"].astype(str))] if budget else [])
    out = parts[0]
    for part in parts[1:]:
        out = out + "." + part
    return out


def summary_metrics(summary: pd.DataFrame) -> dict[str, float]:
    """``<rule>.B<budget>.<stat>[_low|_high]`` for every rule and budget."""
    return _stat_metrics(summary, _prefix(summary, "rule"))


def evaluation_metrics(evaluation) -> dict[str, float]:
    """Every value and interval of an evaluation, except the per-fold ones (logged in nested runs)."""
    out = summary_metrics(evaluation.summary)
    splits = evaluation.splits[evaluation.splits["split_kind"] != FOLD_SPLIT]
    out.update(_stat_metrics(splits, _prefix(splits, "split_kind", "group", "rule")))
    shares = splits.drop_duplicates(["split_kind", "group"])
    out.update(_stat_metrics(shares, _prefix(shares, "split_kind", "group", budget=False), ("round_share",)))
    ff = evaluation.first_factor
    ff_stats = ("mse", "mse_pct_of_draft", "top1_hit_pct")
    out.update(_stat_metrics(ff, "first_factor." + ff["estimate"].astype(str), ff_stats))
    cmp = evaluation.comparisons
    if not cmp.empty:
        out.update(_stat_metrics(cmp, "paired." + cmp["rule"] + "-" + _prefix(cmp, "base"), ("gain", "gain_pct")))
    w = evaluation.mixture_weights
    if not w.empty:
        keys = "mix_weight." + w["rule"] + ".half" + w["half"].astype(str) + ".B" + w["budget"].astype(str)
        out.update(dict(zip(keys, w["weight"].to_numpy(dtype=float))))
    return out


def log_evaluation(evaluation, figures: dict | None = None, report: str | None = None, models: dict | None = None,
                   example: pd.DataFrame | None = None) -> dict[str, str]:
    """Log metrics, tables, figures and report to the active run, and each fold's metrics to a nested run.

    ``figures`` maps names to matplotlib Figures, or to PNG files already written (logged as they are).
    ``models`` maps a fold (``"0"``, ``"1"``) to {reranker name: the model that scored that fold}; each
    is logged as a pyfunc model in the fold's nested run, with ``example`` features for its signature.
    Returns ``{"<name>-fold<f>": model URI}``.
    """
    log_metrics(evaluation_metrics(evaluation))
    log_tables(evaluation.tables())
    for name, fig in (figures or {}).items():
        if isinstance(fig, (str, Path)):
            mlflow.log_artifact(str(fig), artifact_path="figures")
        else:
            log_figure(fig, name)
    if report is not None:
        log_report(report)
    folds = evaluation.splits[evaluation.splits["split_kind"] == FOLD_SPLIT]
    uris = {}
    for group, table in folds.groupby("group", sort=True):
        with nested_run(f"fold-{group}", tags={"specrank.fold": str(group)}):
            log_metrics(summary_metrics(table) | {"rounds": float(table["rounds"].iloc[0])})
            for name, model in (models or {}).get(str(group), {}).items():
                uris[f"{name}-fold{group}"] = log_reranker(model, name, example)
    return uris
