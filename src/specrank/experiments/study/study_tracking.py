"""A study in MLflow: one pipeline run per temperature (``study-t1``, or ``demo-t1`` for the demo's preset), whose
nested runs are the stages (decode -> featurize -> train -> evaluate). The pipeline run is the headline: its first
description line names the champion, its gain and interval and links the registered model; its few metrics share one
naming scheme (``<quantity>.<score>.b<budget>``); the figure, the headline table and report.html sit beside; the
champion the study chose is logged in it and registered as ``models:/<pipeline>@champion``. The experiment gets a
description and a saved view of the runs table whose columns are the headline (``runs_link``)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import mlflow
import pandas as pd

from specrank.evaluation.figures import root_share_figure
from specrank.evaluation.html import report_html
from specrank.evaluation.names import label, ordered
from specrank.featurize import read_features
from specrank.layout import RunLayout
from specrank.markdown import interval_cell, markdown_table
from specrank.rerankers import load_reranker
from specrank.tracking.lineage import log_dataset, rounds_dataset
from specrank.tracking.models import log_reranker, signature_columns
from specrank.tracking.registry import register_reranker
from specrank.tracking.runs import (
    NOTE_TAG,
    PIPELINE_TAG,
    experiment_run,
    log_figure,
    log_metrics,
    log_params,
    log_report,
    log_tables,
    metric_key,
    run_page,
    runs_page,
    set_description,
)
from specrank.tracking.uri import tracking_store
from specrank.workflow.tracking import Tracking

HEADLINE_TABLE = "headline"  # tables/headline.json of the pipeline run
HEADLINE_FIGURE = "root_share"  # figures/root_share.png of the pipeline run
CHAMPION_TAG = "specrank.champion"  # the pipeline run's link to its registered model version
CHAMPION_RERANKER_TAG = "specrank.champion_reranker"
HEADLINE_TAG = "specrank.headline"  # the champion's gain and interval in words: a column of the runs table
ALIAS = "champion"
# MLflow's UI restores a runs-table view saved as the experiment tag ``mlflow.sharedViewState.<key>`` when the link
# carries ``viewStateShareKey=<key>`` (useSharedExperimentViewState in mlflow/server/js, experiment-page hooks;
# plain JSON is read when the value is not compressed); columns are named ``<kind>.`<key>```, and their widths apply
# to the columns the view orders (``columnOrder``): the headline first, wide enough to read whole.
SHARED_VIEW_TAG = "mlflow.sharedViewState."
VIEW_KEY = "specrank-headline"
VIEW_COLUMNS = {f"tags.`{HEADLINE_TAG}`": 600, f"tags.`{CHAMPION_RERANKER_TAG}`": 150,
                "metrics.`champion.mean_gain_pct`": 190}  # column -> width, px
HEADLINE_BUDGET = "8"  # the budget the headline line reads (the first budget when a study has no B = 8)
UNITS = ("Metrics: `value.draft.b<B>` is draft selection's expected accepted draft tokens per round at budget B; "
         "`gain_pct.<score>.b<B>` a score's gain over it in % of draft's value (in tokens: the evaluate run's "
         "`gain_tokens.<score>.b<B>`), `root_share.<score>.b<B>` the % of root selection's gain it recovers (held out, "
         "cross-fitted; their 95% prompt-bootstrap intervals are in `tables/headline.json` and the figure); "
         "the champion's are its score's (named in the tag `specrank.champion_reranker`), and `champion.mean_gain_pct` "
         "is its gain averaged over the tree budgets, the number the rule that chose it compares; `wall_s` this run's seconds, `stages_s` those of its stage runs, `outside_stages_s` the rest.")


def pipeline_name(tracking: Tracking, folder: str) -> str:
    """A temperature's pipeline run: ``<prefix>-<law folder>`` (``study-t1``; the demo's ``demo-t1``)."""
    return f"{tracking.run_name or 'study'}-{folder}"


@contextmanager
def pipeline_run(tracking: Tracking, name: str, temp: float, drafter: str):
    """The parent run of one temperature's stages, tagged with its own name (every run nested under it inherits
    the tag, so grouping by ``specrank.pipeline`` keeps each temperature's folds apart)."""
    note = (f"The study at T = {temp:g} with drafter {drafter}: its nested runs are the stages decode -> featurize "
            "-> train -> evaluate, linked by the datasets each logs.")
    with experiment_run(tracking.experiment, run_name=name, tracking_uri=tracking.uri,
                        tags={"specrank.stage": "pipeline", PIPELINE_TAG: name}, description=note) as active:
        log_params({"stage": "pipeline", "temperature": float(temp), "drafter": drafter, "store": tracking.uri})
        yield active


