"""A pipeline run (the demo's or the study's, one per temperature) as the headline of its experiment: every score's
share of root selection's gain at both budgets as metrics and a figure, a few curated metrics, the headline table
as an MLflow table, report.html, a link to the registered champion; and the experiment's own description."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd

from specrank.evaluation.figures import root_share_figure
from specrank.evaluation.report import headline_table
from specrank.evaluation.names import label, ordered
from specrank.experiments.study.tables import summary_budget_figures
from specrank.tracking.runs import (NOTE_TAG, log_figure, log_metrics, log_report, log_tables, metric_key,
                                   set_description)

HEADLINE_TABLE = "headline"  # tables/headline.json of the pipeline run
HEADLINE_FIGURE = "root_share"  # figures/root_share.png of the pipeline run
ROOT_SHARE = "root_share"  # metrics root_share.<score>.b<B> (and .low, .high)
CHAMPION_TAG = "specrank.champion"  # the pipeline run's link to its registered model version
UNITS = ("`draft_tokens_B*` is draft selection's expected accepted draft tokens per round at budget B; "
         "`*_gain_tokens_B*` are gains over it in the same unit (held-out, cross-fitted); `root_share.<score>.b*` the "
         "% of root selection's gain each score recovers, `.low` / `.high` its 95% interval (the figure "
         "`figures/root_share.png`); `*_heldout_mse` the first factor's held-out squared "
         "error per candidate (fold mean), the champion's criterion; `decode_tokens_per_s` the recording's "
         "speed; `wall_s` this run's seconds, `stages_s` those of its stage runs, `outside_stages_s` the rest.")


def headline_frame(summary: pd.DataFrame, budgets) -> pd.DataFrame:
    """The headline table as rows: score (and its label) x headline budget, value, gain with its interval,
    share of root's gain."""
    rows = summary[summary["budget"].isin(list(budgets))]
    cols = ["score", "budget", "mean", "gain", "gain_low", "gain_high", "gain_pct", "root_share"]
    out = rows[[c for c in cols if c in rows]].copy()
    out.insert(1, "label", out["score"].map(label))
    order = {r: i for i, r in enumerate(ordered(out["score"].unique()))}
    return out.sort_values(["budget", "score"], key=lambda s: s.map(order) if s.name == "score" else s,
                           kind="stable").reset_index(drop=True)


def pipeline_metrics(summary: pd.DataFrame, budget: int, train: dict, decode: dict, champion: str | None) -> dict:
    """About eight numbers to read first: draft's value, root's, Rows' and the champion's gains at ``budget``,
    the champion's and draft's held-out MSE, the prompts and the decoding speed (the shares of root's gain are
    ``headline_metrics``')."""
    at = summary[summary["budget"] == budget].set_index("score")
    out = {"n_prompts": train.get("n_prompts"), "n_rounds": at["rounds"].max() if "rounds" in at else None}
    if "draft" in at.index:
        out[f"draft_tokens_B{budget}"] = at.loc["draft", "mean"]
    for score in dict.fromkeys(["root", "rows", champion]):
        if score in at.index:
            out[f"{score}_gain_tokens_B{budget}"] = at.loc[score, "gain"]
    if champion and f"{champion}_heldout_mse" in train:
        out["champion_heldout_mse"] = train[f"{champion}_heldout_mse"]
    out["draft_heldout_mse"] = train.get("draft_heldout_mse")
    out["decode_tokens_per_s"] = decode.get("tokens_per_s")
    return {k: float(v) for k, v in out.items() if v is not None}


