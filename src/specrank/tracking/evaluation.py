"""An offline evaluation in MLflow: a few dozen headline metrics for comparing runs, the full tables as MLflow
tables and Parquet, figures as images, the report as Markdown and as HTML, and one nested run per fold."""

from __future__ import annotations

import mlflow
import pandas as pd

from specrank.evaluation.names import rerankers
from specrank.evaluation.report import headline_table
from specrank.tracking.models import log_reranker, model_name
from specrank.tracking.runs import log_figure, log_metrics, log_params, log_report, log_tables, nested_run

FOLD_SPLIT = "fold"
MAX_METRICS = 60  # per run: beyond a few dozen, MLflow's charts and runs table stop reading at a glance
UNITS = ("`value.draft.b<B>` is draft selection's expected accepted draft tokens per round at budget B on the "
         "recorded rounds; `gain_tokens.<score>.b<B>` a score's gain over it in the same unit, with its 95% paired "
         "prompt-bootstrap interval (`.low`, `.high`); `root_share.<score>.b<B>` the percentage of root selection's "
         "gain a score recovers (above 100 when it beats root); `top1_argmax_pct.<score>` the percentage of rounds "
         "whose top candidate by the estimated first factor is the target's argmax (greedy: of rounds whose first "
         "level holds it), `ff_mse_pct_of_draft.<score>` the first factor's squared error as a percentage of the "
         "draft's. Every score, budget and split is in the tables under Artifacts, `tables/`.")


def _gain(at: pd.DataFrame, score: str, b: int, share: bool) -> dict[str, float]:
    """``gain_tokens.<score>.b<b>`` with its interval, and (``share``) ``root_share.<score>.b<b>``."""
    if score not in at.index:
        return {}
    r, key = at.loc[score], f"gain_tokens.{score}.b{b}"
    out = {key: r["gain"], f"{key}.low": r["gain_low"], f"{key}.high": r["gain_high"]}
    if share:
        out[f"root_share.{score}.b{b}"] = r["root_share"]
    return out


def headline_metrics(table: pd.DataFrame, budgets, first_factor: pd.DataFrame | None = None) -> dict[str, float]:
    """At most ``MAX_METRICS`` self-explaining metrics of a score x budget table (the summary, or one split
    group's rows): draft's value, root's and oracle's gains, each reranker's gain and share of root's gain at
    the first two ``budgets``, and each reranker's first-factor accuracy. Rerankers past the limit are left out
    (they stay in the tables)."""
    budgets = list(budgets)[:2]
    at = {b: table[table["budget"] == b].set_index("score") for b in budgets}
    out = {"n_rounds": float(table["rounds"].max())}
    for b in budgets:
        if "draft" in at[b].index:
            out[f"value.draft.b{b}"] = at[b].loc["draft", "mean"]
        out.update(_gain(at[b], "root", b, share=False))
        if "oracle" in at[b].index:
            out[f"gain_tokens.oracle.b{b}"] = at[b].loc["oracle", "gain"]
    ff = None if first_factor is None else first_factor.set_index("estimate")
    if ff is not None and "draft" in ff.index:
        out["top1_argmax_pct.draft"] = ff.loc["draft", "top1_hit_pct"]
    for score in rerankers(table["score"].unique()):
        more = {k: v for b in budgets for k, v in _gain(at[b], score, b, share=True).items()}
        if ff is not None and score in ff.index:
            more[f"top1_argmax_pct.{score}"] = ff.loc[score, "top1_hit_pct"]
            more[f"ff_mse_pct_of_draft.{score}"] = ff.loc[score, "mse_pct_of_draft"]
        if len(out) + len(more) > MAX_METRICS:
            break
        out.update(more)
    return {k: float(v) for k, v in out.items()}