def headline_metrics(figures: dict) -> dict[str, float]:
    """The pipeline run's metrics from a temperature's ``figures`` (``temperature_results``' form), points only
    (intervals go to the table, the figure and the description): for each budget, draft's value and every score's
    gain in % of draft's value and share of root's gain; Rows - Base; the champion's mean gain over the tree budgets
    (its other figures are its score's, each logged once); the rounds
    and prompts; with an online phase, each strategy's realized accepted tokens a round and gain over draft."""
    out = {k: figures[f] for k, f in (("n_rounds", "rounds"), ("n_prompts", "prompts")) if f in figures}
    champion = (figures.get("champion") or {}).get("reranker")
    for b, at in figures["budgets"].items():
        scores = at["scores"]
        if "mean" in scores.get("draft", {}):
            out[f"value.draft.b{b}"] = scores["draft"]["mean"][0]
        for score, entry in scores.items():  # the gain in tokens is the evaluate run's: few charts here
            for quantity in ("gain_pct", "root_share"):
                if quantity in entry and score != "draft":
                    out[f"{quantity}.{metric_key(score)}.b{b}"] = entry[quantity][0]
        if "rows_minus_base" in at:
            out[f"rows_minus_base.b{b}"] = at["rows_minus_base"]["gain_pct_of_draft"][0]
    if champion:
        out["champion.mean_gain_pct"] = figures["champion"]["mean_gain_pct"]
    for b, f in ((figures.get("online") or {}).get("budgets") or {}).items():
        for strategy, e in f["strategies"].items():
            out[f"online.realized.{strategy}.b{b}"] = e["realized"][0]
            if "realized_gain" in e:
                out[f"online.realized_gain.{strategy}.b{b}"] = e["realized_gain"][0]
    return {k: float(v) for k, v in out.items()}


def headline_line(figures: dict) -> str:
    """The champion in one line: its gain over draft at B = 8 (else the first budget) with its interval and its share
    of root's gain (the runs table's headline column)."""
    champion = figures["champion"]
    budget = HEADLINE_BUDGET if HEADLINE_BUDGET in figures["budgets"] else next(iter(figures["budgets"]))
    name = champion["reranker"]
    entry = figures["budgets"][budget]["scores"][name]
    gain, share = entry["gain_pct"], entry.get("root_share")
    text = f"{label(name)}: {gain[0]:+.1f}% of draft's value [{gain[1]:+.1f}, {gain[2]:+.1f}] at B = {budget}"
    if share is not None:
        text += f", {share[0]:.0f}% of root's gain [{share[1]:.0f}, {share[2]:.0f}]"
    return text


def headline_frame(figures: dict) -> pd.DataFrame:
    """The headline as rows: budget x score (ordered), value, gain and share of root's gain, each with its 95%
    interval."""
    rows = []
    for b, at in figures["budgets"].items():
        for score in ordered(list(at["scores"])):
            entry, row = at["scores"][score], {"budget": int(b), "score": score, "label": label(score)}
            for key in ("mean", "gain", "gain_pct", "root_share"):
                for suffix, value in zip(("", "_low", "_high"), entry.get(key, [None] * 3)):
                    row[key + suffix] = value
            rows.append(row)
    return pd.DataFrame(rows)


def log_headline(figures: dict) -> None:
    """Log a temperature's ``figures`` to the active pipeline run: ``headline_metrics``, the figure
    ``figures/root_share.png`` (the champion starred) and ``tables/headline.json`` (every figure with its interval)."""
    log_metrics(headline_metrics(figures))
    caption = {k: figures[k] for k in ("law", "rounds", "prompts") if k in figures}
    figure = root_share_figure(figures["budgets"], caption, champion=(figures.get("champion") or {}).get("reranker"))
    log_figure(figure, HEADLINE_FIGURE)
    figure.clear()
    log_tables({HEADLINE_TABLE: headline_frame(figures)})


