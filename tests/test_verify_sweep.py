"""``specrank verify-sweep`` end to end on tiny models: table, report, figure, MLflow; grid parsing."""

import json

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from mlflow_store import mlflow_db  # noqa: F401  (fixture)

from specrank.cli import main
from specrank.decode.runs.lossy import read_diagnostics
from specrank.decode.runs.tables import read_rounds
from specrank.experiments.verify_sweep.sweep_tables import GridError, expand_grid, findings, matched_pairs
from specrank.testing import save_tiny_llama
from verify_helpers import one_thread  # noqa: F401  (autouse fixture: one torch thread)

PNG = b"\x89PNG\r\n\x1a\n"
TEXTS = ["the cat is big", "write code for a dog", "what is the sun"]




@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    tgt = save_tiny_llama(d / "tgt", seed=0, vocab_size=128, num_layers=2, initializer_range=0.1)
    drf = save_tiny_llama(d / "drf", seed=3, vocab_size=128, num_layers=1, initializer_range=0.1)
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(TEXTS)))
    return ["--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts)]


def test_expand_grid():
    assert expand_grid("lossless") == ["lossless"]
    assert expand_grid("typical:eps=0.1/0.2,delta=0.5") == ["typical:eps=0.1,delta=0.5", "typical:eps=0.2,delta=0.5"]
    assert len(expand_grid("fuzzy:T=0.1/0.2,div=tv/kl")) == 4
    for bad in ("minp:p_base", "minp:p_base=0.1/", ":l=1"):
        with pytest.raises(GridError):
            expand_grid(bad)


def test_sweep_end_to_end(models, mlflow_db, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "sweep"
    args = ["verify-sweep", *models, "--out", str(out), "--grid", "lossless", "minp:p_base=0.3",
            "speccascade:p_base=0.3", "lenience:l=0.5", "--temperature", "1", "--chain-length", "3",
            "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "6", "--max-new-tokens", "12",
            "--threads", "1", "--no-progress"]
    rc = main(args)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "skipped (no tree form): tree lenience:l=0.5" in captured.out
    table = pd.read_parquet(out / "verify_sweep.parquet")
    assert len(table) == 7 and set(table["speculation"]) == {"tree", "chain"}
    for row in table.itertuples():  # every number is recomputed from the cell's own run directory
        run = out / "runs" / row.speculation / row.verification_rule.replace(":", "_")
        rounds, diag = read_rounds(run), read_diagnostics(run)
        assert row.block_efficiency == pytest.approx(rounds["accepted"].mean())
        assert row.tokens == len(diag) == int((rounds["accepted"] + 1).sum())
        assert row.tv == pytest.approx(diag["tv"].mean())
        assert row.tokens_per_s > 0
    lossless = table[table["verification_rule"] == "lossless"]
    assert (lossless["tv"] < 1e-9).all() and lossless["tv_truncated"].isna().all()
    lenience = table[table["family"] == "lenience"].iloc[0]
    assert lenience["ceiling_excess"] <= 1e-12 and lenience["tv"] > 0
    tree = table[table["speculation"] == "tree"]
    assert tree["expected_block_efficiency"].notna().all()
    assert len(matched_pairs(table)) == 2 and len(findings(table)) == 3
    report = (out / "report.md").read_text()
    assert "## Matched pairs" in report and "speccascade:p_base=0.3" in report
    assert (out / "figures" / "tradeoff.png").read_bytes()[:8] == PNG

    client = MlflowClient(f"sqlite:///{mlflow_db}")
    run = client.search_runs([client.get_experiment_by_name("specrank").experiment_id])[0]
    assert run.data.params["stage"] == "verify-sweep"
    key = "chain.speccascade_p_base_0.3.block_efficiency"  # MLflow keys: ":" and "=" become "_"
    assert run.data.metrics[key] == pytest.approx(
        float(table[(table["speculation"] == "chain") & (table["family"] == "speccascade")]["block_efficiency"].iloc[0]))
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert "figures/tradeoff.png" in artifacts

    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*.parquet")}
    assert main(args + ["--no-tracking"]) == 0  # a rerun resumes every cell: nothing is decoded again
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*.parquet")} == before
    np.testing.assert_allclose(pd.read_parquet(out / "verify_sweep.parquet")["tv"], table["tv"])

    path = out / "runs" / "chain" / "lenience_l=0.5" / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "verification_rule": "lossless"}))  # compared
    assert main(args + ["--no-tracking"]) == 2 and "differs in: verification_rule" in capsys.readouterr().err


def test_bad_grid_is_one_line_and_writes_nothing(models, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["verify-sweep", *models, "--out", str(out), "--grid", "lenience:l=2", "--no-tracking"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lenience l must lie in (0, 1]" in err
    assert not out.exists()
    assert main(["verify-sweep", *models, "--out", str(out), "--grid", "cos:lam=0.5", "--speculations", "tree",
                 "--no-tracking"]) == 2
    assert "no rule the chosen speculations can run" in capsys.readouterr().err and not out.exists()


def test_decode_command_with_a_verifier(models, tmp_path, capsys):
    base = ["decode", *models, "--max-new-tokens", "8", "--threads", "1", "--no-progress", "--temperature", "1",
            "--no-tracking"]
    out = tmp_path / "chain"
    chain = ["--speculation", "chain", "--chain-length", "2", "--verification-rule", "lenience:l=0.5"]
    assert main(base + ["--out", str(out), *chain]) == 0
    diag, rounds = read_diagnostics(out), read_rounds(out)
    assert len(diag) == int((rounds["accepted"] + 1).sum()) and (diag["ceiling_excess"] <= 1e-12).all()
    assert json.loads((out / "manifest.json").read_text())["verification_rule"] == "lenience:l=0.5"
    tree = tmp_path / "tree"
    assert main(base + ["--out", str(tree), "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "6",
                        "--verification-rule", "typical:eps=0.1"]) == 0
    assert read_diagnostics(tree)["tv_truncated"].notna().all()
    capsys.readouterr()
    assert main(base + ["--out", str(tmp_path / "bad"), "--verification-rule", "cos:lam=0.5"]) == 2
    assert "no tree form" in capsys.readouterr().err and not (tmp_path / "bad").exists()
