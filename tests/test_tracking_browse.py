"""MLflow as people browse it, read back from one real ``mlflow server`` on 127.0.0.1 after a small demo
(the study's preset on a tiny random target and drafter, 4 prompts, T = 1): the experiment's kind, description
and saved headline view, the pipeline run as the headline (who won and by how much in its first line), few
metrics and a description per run, tables as MLflow tables, datasets linking decode -> featurize -> train ->
evaluate, model names, the study's champion registered from the pipeline run, run times that are the work's, the
stages on the runs table's first page, the registry alias loaded by ``specrank online`` elsewhere, and named,
seeded, reproducible Optuna studies (one run each)."""

from __future__ import annotations

import hashlib
import io
import json
import time
from contextlib import redirect_stdout
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from mlflow_store import migrated_db, serve
from specrank.cli import main
from specrank.experiments.study.study_tables import RERANKERS
from specrank.testing import save_tiny_llama
from specrank.tracking.runs import metric_key
from specrank.workflow.champion import DEPLOYABLE

# These tests share costly module fixtures: pytest-xdist keeps them on one worker.
pytestmark = pytest.mark.xdist_group("mlflow-browse")

EXPERIMENT = "browse"
SMALL = ["--tune-trials", "2", "--bootstrap", "100"]


def sha16(*files, root=None) -> str:
    """SHA-256 of the files' bytes (each preceded by its name relative to ``root`` when given), 16 hex digits."""
    digest = hashlib.sha256()
    for f in files:
        if root is not None:
            digest.update(str(f.relative_to(root)).encode() + b"\0")
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browse_server")
    with serve(migrated_db(tmp_path_factory, folder / "mlflow.db"), folder) as uri:
        yield uri


@pytest.fixture(scope="module")
def demo(server, tmp_path_factory):
    """The demo on tiny models, logged to ``server``: (client, experiment id, runs by name, demo args, run dir)."""
    d = tmp_path_factory.mktemp("browse")
    tgt = save_tiny_llama(d / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(d / "drf", seed=0, vocab_size=128, num_layers=2)
    args = ["demo", "--target", str(tgt), "--drafter", f"standalone:{drf}", "--limit", "4", "--max-new-tokens", "8",
            "--temperatures", "1", *SMALL, "--tracking-uri", server, "--experiment", EXPERIMENT, "--out", str(d / "out")]
    with redirect_stdout(io.StringIO()) as out:
        assert main(args) == 0
    printed = out.getvalue()
    client = MlflowClient(server)
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], max_results=500)
    (run_dir,) = (d / "out").glob("*/t1")  # one folder per drafter
    return client, exp, runs, {"tgt": tgt, "drf": drf, "printed": printed}, run_dir


def results(run_dir) -> dict:
    """The study's figures at T = 1 (results.json beside the temperature's folder)."""
    return json.loads((run_dir.parent / "results.json").read_text())["temperatures"]["1"]


def by_name(runs, name):
    found = [r for r in runs if r.info.run_name == name]
    assert len(found) == 1, (name, [r.info.run_name for r in runs])
    return found[0]