def log_temperature(figures: dict, run_dir: Path, name: str, temp: float, drafter: str) -> str:
    """The active pipeline run's headline from the temperature's ``figures``: metrics, figure, tables, report, the
    champion (saved in ``run_dir/champion``) logged here and registered as ``name``, and the description whose
    first line says who won and by how much. Returns the champion's registry URI."""
    log_dataset(rounds_dataset(run_dir), "pipeline")
    log_headline(figures)
    champion = figures["champion"]["reranker"]
    report = RunLayout(run_dir).evaluation / "report.md"
    if report.is_file():  # the study's own table first: the evaluate stage scores no stacked reranker
        study = f"# {name}: the study's figures\n\n{figures_table(figures)}\n\n"
        log_report(report_html(study + report.read_text(encoding="utf-8"), report.parent), "report.html")
    version = register_champion(run_dir, figures, name)
    uri = f"models:/{version.name}/{version.version}"
    line = headline_line(figures)
    mlflow.set_tags({CHAMPION_TAG: uri, CHAMPION_RERANKER_TAG: champion, HEADLINE_TAG: line})
    set_description(pipeline_note(figures, name, temp, drafter, version, line))
    return f"models:/{name}@{ALIAS}"


def register_champion(run_dir: Path, figures: dict, name: str):
    """Log the study's champion (``run_dir/champion``, refitted on every round) in the active pipeline run and
    register it as a new version of ``name`` with alias ``champion``; its description says how it was chosen."""
    model = load_reranker(RunLayout(run_dir).champion)
    example = read_features(RunLayout(run_dir).features).head(20)
    choice = figures["champion"]
    tags = {"specrank.reranker": choice["reranker"], "specrank.fold": "all",
            "specrank.training_rounds": figures["rounds"], "specrank.training_prompts": figures["prompts"],
            "specrank.mean_gain_pct": f"{choice['mean_gain_pct']:.4g}"}
    logged = log_reranker(model, f"{name}-champion", example, tags={**tags, NOTE_TAG: (
        f"The champion of {name}, refitted on all {figures['prompts']} prompts.")},
                          params={"features": ",".join(signature_columns(model) or [])})
    version = register_reranker(logged, name, ALIAS, tags=tags)
    client = mlflow.MlflowClient()
    client.update_model_version(name, version.version, description=champion_note(figures, name, version.version))
    return client.get_model_version(name, version.version)


def champion_note(figures: dict, name: str, version) -> str:
    """A champion version's description: the rule, every deployable score's gain at each budget, how to load it."""
    choice = figures["champion"]
    scores = [s for s in ordered(list(next(iter(figures["budgets"].values()))["scores"])) if s not in ("draft", "root",
                                                                                                       "oracle")]
    rows = [[label(s)] + [f"{figures['budgets'][b]['scores'][s]['gain_pct'][0]:+.2f}" for b in figures["budgets"]]
            for s in scores if all("gain_pct" in figures["budgets"][b]["scores"].get(s, {}) for b in figures["budgets"])]
    table = markdown_table(["score"] + [f"gain, % of draft, B = {b}" for b in figures["budgets"]], rows)
    uri = f"models:/{name}/{version}"
    return (f"The {label(choice['reranker'])} reranker, the study's champion: the deployable reranker with the "
            f"highest cross-fitted gain over draft selection in % of draft's value, averaged over the budgets "
            f"({choice['mean_gain_pct']:+.2f}%; ties go to the simpler), refitted on all {figures['prompts']} "
            f"prompts ({figures['rounds']} rounds).\n\n{table}\n\nLoad it: `{uri}` "
            f"(`specrank.tracking.resolve_reranker(\"{uri}\", tracking_uri=...)` or `specrank online --reranker {uri}`).")


def pipeline_note(figures: dict, name: str, temp: float, drafter: str, version, line: str) -> str:
    """The pipeline run's description: who won and by how much first (above the UI's fade), then the study's table
    (every score, the stacked ones and the champion included)."""
    link = f"[models:/{version.name}/{version.version}](#/models/{version.name}/versions/{version.version})"
    return "\n".join([
        f"**Champion {line}** — {link} (chosen by its mean gain over the tree budgets, "
        f"{figures['champion']['mean_gain_pct']:+.1f}%)", "",
        f"{name}: T = {temp:g}, drafter {drafter}, {figures['rounds']} rounds of {figures['prompts']} prompts; nested "
        "runs decode -> featurize -> train -> evaluate. Each score's share of root selection's gain: "
        "`figures/root_share.png`; every figure with its interval: `tables/headline.json`; the report: `report.html`.",
        "", "Expected accepted draft tokens per round, held out (95% prompt-bootstrap intervals):", "",
        figures_table(figures), "", UNITS])


