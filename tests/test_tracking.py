"""specrank.tracking against local stores: URIs, reachability, runs, artifacts, reranker models."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from specrank import tracking  # noqa: E402
from specrank.featurize.features import META_KEY, feature_meta  # noqa: E402
from specrank.rerankers import GBMReranker, IsotonicFirstFactor, load_reranker  # noqa: E402
from specrank.tracking.models import resolve_reranker
from specrank.tracking.server import free_port  # noqa: E402
from specrank.tracking.uri import tracking_store  # noqa: E402
from mlflow_store import mlflow_db  # noqa: E402,F401  (fixture)


def small_reranker():
    """A fitted isotonic first-factor reranker and a features frame it scores."""
    rng = np.random.default_rng(0)
    q = rng.random(400)
    features = pd.DataFrame({"q": q, "log_q": np.log(q), "task": rng.choice(["a", "b"], 400)})
    features.attrs[META_KEY] = feature_meta("probability", 4, 1.0)
    label = np.clip(q + 0.2 * rng.standard_normal(400), 0, 1)
    return IsotonicFirstFactor().fit(features, label), features


def test_default_uri_is_sqlite_in_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.resolve_tracking_uri(None) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert tracking.resolve_tracking_uri(None) == "http://tracking.example:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.resolve_tracking_uri("http://host:5000") == "http://host:5000"
    assert tracking.resolve_tracking_uri("runs.db") == f"sqlite:///{tmp_path.resolve()}/runs.db"
    assert tracking.resolve_tracking_uri("store").startswith("file:///")


def test_unreachable_server_fails_fast_naming_the_uri():
    uri = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(tracking.TrackingError, match=uri.replace(".", r"\.")) as err:
        with tracking.experiment_run("never", tracking_uri=uri):
            pytest.fail("the run must not start")
    assert time.monotonic() - start < 5
    assert "\n" not in str(err.value)
    assert mlflow.get_tracking_uri() != uri


def test_missing_sqlite_directory_is_one_line_error(tmp_path):
    with pytest.raises(tracking.TrackingError, match="does not exist"):
        tracking.check_tracking_uri(f"sqlite:///{tmp_path}/absent/mlflow.db")


def test_flatten_params_and_metric_keys():
    flat = tracking.flatten_params({"pool": {"M": 710, "topk": 10}, "budgets": [8, 59], "set": "rows[x]"})
    assert flat == {"pool.M": "710", "pool.topk": "10", "budgets": "8,59", "set": "rows[x]"}
    assert tracking.metric_key("gain[B=8]/rows") == "gain_B_8_/rows"


def log_experiment(uri: str, reranker, features) -> tuple[str, str]:
    """A parent run with two nested folds, params, metrics, a table, a figure, a report and a model."""
    with tracking.experiment_run("specrank-test", run_name="parent", tracking_uri=uri) as parent:
        tracking.log_params({"pool": {"M": 710, "topk": 10}, "budgets": [8, 59]})
        tracking.log_metrics({"gain.rows.B8": 0.125, "undefined": float("nan")})
        for fold in (0, 1):
            with tracking.nested_run(f"fold-{fold}"):
                tracking.log_metrics({"mse": 0.01 * (fold + 1)})
        fig, ax = plt.subplots()
        ax.plot([8, 59], [0.1, 0.05])
        tracking.log_figure(fig, "gain_vs_budget")
        plt.close(fig)
        tracking.log_frame(pd.DataFrame({"score": ["draft", "root"], "value": [1.0, 1.2]}), "values")
        tracking.log_report("# report\n")
        model_uri = tracking.log_reranker(reranker, "isotonic", features)
    return parent.info.run_id, model_uri


def check_logged(uri: str, run_id: str, model_uri: str, reranker, features) -> None:
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.params["pool.M"] == "710" and run.data.params["budgets"] == "8,59"
    assert run.data.metrics["gain.rows.B8"] == 0.125 and "undefined" not in run.data.metrics
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run_id}'"
    )
    assert sorted(c.info.run_name for c in children) == ["parent/fold-0", "parent/fold-1"]  # under its parent
    assert sorted(c.data.metrics["mse"] for c in children) == [0.01, 0.02]
    paths = {a.path for a in client.list_artifacts(run_id)}
    assert {"figures", "tables", "report.md"} <= paths
    assert {a.path for a in client.list_artifacts(run_id, "figures")} == {"figures/gain_vs_budget.png"}
    loaded = resolve_reranker(model_uri, tracking_uri=uri)
    np.testing.assert_array_equal(loaded.predict_first_factor(features), reranker.predict_first_factor(features))
    with tracking_store(uri):
        pyfunc = mlflow.pyfunc.load_model(model_uri)
    assert pyfunc.metadata.get_input_schema() is not None
    np.testing.assert_array_equal(pyfunc.predict(features.head(50)), reranker.predict_first_factor(features.head(50)))


def test_sqlite_store_run_with_folds_artifacts_and_model(mlflow_db):
    uri = f"sqlite:///{mlflow_db}"
    reranker, features = small_reranker()
    run_id, model_uri = log_experiment(uri, reranker, features)
    check_logged(uri, run_id, model_uri, reranker, features)
    assert (mlflow_db.parent / "mlruns").is_dir()  # artifacts beside the database, not in the working directory


def test_an_optuna_study_is_one_run_with_its_trials_table_and_history(mlflow_db):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uri = f"sqlite:///{mlflow_db}"
    logger = tracking.TrialLogger("mse")
    with tracking.experiment_run("specrank-tune", run_name="tune", tracking_uri=uri) as parent:
        study = optuna.create_study(study_name="lr-search", sampler=optuna.samplers.RandomSampler(seed=0))
        study.optimize(lambda t: (t.suggest_float("lr", 0.01, 0.1) - 0.05) ** 2, n_trials=3, callbacks=[logger])
        logger.log()
    client = MlflowClient(uri)
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert children == []  # no run per trial
    run = client.get_run(parent.info.run_id)
    assert run.data.params["study"] == "lr-search" and run.data.params["study_trials"] == "3"
    table = pd.read_json(client.download_artifacts(parent.info.run_id, "tables/trials.json"), orient="split")
    assert list(table["trial"]) == [0, 1, 2]
    for trial in study.trials:
        assert table.loc[trial.number, "mse"] == pytest.approx(trial.value)
        assert table.loc[trial.number, "param.lr"] == pytest.approx(trial.params["lr"])
    assert float(run.data.params["study_best_mse"]) == pytest.approx(study.best_value)
    assert "optimization_history.png" in {a.path.split("/")[-1] for a in client.list_artifacts(run.info.run_id, "figures")}


def test_load_reranker_from_a_saved_file(tmp_path):
    from specrank.rerankers import save_reranker

    reranker, features = small_reranker()
    save_reranker(reranker, tmp_path / "iso")
    loaded = load_reranker(tmp_path / "iso")
    np.testing.assert_array_equal(loaded.predict_first_factor(features), reranker.predict_first_factor(features))
    with pytest.raises(FileNotFoundError, match="neither a saved reranker"):
        load_reranker(tmp_path)


def test_logging_a_reranker_with_integer_inputs_shows_no_mlflow_warnings(mlflow_db):
    """The signature's integer-column hint (and MLflow's other notices) stay out of a run's output."""
    import warnings

    rng = np.random.default_rng(0)
    q = rng.random(200)
    features = pd.DataFrame({"q": q, "log_q": np.log(q), "position": rng.integers(0, 50, 200)})
    features.attrs[META_KEY] = feature_meta("probability", 4, 1.0)
    reranker = GBMReranker(["q", "position"], n_estimators=5, num_leaves=3).fit(features, np.clip(q, 0, 1))
    with tracking.experiment_run("specrank-test", run_name="ints", tracking_uri=f"sqlite:///{mlflow_db}"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tracking.log_reranker(reranker, "gbm", features)
    assert not [w for w in caught if "nteger" in str(w.message)]


def test_experiments_are_created_as_model_training_and_runs_nest_under_an_active_run(mlflow_db):
    uri = f"sqlite:///{mlflow_db}"
    client = MlflowClient(uri)
    with tracking.experiment_run("kind", run_name="pipeline", tracking_uri=uri, description="the pipeline") as parent:
        with tracking.experiment_run("kind", run_name="stage", tracking_uri=uri) as child:
            pass
        with pytest.raises(tracking.TrackingError, match="another experiment"):
            with tracking.experiment_run("other", tracking_uri=uri):
                pytest.fail("must not start")
    exp = client.get_experiment_by_name("kind")
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == tracking.MODEL_TRAINING == "custom_model_development"
    assert client.get_run(child.info.run_id).data.tags["mlflow.parentRunId"] == parent.info.run_id
    run = client.get_run(parent.info.run_id)
    assert run.data.tags["mlflow.note.content"] == "the pipeline"
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    if head.returncode == 0:  # a checkout: the code version is MLflow's git commit tag
        assert run.data.tags["mlflow.source.git.commit"] == head.stdout.strip()
    client.set_experiment_tag(exp.experiment_id, tracking.EXPERIMENT_KIND_TAG, "genai_development")
    with tracking.experiment_run("kind", tracking_uri=uri):
        pass  # a kind someone chose is kept
    assert client.get_experiment_by_name("kind").tags[tracking.EXPERIMENT_KIND_TAG] == "genai_development"


def test_headline_metrics_stay_within_the_limit_and_name_their_units():
    from specrank.tracking.evaluation import MAX_METRICS, headline_metrics

    scores = ["draft", "root", "oracle", "depth2", "subst_cache"] + [f"r{i}" for i in range(9)]
    rows = [{"score": r, "budget": b, "rounds": 50, "mean": 1.0 + i / 10, "gain": i / 10, "gain_low": i / 20,
             "gain_high": i / 5, "root_share": 10.0 * i} for i, r in enumerate(scores) for b in (8, 59, 100)]
    metrics = headline_metrics(pd.DataFrame(rows), [8, 59, 100])
    assert len(metrics) <= MAX_METRICS
    # one scheme: <quantity>.<score>.b<budget>, an interval's ends .low and .high
    assert metrics["value.draft.b8"] == 1.0 and metrics["gain_tokens.root.b59.high"] == pytest.approx(0.2)
    assert metrics["root_share.r0.b8"] == 50.0 and "gain_tokens.r0.b59.low" in metrics
    assert not [k for k in metrics if ".b100" in k or ".depth2." in k or ".subst" in k]  # those stay in the tables
    assert "gain_tokens.r8.b8" not in metrics  # past the limit


def test_model_names_are_valid_mlflow_names():
    assert tracking.model_name("demo-t1", "rows", 0) == "demo-t1-rows-fold0"
    assert tracking.model_name("demo-t0.5", "rows", 1) == "demo-t0_5-rows-fold1"  # MLflow refuses '.'
    assert tracking.model_name(None, "base", 1) == "base-fold1"


def test_html_report_embeds_its_figures(tmp_path):
    from specrank.evaluation.html import report_html

    (tmp_path / "figures").mkdir()
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 20
    (tmp_path / "figures" / "a.png").write_bytes(png)
    page = report_html("# Title\n\nSome *units* `here`.\n\n| Score | B=8 |\n|---|---|\n| Rows | 1.5 < 2 |\n\n"
                       "![Gain](figures/a.png)\n\n![Lost](figures/none.png)\n", tmp_path)
    assert "<h1>Title</h1>" in page and "<em>units</em>" in page and "<code>here</code>" in page
    assert "<th>Score</th>" in page and "<td>1.5 &lt; 2</td>" in page
    import base64

    assert f'src="data:image/png;base64,{base64.b64encode(png).decode()}"' in page
    assert "![" not in page and "(missing: none.png)" in page
