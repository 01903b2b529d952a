"""`specrank train --tracking-uri`: parent run, nested (reranker, fold) runs, Optuna trials under them, models by URI."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow_store import mlflow_db  # noqa: F401  (fixture)

from specrank import tracking
from specrank.cli import main
from specrank.featurize import read_features
from specrank.featurize.synthetic import write_synthetic_run
from specrank.rerankers import GBMReranker, cross_fit_table, load_reranker
from specrank.tracking.models import resolve_reranker
from specrank.tracking.training import fold_metrics, top1_hits
from specrank.tracking.uri import optional_uri

SMALL = ["--n-estimators", "20", "--num-leaves", "7", "--n-jobs", "1"]


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    run = tmp_path_factory.mktemp("train_tracking") / "run"
    write_synthetic_run(run, n_prompts=6, rounds_per_prompt=5, topk=4, depth=3, seed=7)
    assert main(["featurize", str(run)]) == 0
    return run / "features.parquet"


def test_top1_hits_ties_and_uncounted_rounds():
    # round 0: top prediction (cand 1) has the highest label; round 1: predictions tie, cand 0 wins
    # and misses; round 2: all labels 0 (argmax outside the first level), not counted.
    rounds = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    cand = np.tile([0, 1, 2], 3)
    label = np.array([0.1, 0.7, 0.2, 0.2, 0.6, 0.2, 0, 0, 0])
    pred = np.array([0.3, 0.5, 0.2, 0.4, 0.4, 0.1, 0.9, 0.1, 0.0])
    hit, counted = top1_hits(pred, label, rounds, cand)
    np.testing.assert_array_equal(hit, [True, False, True])
    np.testing.assert_array_equal(counted, [True, True, False])
    shuffled = np.random.default_rng(0).permutation(9)  # row order does not matter
    hit2, _ = top1_hits(pred[shuffled], label[shuffled], rounds[shuffled], cand[shuffled])
    np.testing.assert_array_equal(hit2, hit)
    m = fold_metrics(pred, label, np.array([0.5, 0.3, 0.2] * 3), rounds, cand)
    assert m["top1_best_label_pct"] == 50.0 and m["draft_top1_best_label_pct"] == 0.0 and m["n_rounds"] == 3.0
    assert m["heldout_mse"] == pytest.approx(np.mean((pred - label) ** 2))


def test_cross_fit_passes_each_fold_its_own_callbacks(features):
    feats = read_features(features)
    seen = []

    def hook(fold):
        return [lambda study, trial: seen.append((int(fold), trial.number))]

    out = cross_fit_table(GBMReranker("base", n_estimators=10, num_leaves=7, n_jobs=1), feats, tune_trials=2,
                    tune_callbacks=hook)
    assert seen == [(0, 0), (0, 1), (1, 0), (1, 1)] and set(out.params) == {0, 1}


def test_training_uri_default_and_none(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    assert optional_uri(None) is None
    assert optional_uri("default") == f"sqlite:///{tmp_path}/env.db"


def expected_metrics(preds: pd.DataFrame, name: str, fold: int) -> dict:
    """The fold's metrics recomputed round by round with pandas (independent of the vectorized code)."""
    h = preds[preds.fold == fold]
    top = h.sort_values([name, "cand"], ascending=[False, True]).groupby(["prompt_id", "round"]).head(1)
    best = h.groupby(["prompt_id", "round"])["label"].max().rename("best")
    top = top.join(best, on=["prompt_id", "round"])
    counted = top[top.best > 0]
    return {"n_candidates": len(h), "heldout_mse": ((h[name] - h.label) ** 2).mean(),
            "draft_heldout_mse": ((h.draft - h.label) ** 2).mean(),
            "top1_best_label_pct": 100 * (counted.label == counted.best).mean()}


def test_train_logs_parent_folds_trials_and_loadable_models(features, mlflow_db, tmp_path, capsys):  # noqa: F811
    from mlflow.tracking import MlflowClient

    uri, out = f"sqlite:///{mlflow_db}", tmp_path / "out"
    code = main(["train", str(features), "--rerankers", "isotonic,base", "--tune-trials", "2", *SMALL,
                 "--out-dir", str(out), "--tracking-uri", uri, "--experiment", "t", "--run-name", "demo-train"])
    assert code == 0
    printed = dict(line[len("model "):].split(": ") for line in capsys.readouterr().out.splitlines()
                   if line.startswith("model "))
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("t").experiment_id
    runs = client.search_runs([exp])
    assert {r.info.status for r in runs} == {"FINISHED"}
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.run_name for r in parents] == ["demo-train"]
    parent = parents[0]
    p = parent.data.params
    assert p["rerankers"] == "isotonic,base" and p["settings.n_estimators"] == "20" and p["settings.tune_trials"] == "2"
    assert p["pool.topk"] == "4" and p["pool.rows"] == "120" and p["pool.label_kind"] == "probability"
    assert p["features_sha256"] == tracking.file_hash(features) and p["feature_columns.isotonic"] == "1"
    assert "predictions.parquet" in {a.path for a in client.list_artifacts(parent.info.run_id)}

    children = {r.info.run_name.removeprefix("demo-train/"): r for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == ["base-fold0", "base-fold1", "isotonic-fold0", "isotonic-fold1"]
    # one name per metric whichever the reranker (a tag and a param of its run): one chart compares them
    assert len({frozenset(r.data.metrics) for r in children.values()}) == 1
    assert {r.data.tags["specrank.reranker"] for r in children.values()} == {"isotonic", "base"}
    assert {"heldout_mse", "heldout_mse_pct_of_draft", "draft_heldout_mse"} <= set(children["base-fold0"].data.metrics)
    assert not [k for k in parent.data.metrics if k.startswith(("isotonic", "base"))]
    preds = pd.read_parquet(out / "predictions.parquet")
    feats = read_features(features)
    for key, run in children.items():
        name, fold = key.rsplit("-fold", 1)
        for metric, value in expected_metrics(preds, name, int(fold)).items():
            assert run.data.metrics[metric] == pytest.approx(value), (key, metric)
        assert not [r for r in runs if r.data.tags.get("mlflow.parentRunId") == run.info.run_id]  # no trial runs
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "tables")}
        assert ("tables/trials.json" in artifacts) == (name == "base")
        if name == "base":  # the fold's study, and tuned parameters that are those its model was fitted with
            trials = pd.read_json(client.download_artifacts(run.info.run_id, "tables/trials.json"), orient="split")
            assert len(trials) == 2 and trials["inner_mse"].notna().all() and "param.num_leaves" in trials
            assert run.data.params["study"] == f"demo-train-base-fold{fold}"
            model = load_reranker(out / "models" / key)
            assert int(run.data.params["tuned.num_leaves"]) == model.num_leaves
        loaded = resolve_reranker(printed[key], tracking_uri=uri)
        pickled = load_reranker(out / "models" / key)
        held = feats[feats.fold == int(fold)]
        np.testing.assert_array_equal(loaded.predict_first_factor(held), pickled.predict_first_factor(held))
        np.testing.assert_array_equal(pickled.predict_first_factor(held), preds.loc[held.index, name])


def test_unreachable_server_fails_before_any_output(features, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["train", str(features), "--rerankers", "isotonic", "--out-dir", str(out),
                 "--tracking-uri", "http://127.0.0.1:9"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "http://127.0.0.1:9" in err and "unreachable" in err and "\n" not in err
    assert not out.exists()