def test_experiment_is_a_model_training_experiment(demo):
    client, exp, *_ = demo
    # The MLflow UI opens kind custom_model_development on its Runs view, not on GenAI traces.
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def test_every_run_has_few_metrics_a_description_and_the_code_version(demo):
    client, exp, runs, *_ = demo
    assert len(runs) == 15  # pipeline, 4 stages, 8 fold models, 2 evaluation folds (the champion is the pipeline's)
    for run in runs:
        assert len(run.data.metrics) <= 72, (run.info.run_name, len(run.data.metrics))  # 3 budgets x 2 figures x 10 scores + 12
        assert run.data.tags.get("mlflow.note.content", "").strip(), run.info.run_name
        assert run.data.tags["specrank.version"]
    pipeline = by_name(runs, "demo-t1")
    children = {r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id}
    assert children == {"demo-t1/1-decode", "demo-t1/2-featurize", "demo-t1/3-train", "demo-t1/4-evaluate"}
    evaluate = by_name(runs, "demo-t1/4-evaluate")
    assert "| Score | B=8 value" in evaluate.data.tags["mlflow.note.content"]
    # the study's table, the champion's row in it (a stacked champion is no evaluate-stage score), in the pipeline
    # run's description and first in its report
    assert " (champion) | " in pipeline.data.tags["mlflow.note.content"]
    report = Path(client.download_artifacts(pipeline.info.run_id, "report.html")).read_text()
    assert "the study&#x27;s figures" in report or "the study's figures" in report
    assert report.index("(champion)") < report.index("Offline evaluation")
    # one name for one number, on the pipeline run and on the evaluate run
    assert pipeline.data.metrics["root_share.rows.b8"] == pytest.approx(evaluate.data.metrics["root_share.rows.b8"])
    curated = {k for k in pipeline.data.metrics if not k.startswith(("root_share.", "gain_pct."))}
    assert len(curated) <= 16 < len(evaluate.data.metrics)  # curated, not the evaluation's copy
    assert not [k for k in pipeline.data.metrics if k.endswith((".low", ".high"))]  # intervals: table and figure
    assert all(v == float(f"{v:.7g}") for r in runs for v in r.data.metrics.values())  # no 17-digit values
    train = by_name(runs, "demo-t1/3-train")
    # one meaning per name: train's top-1 counts rounds against their best label, evaluate's against the argmax
    assert "draft_top1_best_label_pct" in train.data.metrics and "top1_argmax_pct.draft" in evaluate.data.metrics
    assert not {k for r in runs for k in r.data.metrics if k.endswith("top1_hit_pct")}
    candidates = pd.read_json(client.download_artifacts(train.info.run_id, "tables/candidates.json"),
                              orient="split").set_index("reranker")
    keys = set()
    for name in RERANKERS:  # fold means of held-out error and top-1 hit
        folds = [by_name([r for r in runs if r.data.tags.get("mlflow.parentRunId") == train.info.run_id],
                         f"demo-t1/3-train/{name}-fold{f}") for f in (0, 1)]
        assert candidates.loc[name, "heldout_mse"] == pytest.approx(np.mean([r.data.metrics["heldout_mse"] for r in folds]))
        assert {r.data.tags["specrank.reranker"] for r in folds} == {name} and "top1_best_label_pct" in folds[0].data.metrics
        keys |= {frozenset(r.data.metrics) for r in folds}
        assert not [k for k in train.data.metrics if k.startswith(name)]  # a reranker's numbers are its runs'
    assert len(keys) == 1  # every reranker's fold runs share their metric names: one chart compares them
    decode = by_name(runs, "demo-t1/1-decode")
    assert {"rounds", "tokens_per_s", "accepted_per_round", "time_target_s", "time_draft_s"} <= set(decode.data.metrics)
    assert "time_drafting_s" not in decode.data.metrics  # the drafter's own clock repeats time_draft_s in process
    pipelines = {r.data.tags.get("specrank.pipeline") for r in runs}
    assert pipelines == {"demo-t1"}  # every run, folds included, names its pipeline: grouping keeps them apart
    assert decode.data.params["manifest.temperature"] == "1.0"


def test_the_champion_is_the_studys_choice_registered_from_the_pipeline_run(demo):
    client, exp, runs, _, run_dir = demo
    figures = results(run_dir)
    version = client.get_model_version_by_alias("demo-t1", "champion")
    pipeline = by_name(runs, "demo-t1")
    assert version.run_id == pipeline.info.run_id  # the pipeline run lists it under "Registered models"
    chosen = version.tags["specrank.reranker"]
    assert chosen == figures["champion"]["reranker"]
    trees = [b for b in figures["budgets"] if b != "1"]  # the top-1 choice does not vote
    means = {r: np.mean([figures["budgets"][b]["scores"][r]["gain_pct"][0] for b in trees])
             for r in DEPLOYABLE if r in figures["budgets"]["8"]["scores"]}
    assert means[chosen] == pytest.approx(max(means.values()))  # one rule: the mean cross-fitted gain over draft
    assert "champion_heldout_mse" not in pipeline.data.metrics
    assert pipeline.data.metrics["champion.mean_gain_pct"] == pytest.approx(means[chosen])
    local = pd.read_parquet(run_dir / "features.parquet")
    from specrank.rerankers import load_reranker
    from specrank.tracking.models import resolve_reranker

    registered = resolve_reranker("models:/demo-t1@champion", tracking_uri=client.tracking_uri)
    np.testing.assert_array_equal(registered.predict_first_factor(local),
                                  load_reranker(run_dir / "champion").predict_first_factor(local))


