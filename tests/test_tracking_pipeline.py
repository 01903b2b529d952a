"""Pipeline runs in a temporary SQLite store as a user browses them: the headline (each score's share of root
selection's gain at both budgets, as metrics and a figure), run names unique and in order across pipelines, the
time spent outside the stages, no timer that measured nothing, links that open the Runs view."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from mlflow_store import mlflow_db  # noqa: F401  (fixture)
from specrank import tracking
from specrank.decode.engine.timer import Timer
from specrank.experiments.study.study_tables import summary_budget_figures
from specrank.tracking.decode import decode_metrics, workers_decode_metrics
from specrank.experiments.study.study_tracking import headline_metrics, log_headline
from specrank.tracking.runs import DIGITS, run_page, runs_page
from specrank.workflow import Tracking

STUDY = Path(__file__).resolve().parents[1] / "docs" / "results" / "study.json"


def study_figures() -> dict:
    """{temperature: its figures} of the committed study (``temperature_results``' form)."""
    return json.loads(STUDY.read_text(encoding="utf-8"))["temperatures"]


def shares(figures: dict) -> dict:
    """{(score, budget): [point, low, high]} of every score with a share of root's gain."""
    return {(score, b): entry["root_share"] for b, at in figures["budgets"].items()
            for score, entry in at["scores"].items() if "root_share" in entry}


def test_each_pipeline_run_carries_the_headline_figure_and_its_metrics(mlflow_db):
    uri = f"sqlite:///{mlflow_db}"
    client, runs = MlflowClient(uri), {}
    for temp, figures in study_figures().items():
        with tracking.experiment_run("headline", run_name=f"study-t{temp}", tracking_uri=uri) as run:
            log_headline(figures)
        runs[temp] = client.get_run(run.info.run_id)
    keys = {temp: {k for k in run.data.metrics if k.startswith("root_share.")} for temp, run in runs.items()}
    assert keys["1"] == keys["0"]  # one name per figure in every pipeline run: one chart compares them
    for temp, figures in study_figures().items():
        metrics = runs[temp].data.metrics
        expected = shares(figures)
        assert {(r, b) for r, b in expected} >= {(r, b) for r in ("isotonic", "per_depth", "base", "rows", "oracle",
                                                                  "rows+per_depth") for b in ("8", "59")}
        table = pd.read_json(client.download_artifacts(runs[temp].info.run_id, "tables/headline.json"),
                             orient="split").set_index(["score", "budget"])
        for (score, b), (point, low, high) in expected.items():
            assert metrics[f"root_share.{tracking.metric_key(score)}.b{b}"] == pytest.approx(point)
            row = table.loc[(score, int(b))]  # the interval beside the point, in the headline table
            assert [row["root_share"], row["root_share_low"], row["root_share_high"]] == pytest.approx([point, low, high])
        assert not [k for k in metrics if k.endswith((".low", ".high"))]  # one chart per figure, not three
        champion = figures["champion"]["reranker"]
        assert metrics["champion.mean_gain_pct"] == pytest.approx(figures["champion"]["mean_gain_pct"])
        assert f"root_share.{tracking.metric_key(champion)}.b8" in metrics  # the champion's figures: its score's
        values = [round(v, 9) for k, v in metrics.items() if k.startswith(("gain_pct.", "root_share.", "champion."))]
        assert len(values) == len(set(values))  # one name per number: no figure logged twice
        assert metrics["rows_minus_base.b59"] == pytest.approx(
            figures["budgets"]["59"]["rows_minus_base"]["gain_pct_of_draft"][0])
        assert metrics["n_rounds"] == figures["rounds"] and len(metrics) <= 60
        assert not [k for k in metrics if k.startswith(("root_share.draft", "root_share.root."))]  # no share of their own
        png = client.download_artifacts(runs[temp].info.run_id, "figures/root_share.png")
        with Image.open(png) as image:
            assert image.format == "PNG" and image.width > image.height  # one panel per budget, side by side
            # the bars are drawn: the panels hold more than their frame's colours
            assert len(image.convert("RGB").getcolors(1 << 20)) > 20


def test_an_evaluation_summary_gives_the_study_form_and_the_same_metric_names():
    rows = []
    for b in (8, 59, 100):
        for i, score in enumerate(("draft", "isotonic", "rows", "root", "oracle", "mix_cache")):
            share = np.nan if score in ("draft", "root") else 10.0 * i + b / 100
            rows.append({"score": score, "budget": b, "root_share": share, "root_share_low": share - 1,
                         "root_share_high": share + 1})
    budgets = summary_budget_figures(pd.DataFrame(rows), [8, 59])
    assert list(budgets) == ["8", "59"]
    assert budgets["59"]["scores"]["rows"]["root_share"] == pytest.approx([20.59, 19.59, 21.59])
    assert "root_share" not in budgets["8"]["scores"]["draft"] and "mix_cache" not in budgets["8"]["scores"]
    metrics = headline_metrics({"budgets": budgets})
    study = headline_metrics(study_figures()["1"])
    assert set(metrics) <= set(study)  # an evaluation's names are the study's
    assert metrics["root_share.oracle.b8"] == pytest.approx(40.08)


def test_run_names_are_unique_and_ordered_across_pipelines_and_stage_time_is_accounted(mlflow_db):
    uri = f"sqlite:///{mlflow_db}"
    client = MlflowClient(uri)
    order = {}
    for pipeline in ("demo-t1", "demo-greedy"):
        with tracking.experiment_run("names", run_name=pipeline, tracking_uri=uri) as parent:
            for stage, children in (("decode", []), ("train", ["rows-fold0", "rows-fold1", "rows-all"]),
                                    ("evaluate", ["fold-0", "fold-1"])):
                name = Tracking.stage(uri, "names", pipeline, stage).run_name
                with tracking.experiment_run("names", run_name=name, tracking_uri=uri):
                    for child in children:
                        with tracking.nested_run(child):
                            pass
                    time.sleep(0.05)
            time.sleep(0.3)  # work in no stage (the study's decoding, its figures)
        runs = client.search_runs([parent.info.experiment_id], order_by=["attributes.start_time ASC"],
                                  filter_string=f"attributes.run_name LIKE '{pipeline}%'")
        order[pipeline] = [r.info.run_name for r in runs]
        pipe = client.get_run(parent.info.run_id).data.metrics
        stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        # each metric is logged to DIGITS significant digits on its own: sums and differences of logged values
        # agree with the logged sum or difference to within those digits' rounding, not to the last bit
        close = {"rel": 10.0 ** (1 - DIGITS)}
        assert pipe["stages_s"] == pytest.approx(sum(r.data.metrics["wall_s"] for r in stages), **close)
        assert pipe["outside_stages_s"] == pytest.approx(pipe["wall_s"] - pipe["stages_s"],
                                                         abs=pipe["wall_s"] * close["rel"])
        assert pipe["outside_stages_s"] >= 0.3
        assert not [r for r in runs if r.info.run_id != parent.info.run_id and "stages_s" in r.data.metrics]
    assert order["demo-t1"] == ["demo-t1", "demo-t1/1-decode", "demo-t1/3-train", "demo-t1/3-train/rows-fold0",
                                "demo-t1/3-train/rows-fold1", "demo-t1/3-train/rows-all", "demo-t1/4-evaluate",
                                "demo-t1/4-evaluate/fold-0", "demo-t1/4-evaluate/fold-1"]
    every = order["demo-t1"] + order["demo-greedy"]
    assert len(set(every)) == len(every) == 18  # no name in both pipelines
    for names in order.values():  # sorted by name, each pipeline's runs are in the order they ran (folds aside)
        assert [n for n in sorted(names) if not n.endswith("-all")] == [n for n in names if not n.endswith("-all")]


def test_no_timer_metric_is_zero(tmp_path):
    timer = Timer(prefill=0.5, draft=1.0, target=2.0, total=4.0, rounds=10, tokens=30, passes=10, drafting=1.0)
    metrics = decode_metrics(timer, tmp_path)
    spans = {k for k in metrics if k.startswith("time_")}
    assert {"time_prefill_s", "time_draft_s", "time_target_s", "time_total_s", "time_bookkeeping_s"} <= spans
    assert "time_rerank_s" not in spans and "time_root_pass_hidden_s" not in spans  # a recording never reranks
    assert all(metrics[k] != 0.0 for k in spans)

    class Outcome:  # the workers' outcome: each worker's summed stats
        wall, timings = 3.0, [object(), object()]

        def totals(self):
            return {"rounds": 10, "tokens": 30, "passes": 10, "target_s": 2.0, "rerank_s": 0.0, "root_s": 0.0}

    spans = {k: v for k, v in workers_decode_metrics(Outcome(), tmp_path).items() if k.startswith("time_")}
    assert spans == {"time_target_s": 2.0}


def test_printed_links_open_the_runs_view():
    # MLflow 3.17's UI reads the view from the URL parameter workflowType (genai | machine_learning) before the
    # browser's remembered choice; machine_learning is its Runs view.
    for url in (runs_page("7"), run_page("7", "abc")):
        assert url.endswith("?workflowType=machine_learning"), url
    assert run_page("7", "abc", "http://host:5000/").startswith("http://host:5000/#/experiments/7/runs/abc?")


def test_a_headline_figure_with_a_share_missing_at_one_budget_still_draws(tmp_path):
    from specrank.evaluation.figures import root_share_figure

    budgets = {"8": {"scores": {"rows": {"root_share": [40.0, 30.0, 50.0]}, "base": {"root_share": [10, -5, 25]}}},
               "59": {"scores": {"rows": {"root_share": [np.nan, np.nan, np.nan]}, "draft": {}}}}
    figure = root_share_figure(budgets, {"law": "T=1", "rounds": 10, "prompts": 2})
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["Base", "Rows"]
    assert figure.axes[0].get_xlim()[0] <= -10 and figure.axes[0].get_xlim()[1] >= 100
