"""``specrank evaluate`` / ``specrank report`` end to end: run dir + cross-fitted predictions -> outputs + MLflow."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from mlflow_store import mlflow_db  # noqa: F401  (fixture)

from specrank import tracking
from specrank.cli import main
from specrank.featurize import featurize_run
from specrank.tracking.server import free_port
from specrank.featurize.synthetic import write_synthetic_run
from specrank.rerankers import GBMReranker, IsotonicFirstFactor, cross_fit_table, load_reranker
from specrank.tracking.models import resolve_reranker

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_and_predictions(tmp_path_factory):
    """A synthetic run directory and real cross-fitted predictions (isotonic control, Base, Rows)."""
    root = tmp_path_factory.mktemp("evalcli")
    run_dir = root / "run"
    write_synthetic_run(run_dir, n_prompts=12, rounds_per_prompt=10, topk=6, depth=3, expand=6, seed=5)
    feats = featurize_run(run_dir)
    pred = feats[["prompt_id", "task", "round", "cand"]].copy()
    pred["isotonic"] = cross_fit_table(IsotonicFirstFactor(), feats).predictions
    for name in ("base", "rows"):
        fit = cross_fit_table(GBMReranker(name, n_estimators=20, num_leaves=7, n_jobs=1), feats)
        pred[name] = fit.predictions
    for fold, model in fit.models.items():  # `specrank train`'s models/NAME-foldF layout
        model.save(root / "models" / f"rows-fold{fold}")
    path = root / "predictions.parquet"
    pred.to_parquet(path, index=False)
    return run_dir, path, feats


def test_evaluate_writes_tables_report_figures_and_mlflow_run(run_and_predictions, mlflow_db, tmp_path, monkeypatch,
                                                              capsys):
    run_dir, predictions, feats = run_and_predictions
    monkeypatch.chdir(tmp_path)  # the default tracking store is ./mlflow.db
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "eval"
    rc = main(["evaluate", str(run_dir), "--predictions", str(predictions), "--out", str(out), "--bootstrap", "100",
               "--budgets", "4", "8", "59", "--models", str(predictions.parent / "models")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    for name in ("summary", "splits", "first_factor", "comparisons", "mixture_weights"):
        assert len(pd.read_parquet(out / f"{name}.parquet")) == len(pd.read_csv(out / f"{name}.csv")) > 0
    report = (out / "report.md").read_text()
    first_section = report.split("\n## ")[1]
    assert first_section.startswith("Scores at B = 8, 59")
    assert "| Score | B=8 value | B=8 gain [95% CI] | B=8 gain % of draft | B=8 root share % | B=59 value" in first_section
    for fig in ("gain_vs_budget", "root_share_by_task"):
        assert (out / "figures" / f"{fig}.png").read_bytes()[:8] == PNG
        assert f"figures/{fig}.png" in report
    summary = pd.read_parquet(out / "summary.parquet")
    assert set(summary["score"]) >= {"draft", "isotonic", "per_depth", "base", "rows", "root", "depth2", "oracle",
                                    "subst_cache", "mix_preceding"}

    client = MlflowClient(f"sqlite:///{mlflow_db}")
    exp = client.get_experiment_by_name("specrank")
    parent = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    assert len(parent) == 1
    run = parent[0]
    assert len(run.data.params["run_dir_sha256"]) == 64 and run.data.params["evaluation.budgets"] == "4,8,59"
    rows = summary[(summary["score"] == "rows") & (summary["budget"] == 8)].iloc[0]
    assert run.data.metrics["gain_tokens.rows.b8.low"] == pytest.approx(rows["gain_low"])
    assert run.data.metrics["root_share.rows.b59"] == pytest.approx(
        summary[(summary["score"] == "rows") & (summary["budget"] == 59)]["root_share"].iloc[0])
    assert len(run.data.metrics) <= 60 and "| Score | B=8 value" in run.data.tags["mlflow.note.content"]
    folds = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert sorted(r.info.run_name for r in folds) == [f"{run.info.run_name}/fold-{f}" for f in (0, 1)]
    splits = pd.read_parquet(out / "splits.parquet")
    for fold in folds:  # each fold run's headline metrics are its split rows
        at = splits[(splits.split_kind == "fold") & (splits.group == fold.info.run_name[-1]) & (splits.budget == 8)]
        assert fold.data.metrics["gain_tokens.root.b8"] == pytest.approx(at.set_index("score").loc["root", "gain"])
    uris = dict(line[len("model "):].split(": ") for line in captured.out.splitlines() if line.startswith("model "))
    assert sorted(uris) == ["rows-fold0", "rows-fold1"]
    logged = {m.name for m in client.search_logged_models([exp.experiment_id])}
    assert logged == {"evaluate-run-rows-fold0", "evaluate-run-rows-fold1"}  # <run name>-<reranker>-fold<f>
    saved = load_reranker(predictions.parent / "models" / "rows-fold1")
    logged = resolve_reranker(uris["rows-fold1"], tracking_uri=f"sqlite:///{mlflow_db}")
    np.testing.assert_array_equal(logged.predict_first_factor(feats), saved.predict_first_factor(feats))
    tags = {m.name: m.tags for m in client.search_logged_models([exp.experiment_id])}
    assert tags["evaluate-run-rows-fold1"]["specrank.format_digest"] == logged.meta_["format_digest"]
    assert logged.meta_["format_digest"] == saved.meta_["format_digest"]  # the same files as saved by train
    figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert figures == {"figures/gain_vs_budget.png", "figures/root_share_by_task.png"}
    assert "tables/summary.parquet" in {a.path for a in client.list_artifacts(run.info.run_id, "tables")}

    # `specrank report` re-renders the same report and figures from the saved tables
    (out / "report.md").unlink()
    (out / "figures" / "gain_vs_budget.png").unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "report.md").read_text() == report
    assert (out / "figures" / "gain_vs_budget.png").read_bytes()[:8] == PNG


def test_unreachable_tracking_server_fails_before_any_output(run_and_predictions, tmp_path, capsys):
    run_dir, predictions, feats = run_and_predictions
    uri = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "eval"
    rc = main(["evaluate", str(run_dir), "--predictions", str(predictions), "--out", str(out), "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and uri in err and "unreachable" in err
    assert not out.exists()


def test_user_errors_are_one_line(run_and_predictions, tmp_path, monkeypatch, capsys):
    run_dir, predictions, feats = run_and_predictions
    monkeypatch.chdir(tmp_path)
    args = ["--out", str(tmp_path / "eval"), "--no-tracking"]
    assert main(["evaluate", str(run_dir), "--predictions", str(tmp_path / "none.parquet"), *args]) == 2
    assert "predictions file" in capsys.readouterr().err
    assert main(["evaluate", str(run_dir), "--predictions", str(predictions), "--budgets", "0", *args]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "not an evaluation directory" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists() and not (tmp_path / "mlflow.db").exists()