def test_evaluation_tables_are_mlflow_tables(demo):
    client, exp, runs, _, run_dir = demo
    evaluate = by_name(runs, "demo-t1/4-evaluate")
    logged = {a["path"] for a in json.loads(evaluate.data.tags["mlflow.loggedArtifacts"]) if a["type"] == "table"}
    names = ("summary", "splits", "first_factor", "comparisons", "mixture_weights", "evaluated_models")
    assert logged == {f"tables/{n}.json" for n in names}
    path = client.download_artifacts(evaluate.info.run_id, "tables/summary.json")
    table = pd.read_json(path, orient="split")  # the form mlflow.log_table writes and the UI reads
    local = pd.read_parquet(run_dir / "evaluation" / "summary.parquet")
    assert len(table) == len(local) and list(table["score"]) == list(local["score"])
    # log_table writes JSON with 10 decimal places (pandas' default); the Parquet copy beside it is exact
    np.testing.assert_allclose(table["gain"].to_numpy(float), local["gain"].to_numpy(float), rtol=0, atol=1e-10)
    assert "tables/summary.parquet" in {a.path for a in client.list_artifacts(evaluate.info.run_id, "tables")}
    assert {"report.md", "report.html", "figures"} <= {a.path for a in client.list_artifacts(evaluate.info.run_id)}
    html = client.download_artifacts(evaluate.info.run_id, "report.html")
    assert open(html).read().count('src="data:image/png;base64,') == 2  # the figures, embedded


def test_each_stage_names_its_datasets_with_their_digests(demo):
    client, exp, runs, _, run_dir = demo
    rounds = sha16(run_dir / "manifest.json", *sorted((run_dir / "rounds").glob("*.parquet")), root=run_dir)
    features = sha16(run_dir / "features.parquet")
    predictions = sha16(run_dir / "rerankers" / "predictions.parquet")
    prompts = json.loads((run_dir / "manifest.json").read_text())["prompts"]
    want = {
        "demo-t1/1-decode": {("prompts", sha16(Path(prompts)), "input"),
                           ("t1-rounds", rounds, "output")},
        "demo-t1/2-featurize": {("t1-rounds", rounds, "input"), ("t1-features", features, "output")},
        "demo-t1/3-train": {("t1-features", features, "training"), ("t1-predictions", predictions, "output")},
        "demo-t1/4-evaluate": {("t1-rounds", rounds, "evaluation"), ("t1-predictions", predictions, "evaluation")},
    }
    for name, datasets in want.items():
        inputs = by_name(runs, name).inputs.dataset_inputs
        got = {(i.dataset.name, i.dataset.digest, {t.key: t.value for t in i.tags}["mlflow.data.context"])
               for i in inputs}
        assert got == datasets, name
    features_input = next(i for i in by_name(runs, "demo-t1/3-train").inputs.dataset_inputs if i.dataset.name == "t1-features")
    assert json.loads(features_input.dataset.profile)["num_rows"] == len(pd.read_parquet(run_dir / "features.parquet"))


def test_models_are_named_by_run_reranker_and_fold(demo):
    client, exp, runs, *_ = demo
    models = client.search_logged_models([exp.experiment_id])
    assert {m.name for m in models} == ({f"demo-t1-{r}-fold{f}" for r in RERANKERS for f in (0, 1)}
                                        | {"demo-t1-champion"})
    # the evaluation lists the fold models whose predictions it scored
    evaluate = by_name(demo[2], "demo-t1/4-evaluate")
    folds = {f"models:/{m.model_id}" for m in models if not m.name.endswith("-champion")}
    listed = pd.read_json(client.download_artifacts(evaluate.info.run_id, "tables/evaluated_models.json"),
                          orient="split")
    assert set(listed["uri"]) == folds and len(evaluate.data.params["evaluated_models"].split(",")) == 2 * len(RERANKERS)
    assert "per_depth" in evaluate.data.params["evaluation.scores"]  # every evaluated score, not the first factors
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(client.tracking_uri)
    try:
        for m in models:
            info = mlflow.models.get_model_info(f"models:/{m.model_id}")
            assert m.params["features"].split(",") == info.signature.inputs.input_names()  # token, not token_prior
    finally:
        mlflow.set_tracking_uri(previous)