def log_pipeline(evaluation, report_html: Path, train: dict, decode: dict, version, title: str) -> None:
    """The active (pipeline) run's metrics, headline table, report.html, champion link and description."""
    budgets = evaluation.meta["headline_budgets"]
    champion = version.tags.get("specrank.reranker") if version is not None else None
    log_metrics(pipeline_metrics(evaluation.summary, budgets[0], train, decode, champion))
    log_headline({"budgets": summary_budget_figures(evaluation.summary, budgets)}, evaluation.meta)
    log_tables({HEADLINE_TABLE: headline_frame(evaluation.summary, budgets)})
    if Path(report_html).is_file():
        log_report(Path(report_html).read_text(), "report.html")
    lines = [title, ""]
    if version is not None:
        uri = f"models:/{version.name}/{version.version}"
        mlflow.set_tags({CHAMPION_TAG: uri, "specrank.champion_reranker": champion})
        lines += [f"Champion: **{champion}**, [{version.name} version {version.version}](#/models/{version.name}/"
                  f"versions/{version.version}) (`{uri}`, alias `models:/{version.name}@champion`).", ""]
    lines += ["Each score's share of root selection's gain: `figures/root_share.png` and the metrics "
              "`root_share.<score>.b<B>`.", "",
              "Expected accepted draft tokens per round, held out (95% prompt-bootstrap intervals); every budget "
              "and split is in the `4-evaluate` run's tables, this table in `tables/headline.json`, the report in "
              "`report.html`.", "", headline_table(evaluation.summary, budgets), "", UNITS]
    set_description("\n".join(lines))


def headline_metrics(figures: dict) -> dict[str, float]:
    """``root_share.<score>.b<B>`` with ``.low`` and ``.high`` for every score with a share of root's gain at every
    budget of ``figures`` (``specrank.experiments.study.tables.temperature_results``' form), the same names in every
    pipeline run; with the study's figures also ``rows_minus_base.b<B>`` (% of draft's value, and its interval),
    ``n_rounds`` and ``n_prompts``."""
    out = {k: figures[f] for k, f in (("n_rounds", "rounds"), ("n_prompts", "prompts")) if f in figures}
    for b, at in figures["budgets"].items():
        for score, entry in at["scores"].items():
            if "root_share" in entry:
                out.update(_interval(f"{ROOT_SHARE}.{metric_key(score)}.b{b}", entry["root_share"]))
        if "rows_minus_base" in at:
            out.update(_interval(f"rows_minus_base.b{b}", at["rows_minus_base"]["gain_pct_of_draft"]))
    return {k: float(v) for k, v in out.items()}


def _interval(key: str, triple) -> dict:
    point, low, high = triple
    return {key: point, f"{key}.low": low, f"{key}.high": high}


def log_headline(figures: dict, meta: dict | None = None) -> None:
    """Log the headline of a temperature's ``figures`` to the active (pipeline) run: ``headline_metrics`` and the
    figure ``figures/root_share.png`` (``meta``: law, rounds, prompts, drafter for its caption; default: the
    figures' own)."""
    log_metrics(headline_metrics(figures))
    caption = meta if meta is not None else {k: figures[k] for k in ("law", "rounds", "prompts") if k in figures}
    figure = root_share_figure(figures["budgets"], caption)
    log_figure(figure, HEADLINE_FIGURE)
    figure.clear()


def describe_experiment(experiment_id: str, text: str) -> None:
    """Set the experiment's description (shown above its runs table)."""
    mlflow.MlflowClient().set_experiment_tag(experiment_id, NOTE_TAG, text)


def demo_description(store: str, champions: dict[str, str], drafter: str) -> str:
    """What the demo's experiment holds, where its headline is, and how to load each champion."""
    lines = [f"**specrank demo** (drafter {drafter}): each pipeline run (`demo-t1`, `demo-greedy`) records bundled "
             "prompts, featurizes them, cross-fits rerankers and evaluates every selection score offline; its "
             "nested runs are the stages (`demo-t1/1-decode` ... `demo-t1/4-evaluate`). **The headline** is on the "
             "pipeline run: the figure `figures/root_share.png` (each score's share of root selection's gain at "
             "B = 8 and 59, 95% intervals) with the metrics `root_share.<score>.b8` (`.low`, `.high`), "
             "`tables/headline.json` and `report.html`. To compare the rerankers in one chart: the metric "
             "`heldout_mse` of the `3-train/<reranker>-fold<f>` runs, grouped by the tag `specrank.reranker`.", "",
             "Registered champions (the reranker with the lowest cross-fitted held-out error, refitted on all "
             "prompts), loaded with:", ""]
    for name, uri in champions.items():
        lines.append(f"- {name}: `specrank.tracking.resolve_reranker(\"{uri}\", tracking_uri=\"{store}\")` "
                     f"(or `specrank online --reranker {uri} --tracking-uri {store}`)")
    return "\n".join(lines)
