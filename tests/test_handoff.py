"""The train -> online hand-off: a reranker logged by ``specrank train --tracking-uri U`` loads in ``specrank online
--tracking-uri U --reranker models:/...`` and in a ``Decoder`` given ``resolve_reranker(URI, tracking_uri=U)`` from another
working directory, against a SQLite store and a real ``mlflow server``, and no ``mlflow.db`` appears anywhere else."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from specrank.cli import main
from specrank.featurize.synthetic import write_synthetic_run
from specrank.testing import save_tiny_llama
from mlflow_store import migrated_db, mlflow_server  # noqa: F401  (fixture)

# These tests share costly module fixtures: pytest-xdist keeps them on one worker.
pytestmark = pytest.mark.xdist_group("mlflow-handoff")

REPO = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Tiny models, prompts, and a features table whose pools match online's (topk 3, sampling labels)."""
    d = tmp_path_factory.mktemp("handoff")
    tgt, drf = save_tiny_llama(d / "tgt", seed=0), save_tiny_llama(d / "drf", seed=0, num_layers=2)
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(["the cat is big", "what is the sun"])))
    write_synthetic_run(d / "run", n_prompts=6, rounds_per_prompt=5, topk=3, depth=3, seed=7)
    assert main(["featurize", str(d / "run")]) == 0
    online = ["online", "--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts),
              "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "4", "--max-new-tokens", "4",
              "--temperature", "1", "--threads", "1", "--bootstrap", "50", "--no-tracking"]
    return d, online


def stray_stores(*roots) -> list[Path]:
    return [p for root in roots for p in Path(root).rglob("*") if p.name in ("mlflow.db", "mlruns")]


def train_and_hand_off(world, store_uri, tmp_path, monkeypatch, capsys):
    """Train in one directory, decode online and with a Decoder in another; return the model URI."""
    from specrank.decode import Decoder, PoolShape, load_drafter, load_target

    d, online = world
    train_dir, online_dir = tmp_path / "train_here", tmp_path / "online_here"
    train_dir.mkdir()
    online_dir.mkdir()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(train_dir)
    assert main(["train", str(d / "run" / "features.parquet"), "--rerankers", "isotonic", "--out-dir",
                 str(tmp_path / "rerankers"), "--tracking-uri", store_uri]) == 0
    uri = re.search(r"model isotonic-fold0: (models:/\S+)", capsys.readouterr().out)[1]
    monkeypatch.chdir(online_dir)
    out = tmp_path / "online"
    tracked = [a for a in online if a != "--no-tracking"]  # the online run is logged to the same store
    assert main(tracked + ["--strategies", "draft,reranked", "--reranker", uri, "--tracking-uri", store_uri,
                           "--out", str(out)]) == 0
    assert set(pd.read_parquet(out / "online_decodes.parquet")["strategy"]) == {"draft", "reranked"}
    import mlflow

    from specrank.rerankers import load_reranker

    client = mlflow.MlflowClient(store_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "params.stage = 'online'")
    saved = load_reranker(tmp_path / "rerankers" / "models" / "isotonic-fold0").meta_["format_digest"]
    assert runs[0].data.params["reranker_format_digest"] == saved  # the run names the files it decoded with
    target = load_target(d / "tgt")
    from specrank.tracking import resolve_reranker

    dec = Decoder(target, load_drafter(f"standalone:{d / 'drf'}", target), "reranked",
                  reranker=resolve_reranker(uri, tracking_uri=store_uri), budget=4, shape=PoolShape(3, 3, 3),
                  temperature=1.0)
    assert dec.generate("the cat is big", max_new_tokens=4).stats.rounds >= 1
    # the same URI without its store: one line naming where it looked, and nothing created there
    capsys.readouterr()
    assert main(online + ["--strategies", "reranked", "--reranker", uri, "--out", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no MLflow database at" in err[0] and str(online_dir) in err[0], err
    assert not stray_stores(train_dir, online_dir, REPO) and not (tmp_path / "nope").exists()
    return uri


def test_handoff_through_a_sqlite_store(world, tmp_path_factory, tmp_path, monkeypatch, capsys):
    db = migrated_db(tmp_path_factory, tmp_path / "store" / "X.db")
    train_and_hand_off(world, f"sqlite:///{db}", tmp_path, monkeypatch, capsys)
    assert {p.name for p in (tmp_path / "store").iterdir()} == {"X.db", "mlruns"}  # artifacts beside the store


def test_handoff_through_a_real_mlflow_server(world, mlflow_server, tmp_path, monkeypatch, capsys):  # noqa: F811
    train_and_hand_off(world, mlflow_server, tmp_path, monkeypatch, capsys)