def refit_rows(run_dir):
    """Rows refitted on every prompt as ``specrank train --register-reranker rows --tune-trials 2`` refits it."""
    from specrank.featurize import read_features
    from specrank.workflow.rerankers import refit

    return refit("rows", read_features(run_dir / "features.parquet"), tune_trials=2, seed=0, prefix="demo-t1")


def _trials(client, exp_id) -> dict:
    """{study name: [params of trial 0, trial 1, ...]} from the trials table of each study's run."""
    out: dict = {}
    for r in client.search_runs([exp_id], filter_string="params.study LIKE '%'", max_results=200):
        table = pd.read_json(client.download_artifacts(r.info.run_id, "tables/trials.json"), orient="split")
        out[r.data.params["study"]] = table.filter(like="param.").to_dict("records")
    return out


def test_studies_are_distinct_and_reproducible_and_champion_loads_elsewhere(demo, server, tmp_path, monkeypatch,
                                                                             capsys):
    client, exp, runs, models, run_dir = demo
    first = _trials(client, exp.experiment_id)
    assert set(first) == {f"demo-t1-{r}-fold{f}" for r in ("base", "rows", "ranking") for f in (0, 1)}
    assert first["demo-t1-rows-fold0"][0] != first["demo-t1-rows-fold1"][0]  # distinct seeds per study
    assert first["demo-t1-base-fold0"][0] != first["demo-t1-rows-fold0"][0]
    # the demo's train stage again, into another experiment, registering the reranker it is told to
    again = ["train", str(run_dir / "features.parquet"), "--rerankers", ",".join(RERANKERS), "--tune-trials", "2",
             "--out-dir", str(tmp_path / "rerankers"), "--tracking-uri", server, "--experiment", "browse-again",
             "--model-prefix", "demo-t1", "--register", "browse-reranker"]
    assert main(again) == 2  # training alone does not choose a champion
    assert "--register-reranker" in capsys.readouterr().err
    assert main(again + ["--register-reranker", "rows"]) == 0
    assert "registered models:/browse-reranker@champion" in capsys.readouterr().out
    trials = _trials(client, client.get_experiment_by_name("browse-again").experiment_id)
    assert {k: v for k, v in trials.items() if not k.endswith("-all")} == first  # the same studies
    version = client.get_model_version_by_alias("browse-reranker", "champion")
    assert version.tags["specrank.reranker"] == "rows"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    from specrank.tracking.models import resolve_reranker

    loaded = resolve_reranker("models:/browse-reranker@champion", tracking_uri=server)
    local = refit_rows(run_dir)
    feats = pd.read_parquet(run_dir / "features.parquet")
    np.testing.assert_array_equal(loaded.predict_first_factor(feats), local.predict_first_factor(feats))
    online = ["online", "--target", str(models["tgt"]), "--drafter", f"standalone:{models['drf']}", "--strategies",
              "reranked", "--reranker", "models:/browse-reranker@champion", "--tracking-uri", server, "--no-tracking",
              "--temperature", "1", "--limit", "1", "--warmup", "0", "--max-new-tokens", "4", "--bootstrap", "20",
              "--out", str(elsewhere / "online")]
    assert main(online) == 0, capsys.readouterr().err
    assert (elsewhere / "online" / "online_decodes.parquet").is_file()
    from specrank.decode import Decoder, load_drafter, load_target

    target = load_target(str(models["tgt"]))
    decoder = Decoder(target, load_drafter(f"standalone:{models['drf']}", target), strategy="reranked",
                      reranker=resolve_reranker("models:/browse-reranker@champion", tracking_uri=server),
                      temperature=1.0)
    assert len(decoder.generate("the cat is big", max_new_tokens=3).tokens) >= 1