def evaluation_note(evaluation, title: str, table: pd.DataFrame | None = None) -> str:
    """A run description: what was evaluated, the headline table, and the units."""
    meta = evaluation.meta
    table = evaluation.summary if table is None else table
    budgets = meta.get("headline_budgets") or sorted(table["budget"].unique())[:2]
    return (f"{title}: {meta.get('law', '?')} decoding, {int(table['rounds'].max())} rounds, "
            f"{meta.get('bootstrap', '?')} bootstrap resamples. {UNITS}\n\n{headline_table(table, budgets)}")


def log_evaluation(evaluation, figures: dict | None = None, report: str | None = None, models: dict | None = None,
                   example: pd.DataFrame | None = None, *, report_html: str | None = None,
                   model_prefix: str | None = None, span: tuple[float, float | None] | None = None) -> dict[str, str]:
    """Log headline metrics, tables, figures and report to the active run, and each fold's to a nested run.

    ``figures`` maps names to matplotlib Figures or to PNG files already written (logged as images).
    ``models`` maps a fold (``"0"``, ``"1"``) to {reranker name: the model that scored that fold}; each
    is logged as a pyfunc model ``<model_prefix>-<name>-fold<f>`` in the fold's nested run, with ``example``
    features for its signature. ``span`` times the fold runs (one evaluation scores both folds at once).
    Returns ``{"<name>-fold<f>": model URI}``.
    """
    budgets = evaluation.meta.get("headline_budgets") or sorted(evaluation.summary["budget"].unique())[:2]
    log_metrics(headline_metrics(evaluation.summary, budgets, evaluation.first_factor)
                | {"n_prompts": float(evaluation.meta.get("prompts", 0))})
    log_tables(evaluation.tables())
    for name, fig in (figures or {}).items():
        log_figure(fig, name)
    if report is not None:
        log_report(report)
    if report_html is not None:
        log_report(report_html, "report.html")
    folds = evaluation.splits[evaluation.splits["split_kind"] == FOLD_SPLIT]
    uris = {}
    for group, table in folds.groupby("group", sort=True):
        note = evaluation_note(evaluation, f"Fold {group} (prompt index % 2 = {group}), scored by models fitted "
                                           "on the other fold", table)
        with nested_run(f"fold-{group}", tags={"specrank.fold": str(group)}, description=note, span=span):
            log_metrics(headline_metrics(table, budgets))
            for name, model in (models or {}).get(str(group), {}).items():
                uris[f"{name}-fold{group}"] = log_reranker(model, model_name(model_prefix, name, group), example)
    return uris


def link_evaluated_models(predictions_digest: str) -> pd.DataFrame:
    """List, in the active run, the logged fold models that made the predictions it evaluated: those of the
    ``train`` run in this experiment whose output dataset has ``predictions_digest``. They go in the param
    ``evaluated_models`` and the table ``tables/evaluated_models.json`` with their ``models:/`` URIs (MLflow's
    own run -> model inputs are Databricks-only); returns the table (empty when no such run)."""
    client = mlflow.MlflowClient()
    active = mlflow.active_run()
    experiment = active.info.experiment_id
    trains = client.search_runs([experiment], filter_string="tags.`specrank.stage` = 'train'", max_results=200)
    producers = [r.info.run_id for r in trains
                 if any(i.dataset.digest == predictions_digest for i in r.inputs.dataset_inputs)]
    if not producers:
        return pd.DataFrame(columns=["model", "reranker", "fold", "uri"])
    children = {r.info.run_id for r in client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{producers[-1]}'", max_results=500)}
    models = [m for m in client.search_logged_models([experiment], max_results=500)
              if m.source_run_id in children and m.tags.get("specrank.fold", "all") != "all"]
    table = pd.DataFrame([{"model": m.name, "reranker": m.tags.get("specrank.reranker", ""),
                           "fold": m.tags.get("specrank.fold", ""), "uri": f"models:/{m.model_id}"}
                          for m in sorted(models, key=lambda m: m.name)],
                         columns=["model", "reranker", "fold", "uri"])
    if len(table):
        log_params({"evaluated_models": list(table["model"])})
        log_tables({"evaluated_models": table})
    return table
