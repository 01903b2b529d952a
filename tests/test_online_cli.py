"""``specrank online``: the speed protocol end to end on tiny models, MLflow logging, early errors."""

import json

import mlflow
import pandas as pd
import pytest

from specrank.cli import main
from specrank.testing import save_tiny_llama
from mlflow_store import mlflow_db  # noqa: F401 (fixture)

TEXTS = ["the cat is big", "write code for a dog", "what is the sun"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("online_cli")
    tgt = save_tiny_llama(d / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(d / "drf", seed=0, vocab_size=128, num_layers=2)
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(TEXTS)))
    args = ["online", "--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts),
            "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "4", "--max-new-tokens", "8",
            "--threads", "1", "--bootstrap", "200"]
    return d, args


def test_online_protocol_runs_every_rule_on_every_prompt_and_logs_to_mlflow(setup, mlflow_db, tmp_path, capsys):
    d, args = setup
    out = tmp_path / "out"
    rc = main(args + ["--strategies", "draft,root,root_draw,pearl", "--compare", "root,draft", "--out", str(out),
                      "--tracking-uri", str(mlflow_db), "--run-name", "t"])
    assert rc == 0
    decodes = pd.read_parquet(out / "online_decodes.parquet")
    assert len(decodes) == 3 * 4 and set(decodes["strategy"]) == {"draft", "root", "root_draw", "pearl"}
    first = decodes.groupby("prompt_id", sort=False)["strategy"].first().tolist()
    assert first == ["draft", "root", "root_draw"]  # the order is rotated per prompt
    rounds = pd.read_parquet(out / "online_rounds.parquet")
    assert {"expected_root", "expected_draft", "realized", "expected"} <= set(rounds.columns)
    greedy = rounds[rounds["strategy"] != "covering"]
    assert (greedy["realized"] == greedy["expected"]).all()  # greedy: realized is the tree's value
    speed = pd.read_parquet(out / "online_speed.parquet").set_index("strategy")
    assert speed.loc["draft", "ratio"] == 1.0
    assert (out / "realized_acceptance.png").stat().st_size > 1000
    run = mlflow.MlflowClient(f"sqlite:///{mlflow_db}").search_runs(
        [mlflow.MlflowClient(f"sqlite:///{mlflow_db}").get_experiment_by_name("specrank").experiment_id])[0]
    assert "root_draw.realized.mean" in run.data.metrics and "root.speed_vs_draft.ratio" in run.data.metrics
    assert "realized" in capsys.readouterr().out


def test_missing_reranker_fails_before_decoding(setup, tmp_path, capsys):
    d, args = setup
    rc = main(args + ["--strategies", "reranked", "--reranker", str(tmp_path / "nope"), "--out", str(tmp_path / "o"),
                      "--no-tracking"])
    assert rc == 2 and "no reranker at" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    rc = main(args + ["--strategies", "reranked", "--out", str(tmp_path / "o"), "--no-tracking"])
    assert rc == 2 and "needs --reranker" in capsys.readouterr().err
    rc = main(args + ["--strategies", "draft", "--compare", "covering", "--out", str(tmp_path / "o"), "--no-tracking"])
    assert rc == 2 and "--compare: unknown strategy 'covering'" in capsys.readouterr().err


def test_spellings_of_before_the_vocabulary_was_unified_are_refused(setup, tmp_path, capsys):
    d, args = setup
    rc = main(args + ["--rules", "draft", "--out", str(tmp_path / "o"), "--no-tracking"])
    assert rc == 2 and "--rules" in capsys.readouterr().err
    rc = main(args + ["--strategies", "draft,root-draw", "--out", str(tmp_path / "o"), "--no-tracking"])
    assert rc == 2 and "unknown strategy 'root-draw'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