RUNS_PAGE = 100  # the MLflow UI's runs table loads runs 100 at a time (then "Load more")


def test_experiment_description_names_the_champion_and_its_uri_loads(demo, server):
    client, exp, runs, models, run_dir = demo
    exp = client.get_experiment(exp.experiment_id)
    note = exp.tags["mlflow.note.content"]
    assert "models:/demo-t1@champion" in note and "tables/headline.json" in note and "report.html" in note
    assert "specrank.pipeline" in note
    assert f'tracking_uri="{server}"' in note
    from specrank.tracking.models import resolve_reranker

    reranker = resolve_reranker("models:/demo-t1@champion", tracking_uri=server)
    feats = pd.read_parquet(run_dir / "features.parquet")
    assert np.isfinite(reranker.predict_first_factor(feats)).all()
    assert "MLflow store: " + server in models["printed"] and "workflowType=machine_learning" in models["printed"]
    pipeline = by_name(runs, "demo-t1")
    link = f"/#/experiments/{exp.experiment_id}/runs/{pipeline.info.run_id}?workflowType=machine_learning"
    assert f"headline of demo-t1: http://127.0.0.1:5000{link}" in models["printed"]


def test_the_pipeline_run_carries_the_headline_figure_and_shares(demo):
    client, exp, runs, _, run_dir = demo
    pipeline = by_name(runs, "demo-t1")
    figures = results(run_dir)
    headline = pd.read_json(client.download_artifacts(pipeline.info.run_id, "tables/headline.json"),
                            orient="split").set_index(["score", "budget"])
    for score in ("isotonic", "per_depth", "base", "rows", "oracle", "rows+per_depth"):
        for b in (8, 59):
            share = figures["budgets"][str(b)]["scores"][score]["root_share"]
            assert pipeline.data.metrics[f"root_share.{metric_key(score)}.b{b}"] == pytest.approx(share[0])
            row = headline.loc[(score, b)]  # the interval: in the table (and the figure), not as metrics
            assert [row["root_share"], row["root_share_low"], row["root_share_high"]] == pytest.approx(share)
    assert "figures/root_share.png" in {a.path for a in client.list_artifacts(pipeline.info.run_id, "figures")}
    note = pipeline.data.tags["mlflow.note.content"]
    assert "figures/root_share.png" in note
    # who won and by how much, with its interval, on the first line, the registered model linked there
    version = client.get_model_version_by_alias("demo-t1", "champion")
    first = note.splitlines()[0]
    champion = figures["champion"]["reranker"]
    gain = figures["budgets"]["8"]["scores"][champion]["gain_pct"]
    assert first.startswith("**Champion ") and f"{gain[0]:+.1f}% of draft's value [{gain[1]:+.1f}, {gain[2]:+.1f}]" in first
    assert f"(#/models/demo-t1/versions/{version.version})" in first
    assert pipeline.data.tags["specrank.headline"] in first and pipeline.data.tags["specrank.champion_reranker"] == champion
    assert pipeline.data.metrics["outside_stages_s"] == pytest.approx(
        pipeline.data.metrics["wall_s"] - pipeline.data.metrics["stages_s"], abs=1e-5)
    decode = by_name(runs, "demo-t1/1-decode")
    assert not [k for k, v in decode.data.metrics.items() if k.startswith("time_") and v == 0.0]


def test_the_printed_runs_link_opens_the_headline_as_columns(demo):
    client, exp, runs, models, _ = demo
    exp = client.get_experiment(exp.experiment_id)
    view = json.loads(exp.tags["mlflow.sharedViewState.specrank-headline"])
    pipeline = by_name(runs, "demo-t1")
    shown = {("metrics", k) for k in pipeline.data.metrics} | {("tags", k) for k in pipeline.data.tags}
    columns = [tuple(c.rstrip("`").split(".`", 1)) for c in view["selectedColumns"]]
    assert columns and set(columns) <= shown  # every column is a number (or tag) the pipeline run has
    assert ("tags", "specrank.headline") in columns and ("metrics", "champion.mean_gain_pct") in columns
    link = f"/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning&viewStateShareKey=specrank-headline"
    assert f"then open http://127.0.0.1:5000{link}" in models["printed"]