def figures_table(figures: dict) -> str:
    """Scores x budgets of a temperature's study figures: value, gain over draft in tokens with its interval, in % of
    draft's value, and share of root's gain with its interval; the champion's row marked."""
    budgets = list(figures["budgets"])
    champion = (figures.get("champion") or {}).get("reranker")
    header = ["Score"] + [f"B={b} {q}" for b in budgets for q in ("value", "gain [95% CI]", "gain % of draft",
                                                                   "root share % [95% CI]")]
    rows = []
    for score in ordered([s for b in budgets for s in figures["budgets"][b]["scores"]]):
        cells = [label(score) + (" (champion)" if score == champion else "")]
        for b in budgets:
            e = figures["budgets"][b]["scores"].get(score, {})
            cells += [f"{e['mean'][0]:.3f}" if "mean" in e else "–",
                      interval_cell(e["gain"], 3) if "gain" in e else "–",
                      f"{e['gain_pct'][0]:+.1f}" if "gain_pct" in e else "–",
                      interval_cell(e["root_share"], 1, sign=False) if "root_share" in e else "–"]
        rows.append(cells)
    return markdown_table(header, rows)


def finish(tracking: Tracking, pipelines: dict[str, str], champions: dict[str, str], title: str) -> list[str]:
    """Describe the experiment, save its headline view of the runs table, and return the lines that tell the user
    where everything is (``pipelines``: run name -> id; ``champions``: run name -> registry URI)."""
    with tracking_store(tracking.uri):
        experiment = mlflow.get_experiment_by_name(tracking.experiment)
        client = mlflow.MlflowClient()
        client.set_experiment_tag(experiment.experiment_id, NOTE_TAG,
                                  experiment_note(tracking.uri, champions, title))
        client.set_experiment_tag(experiment.experiment_id, SHARED_VIEW_TAG + VIEW_KEY, json.dumps(headline_view()))
    exp_id = experiment.experiment_id
    lines = [f"Champion {model}: specrank.tracking.resolve_reranker(\"{uri}\", tracking_uri=\"{tracking.uri}\")"
             for model, uri in champions.items()]
    lines += [f"MLflow store: {tracking.uri} (experiment {tracking.experiment!r})",
              f"Browse the runs: mlflow ui --backend-store-uri {tracking.uri}",
              f"  then open {runs_link(exp_id)}"]
    lines += [f"  headline of {run_name}: {run_page(exp_id, run_id)}" for run_name, run_id in pipelines.items()]
    return lines


def headline_view() -> dict:
    """The runs table as the headline: the pipeline runs, newest first, with the champion and its gain as columns."""
    return {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False,
            "selectedColumns": list(VIEW_COLUMNS), "columnOrder": list(VIEW_COLUMNS), "columnWidths": VIEW_COLUMNS}


def runs_link(experiment_id: str) -> str:
    """``runs_page`` opening the saved headline view (``headline_view``)."""
    return runs_page(experiment_id) + f"&viewStateShareKey={VIEW_KEY}"


def experiment_note(store: str, champions: dict[str, str], title: str) -> str:
    """What the experiment holds, where its headline is, and how to load each champion."""
    lines = [f"**{title}**: each pipeline run (one per temperature) records prompts, featurizes them, cross-fits "
             "rerankers, evaluates every selection score offline and registers the champion; its nested runs are "
             "the stages (`<pipeline>/1-decode` ... `<pipeline>/4-evaluate`), tagged `specrank.pipeline`. **The "
             "headline** is on the pipeline run: its first description line (who won, by how much, the interval), "
             "the figure `figures/root_share.png`, `tables/headline.json` and `report.html`. To compare the rerankers: the metric "
             "`heldout_mse` of the `3-train/<reranker>-fold<f>` runs, grouped by `specrank.pipeline` then "
             "`specrank.reranker`.", "", "Registered champions (the study's rule: the highest mean cross-fitted gain "
             "over draft, refitted on all prompts), loaded with:", ""]
    for name, uri in champions.items():
        lines.append(f"- {name}: `specrank.tracking.resolve_reranker(\"{uri}\", tracking_uri=\"{store}\")` "
                     f"(or `specrank online --reranker {uri} --tracking-uri {store}`)")
    return "\n".join(lines)