def test_every_run_lasts_as_long_as_its_work(demo):
    client, exp, runs, *_ = demo
    for run in runs:
        seconds = (run.info.end_time - run.info.start_time) / 1000
        wall = run.data.metrics["wall_s"]
        assert seconds == pytest.approx(wall, rel=0.2, abs=0.05), run.info.run_name
    decode = by_name(runs, "demo-t1/1-decode")
    seconds = (decode.info.end_time - decode.info.start_time) / 1000
    assert seconds == pytest.approx(decode.data.metrics["time_total_s"], rel=0.2)  # the decoder's own clock
    pipeline = by_name(runs, "demo-t1")
    stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id]
    assert all(pipeline.info.start_time <= r.info.start_time <= r.info.end_time <= pipeline.info.end_time
               for r in stages)


def test_the_runs_tables_first_page_shows_every_stage(demo):
    client, exp, runs, *_ = demo
    page = client.search_runs([exp.experiment_id], max_results=RUNS_PAGE)  # the UI's order: newest first
    stages = {"demo-t1", "demo-t1/1-decode", "demo-t1/2-featurize", "demo-t1/3-train", "demo-t1/4-evaluate"}
    assert stages <= {r.info.run_name for r in page}
    assert len(runs) <= RUNS_PAGE // 2  # the demo's two temperatures fit on the page too
    assert len({r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId")}) == len(runs) - 1  # unique


def test_cross_fit_studies_are_named_per_fold_seeded_by_name_and_repeat(tmp_path):
    from specrank.featurize import featurize_run
    from specrank.featurize.synthetic import write_synthetic_run
    from specrank.rerankers import GBMReranker, cross_fit_table

    write_synthetic_run(tmp_path / "run", n_prompts=6, rounds_per_prompt=5, topk=4, depth=3, seed=7)
    feats = featurize_run(tmp_path / "run")

    def studies(prefix):
        seen = {}
        hook = lambda fold: [lambda study, trial: seen.setdefault(study.study_name, []).append(trial.params)]  # noqa: E731
        cross_fit_table(GBMReranker("base", n_jobs=1), feats, tune_trials=2, tune_callbacks=hook, tune_study=prefix)
        return seen

    first = studies("demo-t1-base")
    assert sorted(first) == ["demo-t1-base-fold0", "demo-t1-base-fold1"]
    assert first["demo-t1-base-fold0"][0] != first["demo-t1-base-fold1"][0]
    assert studies("demo-t1-base") == first  # the same command gives the same studies
    assert studies("demo-greedy-base")["demo-greedy-base-fold0"][0] != first["demo-t1-base-fold0"][0]


def test_the_demo_logs_to_its_own_store_by_default(demo, tmp_path, monkeypatch):
    """Without --tracking-uri the demo writes ``<out>/mlflow.db`` (not ``./mlflow.db``, where ad-hoc decodes go),
    under its own experiment, and says where at the end."""
    tiny = demo[3]
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "demo-out"
    args = ["demo", "--target", str(tiny["tgt"]), "--drafter", f"standalone:{tiny['drf']}", "--limit", "4",
            "--max-new-tokens", "4", "--temperatures", "0", *SMALL, "--out", str(out)]
    with redirect_stdout(io.StringIO()) as printed:
        assert main(args) == 0
    store = out.resolve() / "mlflow.db"
    assert store.is_file() and not (tmp_path / "mlflow.db").exists()
    assert f"MLflow store: sqlite:///{store} (experiment 'specrank-demo')" in printed.getvalue()
    # the study's own table, the champion among its rows (a stacked champion is no evaluate-stage score)
    assert printed.getvalue().count(" (champion) | ") == 3  # B = 1, 8 and 59
    client = MlflowClient(f"sqlite:///{store}")
    exp = client.get_experiment_by_name("specrank-demo")
    assert [r.info.run_name for r in client.search_runs([exp.experiment_id], "tags.mlflow.parentRunId IS NULL")] == [
        "demo-greedy"]
