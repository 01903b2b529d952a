"""Every command against bad input: exit status 2, exactly one stderr line naming the field, no traceback, and
nothing written (the inputs unchanged, no output location, no ``mlflow.db`` in the working directory).

Most cases fail before any model loads, so the suite runs them in-process (``specrank.cli.main``); a few run
as subprocesses, as a user would. Read-only locations are made with ``chmod`` and, for root (whom modes do
not stop), with ``chattr +i``.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from specrank.cli import main
from specrank.tracking.server import free_port
from mlflow_store import migrated_db

TEXTS = ["the cat is big", "what is the sun"]


def make_read_only(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
    else:
        path.chmod(0o555 if path.is_dir() else 0o444)


def make_writable(path: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=True, capture_output=True)
    else:
        path.chmod(0o755 if path.is_dir() else 0o644)


def write_prompts(path: Path, lines) -> Path:
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) + "\n" for line in lines))
    return path


class Forbidden(BaseHTTPRequestHandler):
    """An HTTP server that answers /health (so it looks reachable) and refuses everything else, as an
    authenticating proxy in front of a tracking server would."""

    def _answer(self):
        self.send_response(200 if self.path.rstrip("/").endswith("/health") else 403)
        self.end_headers()
        self.wfile.write(b"OK" if self.path.endswith("/health") else b'{"error_code": "PERMISSION_DENIED"}')

    do_GET = do_POST = do_PATCH = do_DELETE = _answer

    def log_message(self, *args):
        pass


class NotMLflow(BaseHTTPRequestHandler):
    """A web server that answers everything with a page: reachable, but no MLflow tracking server."""

    def _answer(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html><body>hello</body></html>")

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


class ReadOnlyMLflow(BaseHTTPRequestHandler):
    """An MLflow server as a read-only token sees it: the read call answers, every write is refused."""

    def do_GET(self):
        ok = self.path.startswith("/api/2.0/mlflow/experiments/search")
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"experiments": []}' if ok else b'{"error_code": "PERMISSION_DENIED"}')

    def do_POST(self):
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error_code": "PERMISSION_DENIED", "message": "read-only token"}')

    def log_message(self, *args):
        pass


def missing_scheme() -> str:
    """A model URI scheme whose client library is not installed here."""
    import importlib.util

    from specrank.tracking.models import MODEL_SCHEMES

    for scheme, needs in MODEL_SCHEMES.items():
        try:
            if needs and importlib.util.find_spec(needs[0]) is None:
                return scheme
        except ModuleNotFoundError:
            return scheme
    pytest.skip("every model URI scheme's client library is installed")


def missing_driver() -> str:
    """A database tracking-URI scheme whose default driver is not installed here."""
    from sqlalchemy.engine import make_url

    for scheme in ("postgresql", "mysql", "mssql"):
        try:
            make_url(f"{scheme}://h/db").get_dialect().import_dbapi()
        except ModuleNotFoundError:
            return scheme
    pytest.skip("every database driver is installed")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Every input of the cases, built once; the cases must leave all of it as it was."""
    from specrank.atomic import write_parquet_atomic
    from specrank.featurize.synthetic import write_synthetic_run
    from specrank.files import DataFileError, read_table
    from specrank.testing import save_tiny_llama

    d = tmp_path_factory.mktemp("bad_inputs")
    w = SimpleNamespace(root=d / "inputs", cache=d / "cache")
    r = w.root
    r.mkdir()
    w.tgt = save_tiny_llama(r / "tgt", seed=0)
    w.drf = save_tiny_llama(r / "drf", seed=0, num_layers=2)
    p = {"question_id": 1, "category": "qa", "turns": ["a b"]}
    w.prompts = write_prompts(r / "prompts.jsonl", [{**p, "question_id": i, "turns": [t]} for i, t in enumerate(TEXTS)])
    w.p_malformed = write_prompts(r / "malformed.jsonl", [p, '{"question_id": 2,\n'])
    w.p_empty_file = write_prompts(r / "empty_file.jsonl", [])
    w.p_empty = write_prompts(r / "empty_prompt.jsonl", [p, {**p, "question_id": 2, "turns": [""]}])
    w.p_blank = write_prompts(r / "blank_prompt.jsonl", [{**p, "turns": ["   \n"]}])
    w.p_dup = write_prompts(r / "dup.jsonl", [p, p])
    w.p_humaneval = write_prompts(r / "humaneval.jsonl", [{"prompt": "def f():"}])
    w.p_neither = write_prompts(r / "neither.jsonl", [{"text": "hello"}])
    w.p_long = write_prompts(r / "long.jsonl", [{**p, "turns": [" ".join(["cat"] * 600)]}])
    (r / "latin1.jsonl").write_bytes('{"question_id": 1, "turns": ["caf\xe9"]}\n'.encode("latin-1"))
    w.p_latin1 = r / "latin1.jsonl"
    # targets and drafter files that are not what they claim
    w.tgt_bad_config = r / "tgt_bad_config"
    shutil.copytree(w.tgt, w.tgt_bad_config)
    (w.tgt_bad_config / "config.json").write_text('{"model_type": "llama",\n  "hidden_size": 32,,\n}')
    w.tgt_no_config = r / "tgt_no_config"
    w.tgt_no_config.mkdir()
    (w.tgt_no_config / "weights.bin").write_bytes(b"\0" * 16)
    from specrank.decode.loading.named_targets import default_gguf

    with open(default_gguf(), "rb") as fh:
        (r / "truncated.gguf").write_bytes(fh.read(1 << 20))
    w.gguf_truncated = r / "truncated.gguf"
    w.gguf_fake = r / "fake.gguf"
    w.gguf_fake.write_text("not a gguf")
    w.text = r / "notes.txt"
    w.text.write_text("the cat is big and the dog is small\n" * 20)
    w.text_short = r / "short.txt"
    w.text_short.write_text("a")
    pickled_weights(w)
    w.head_not_safetensors = r / "head.safetensors"
    w.head_not_safetensors.write_bytes(b"\x93NUMPY this is not safetensors")
    # a recorded run, its features, a model directory, an evaluation
    w.run = r / "run"
    write_synthetic_run(w.run, n_prompts=6, rounds_per_prompt=5, topk=3, depth=3, seed=7)
    assert main(["featurize", str(w.run), "--edges-out", str(r / "edges.parquet")]) == 0
    w.features, w.edges = w.run / "features.parquet", r / "edges.parquet"
    assert main(["train", str(w.features), "--rerankers", "isotonic", "--out-dir", str(r / "trained")]) == 0
    w.preds, w.models = r / "trained" / "predictions.parquet", r / "trained" / "models"
    assert main(["evaluate", str(w.run), "--predictions", str(w.preds), "--out", str(r / "eval"), "--bootstrap",
                 "50", "--no-tracking"]) == 0
    w.evald = r / "eval"
    another_run(w)
    feats = read_table(w.features).to_pandas()
    write_parquet_atomic(feats.drop(columns=["q"]), r / "features_no_q.parquet")  # keeps no specrank metadata
    w.features_no_q = r / "features_no_q.parquet"
    feats_no_q = feats.drop(columns=["q"])
    feats_no_q.attrs = {"specrank": {"label_kind": "probability", "topk": 3, "temperature": 1.0, "version": "0.1.0"}}
    from specrank.featurize import write_features

    write_features(feats_no_q, r / "features_meta_no_q.parquet")
    w.features_meta_no_q = r / "features_meta_no_q.parquet"
    preds = read_table(w.preds).to_pandas()
    write_parquet_atomic(preds[["prompt_id"]], r / "preds_no_keys.parquet")
    write_parquet_atomic(preds.assign(isotonic=np.nan), r / "preds_nan.parquet")
    write_parquet_atomic(preds.assign(prompt_id="elsewhere"), r / "preds_other_run.parquet")
    from specrank.featurize import read_features

    feats = read_features(w.features)
    text_q = feats.assign(log_q=feats["log_q"].astype(str))
    text_q.loc[text_q.index[3], "log_q"] = "n/a"
    text_q.attrs = feats.attrs
    write_features(text_q, r / "features_text_column.parquet")
    w.features_text_column = r / "features_text_column.parquet"
    nan_rows = feats.assign(cache_logp=np.nan)
    nan_rows.attrs = feats.attrs
    write_features(nan_rows, r / "features_nan_rows.parquet")
    w.features_nan_rows = r / "features_nan_rows.parquet"
    w.features_named_predictions = r / "features_here" / "predictions.parquet"
    w.features_named_predictions.parent.mkdir()
    shutil.copy(w.features, w.features_named_predictions)
    w.preds_no_keys, w.preds_nan = r / "preds_no_keys.parquet", r / "preds_nan.parquet"
    w.preds_other_run = r / "preds_other_run.parquet"
    w.not_parquet = r / "not.parquet"
    w.not_parquet.write_text("prompt_id,round\n")
    # damaged run directories
    runs = {}
    for name in ("no_manifest", "bad_manifest", "list_manifest", "no_temperature", "no_shards", "truncated",
                 "corrupted", "missing_column", "text_shard"):
        runs[name] = r / f"run_{name}"
        shutil.copytree(w.run, runs[name], ignore=shutil.ignore_patterns("features.parquet"))
    (runs["no_manifest"] / "manifest.json").unlink()
    (runs["bad_manifest"] / "manifest.json").write_text('{"temperature": 1.0,\n "pool": }')
    (runs["list_manifest"] / "manifest.json").write_text("[1, 2]")
    manifest = json.loads((w.run / "manifest.json").read_text())
    manifest.pop("temperature")
    (runs["no_temperature"] / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(runs["no_shards"] / "rounds")
    shard = runs["truncated"] / "rounds" / "shard-00001.parquet"
    shard.write_bytes(shard.read_bytes()[:-300])
    shard = runs["corrupted"] / "rounds" / "shard-00001.parquet"
    write_parquet_atomic(read_table(shard), shard)  # with page checksums
    data = shard.read_bytes()
    for pos in range(len(data) // 5, len(data), 53):  # a flipped byte that a page checksum catches
        flipped = bytearray(data)
        flipped[pos] ^= 0xFF
        shard.write_bytes(flipped)
        try:
            read_table(shard)
        except DataFileError:
            break
    else:
        pytest.fail("no corruption caught by page checksums")
    for i in (0, 1):
        shard = runs["missing_column"] / "rounds" / f"shard-{i:05d}.parquet"
        write_parquet_atomic(read_table(shard).drop(["q_edge"]), shard)
    (runs["text_shard"] / "rounds" / "shard-00001.parquet").write_text("not parquet")
    w.runs = runs
    w.other_run = r / "other_run"  # an --out that holds a different run
    w.other_run.mkdir()
    (w.other_run / "manifest.json").write_text(json.dumps({"target": "another-model"}))
    w.bad_manifest_out = r / "bad_manifest_out"
    w.bad_manifest_out.mkdir()
    (w.bad_manifest_out / "manifest.json").write_text("{")
    # rerankers that are not to be loaded
    w.pickle = r / "old.pkl"
    w.pickle.write_bytes(b"\x80\x04K\x01.")  # a pickle of the int 1
    w.models_pickle = r / "models_pickle"
    w.models_pickle.mkdir()
    shutil.copy(w.pickle, w.models_pickle / "rows-fold0.pkl")
    w.models_damaged = r / "models_damaged"
    shutil.copytree(w.models, w.models_damaged)
    (w.models_damaged / "isotonic-fold0" / "arrays.npz").write_bytes(b"PK\x03\x04 damaged")
    w.models_empty = r / "models_empty"
    w.models_empty.mkdir()
    edited_models(w, read_table(w.features).to_pandas())
    w.eval_bad_meta = r / "eval_bad_meta"
    shutil.copytree(w.evald, w.eval_bad_meta)
    (w.eval_bad_meta / "meta.json").write_text('{"law": "greedy",\n')
    w.eval_truncated = r / "eval_truncated"
    shutil.copytree(w.evald, w.eval_truncated)
    table = w.eval_truncated / "summary.parquet"
    table.write_bytes(table.read_bytes()[:40])
    # tracking stores
    w.db = migrated_db(tmp_path_factory, r / "store" / "mlflow.db")
    w.ro_db = migrated_db(tmp_path_factory, r / "ro_store" / "mlflow.db")
    w.fake_db = r / "fake.db"
    w.fake_db.write_text("not sqlite")
    # read-only locations, made last (nothing more is written into them)
    w.file = r / "a_file"
    w.file.write_text("x")
    w.ro = r / "ro"
    w.ro.mkdir()
    read_only = [w.ro, w.ro_db]
    for path in read_only:
        make_read_only(path)
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    w.forbidden = f"http://127.0.0.1:{server.server_address[1]}"
    web = ThreadingHTTPServer(("127.0.0.1", free_port()), NotMLflow)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    w.not_mlflow = f"http://127.0.0.1:{web.server_address[1]}"
    ro_server = ThreadingHTTPServer(("127.0.0.1", free_port()), ReadOnlyMLflow)
    threading.Thread(target=ro_server.serve_forever, daemon=True).start()
    w.read_only_mlflow = f"http://127.0.0.1:{ro_server.server_address[1]}"
    yield w
    ro_server.shutdown()
    web.shutdown()
    server.shutdown()
    for path in read_only:
        make_writable(path)


def another_run(w) -> None:
    """A second recorded run of the same shape (prompt ids, round counts) and its features, edges, predictions
    and models: each fits the first run's keys, and only the rounds digest tells them apart."""
    from specrank.featurize.storage import rounds_digest
    from specrank.featurize.synthetic import write_synthetic_run

    b = w.root / "run_b"
    write_synthetic_run(b, n_prompts=6, rounds_per_prompt=5, topk=3, depth=3, seed=8)
    assert main(["featurize", str(b), "--edges-out", str(b / "edges.parquet")]) == 0
    assert main(["train", str(b / "features.parquet"), "--rerankers", "isotonic", "--out-dir", str(b / "trained")]) == 0
    w.b = SimpleNamespace(run=b, edges=b / "edges.parquet", preds=b / "trained" / "predictions.parquet",
                          models=b / "trained" / "models")
    w.digest, w.b.digest = rounds_digest(w.run), rounds_digest(b)
    assert w.digest != w.b.digest


def pickled_weights(w) -> None:
    """Targets, a standalone drafter and an EAGLE-3 head whose only weights are a ``.bin`` pickle that is not
    a plain state dict (``w.bins[...]``)."""
    import argparse

    import torch
    from transformers import AutoConfig

    from eagle3_fixtures import write_eagle_head

    foreign = {"model": argparse.Namespace(layers=2)}  # a global the weights-only unpickler refuses
    w.bins = {}
    for name, content in (("tgt_pickled", foreign), ("tgt_not_tensors", {"step": 3}), ("drf_pickled", foreign)):
        w.bins[name] = w.root / name
        shutil.copytree(w.drf if name.startswith("drf") else w.tgt, w.bins[name])
        (w.bins[name] / "model.safetensors").unlink()
        torch.save(content, w.bins[name] / "pytorch_model.bin")
    w.bins["eagle3_pickled"] = w.root / "eagle3_pickled"
    write_eagle_head(w.bins["eagle3_pickled"], AutoConfig.from_pretrained(w.tgt))
    torch.save(foreign, w.bins["eagle3_pickled"] / "pytorch_model.bin")
    # plain pickles (pickle.dump, not torch.save's archive): torch warns about their protocol on stderr
    w.bins["tgt_plain_pickle"] = w.root / "tgt_plain_pickle"
    shutil.copytree(w.bins["tgt_pickled"], w.bins["tgt_plain_pickle"])
    w.bins["eagle3_plain_pickle"] = w.root / "eagle3_plain_pickle"
    shutil.copytree(w.bins["eagle3_pickled"], w.bins["eagle3_plain_pickle"])
    for name in ("tgt_plain_pickle", "eagle3_plain_pickle"):
        (w.bins[name] / "pytorch_model.bin").write_bytes(pickle.dumps(foreign, protocol=4))
    w.bins["tgt_not_pickle"] = w.root / "tgt_not_pickle"
    shutil.copytree(w.bins["tgt_pickled"], w.bins["tgt_not_pickle"])
    (w.bins["tgt_not_pickle"] / "pytorch_model.bin").write_text("hello, not a pickle")


def _edit_meta(path: Path, edit) -> None:
    meta = json.loads((path / "reranker.json").read_text())
    edit(meta)
    (path / "reranker.json").write_text(json.dumps(meta))


def edited_models(w, feats) -> None:
    """Saved rerankers edited by hand (``w.rr[...]``) and models/ directories holding one (``w.mm[...]``)."""
    from specrank.featurize.features import META_KEY
    from specrank.rerankers import GBMReranker

    feats.attrs[META_KEY] = {"label_kind": "probability", "topk": 3, "temperature": 1.0, "version": "0.1.0"}
    gbm = GBMReranker(features="rows", n_estimators=3, num_leaves=3, n_jobs=1).fit(feats)
    other = GBMReranker(features="rows", n_estimators=4, num_leaves=3, n_jobs=1).fit(feats)
    edits = {
        "param_unknown": ("iso", lambda m: m["params"].update(depth=3)),
        "state_empty": ("gbm", lambda m: m.update(state={})),
        "backend_switched": ("gbm", lambda m: m["params"].update(backend="sklearn")),
        "files_empty": ("iso", lambda m: m.update(files={})),
        "booster_unlisted": ("gbm", lambda m: m["files"].pop("lightgbm.txt")),
    }
    w.rr, w.mm = {}, {}
    for name, (source, edit) in edits.items():
        w.mm[name] = w.root / f"models_{name}"
        shutil.copytree(w.models, w.mm[name])
        path = w.mm[name] / "isotonic-fold0"
        if source == "gbm":
            shutil.rmtree(path)
            gbm.save(path)
        _edit_meta(path, edit)
        w.rr[name] = path
    (w.rr["booster_unlisted"] / "lightgbm.txt").write_text(other.model_.model_to_string())
    w.mm["unlisted_file"] = w.root / "models_unlisted_file"
    shutil.copytree(w.models, w.mm["unlisted_file"])
    w.rr["unlisted_file"] = w.mm["unlisted_file"] / "isotonic-fold0"
    (w.rr["unlisted_file"] / "notes.txt").write_text("not listed")


def snapshot(root: Path) -> dict:
    """Every directory under ``root``, and every file with its size and modification time (a directory's own
    time moves when the writability probe comes and goes, so it is left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (True, 0, 0) if p.is_dir() else (False, st.st_size, st.st_mtime_ns)
    return out


def decode(w, out, *extra):
    return ["decode", "--target", str(w.tgt), "--drafter", f"standalone:{w.drf}", "--prompts", str(w.prompts),
            "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "4", "--extra", "2", "--max-new-tokens", "4",
            "--threads", "1", "--no-progress", "--out", str(out), *extra]


def online(w, out, *extra):
    return ["online", "--target", str(w.tgt), "--drafter", f"standalone:{w.drf}", "--prompts", str(w.prompts),
            "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "4", "--max-new-tokens", "4",
            "--temperature", "1", "--threads", "1", "--bootstrap", "20", "--out", str(out), *extra]


def tree_config(w, out, *extra):
    return ["tree-config", "--target", str(w.tgt), "--drafter", f"standalone:{w.drf}", "--prompts", str(w.prompts),
            "--topk", "1,2", "--num-steps", "2", "--num-draft-tokens", "4", "--max-new-tokens", "4",
            "--threads", "1", "--bootstrap", "20", "--repeats", "1", "--out", str(out), *extra]


def sweep(w, out, *extra):
    return ["verify-sweep", "--target", str(w.tgt), "--drafter", f"standalone:{w.drf}", "--prompts", str(w.prompts),
            "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "4", "--max-new-tokens", "4",
            "--grid", "lenience:l=0.5", "--no-progress", "--out", str(out), *extra]


def train(w, out, *extra):
    return ["train", str(w.features), "--rerankers", "isotonic,base", "--n-estimators", "5", "--num-leaves", "3",
            "--n-jobs", "1", "--out-dir", str(out), *extra]


def evaluate(w, out, *extra, predictions=None):
    return ["evaluate", str(w.run), "--predictions", str(predictions or w.preds), "--out", str(out),
            "--bootstrap", "20", "--no-tracking", *extra]


def evaluate_tracked(w, out, *extra):
    return [a for a in evaluate(w, out, *extra) if a != "--no-tracking"]


def fit_head(w, out, *extra):
    return ["drafter", "fit-exit-head", "--target", str(w.tgt), "--layers", "2", "--text", str(w.text),
            "--out", str(out), *extra]


def drafter_train(w, out, *extra):
    return ["drafter", "train", "--target", str(w.tgt), "--prompts", str(w.prompts), "--out", str(out),
            "--steps", "2", "--tracking-uri", str(w.db), "--no-progress", *extra]


def demo(w, out, *extra):
    return ["demo", "--out", str(out), "--tracking-uri", str(w.db), *extra]


def study(w, out, *extra):
    return ["study", "--out", str(out), "--target", str(w.tgt), "--drafter", f"standalone:{w.drf}", "--prompts",
            str(w.prompts), "--tracking-uri", str(w.db), *extra]


def with_arg(argv, flag, value):
    """``argv`` with ``flag``'s value replaced."""
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


def replaced(argv, old, new):
    """``argv`` with the argument ``old`` (a positional one) replaced by ``new``."""
    return [new if a == old else a for a in argv]


NOT_MLFLOW = "not an MLflow tracking server"

# (id, argv(world, out), text the one error line must contain)
CASES = [
    # decode: decoding parameters
    ("decode-temperature-nan", lambda w, o: decode(w, o, "--temperature", "nan"), "temperature"),
    ("decode-target-plain-pickle",
     lambda w, o: with_arg(decode(w, o), "--target", str(w.bins["tgt_plain_pickle"])),
     "tgt_plain_pickle/pytorch_model.bin"),
    ("decode-eagle3-plain-pickle",
     lambda w, o: with_arg(decode(w, o), "--drafter", f"eagle3:{w.bins['eagle3_plain_pickle']}"),
     "eagle3_plain_pickle/pytorch_model.bin"),
    ("tree-config-eagle3-plain-pickle",
     lambda w, o: with_arg(tree_config(w, o, "--no-tracking"), "--drafter", f"eagle3:{w.bins['eagle3_plain_pickle']}"),
     "eagle3_plain_pickle/pytorch_model.bin"),
    ("decode-temperature-inf", lambda w, o: decode(w, o, "--temperature", "inf"), "temperature"),
    ("decode-temperature-1e9", lambda w, o: decode(w, o, "--temperature", "1e9"), "temperature"),
    ("decode-temperature-negative", lambda w, o: decode(w, o, "--temperature", "-1"), "temperature"),
    ("decode-temperature-text", lambda w, o: decode(w, o, "--temperature", "warm"), "--temperature"),
    ("decode-budget-0", lambda w, o: decode(w, o, "--budget", "0"), "budget"),
    ("decode-budget-over-pool", lambda w, o: decode(w, o, "--budget", "100000"), "budget"),
    ("decode-extra-negative", lambda w, o: decode(w, o, "--extra", "-1"), "extra"),
    ("decode-topk-0", lambda w, o: decode(w, o, "--topk", "0"), "topk"),
    ("decode-depth-0", lambda w, o: decode(w, o, "--depth", "0"), "depth"),
    ("decode-expand-0", lambda w, o: decode(w, o, "--expand", "0"), "expand"),
    ("decode-max-new-tokens-0", lambda w, o: decode(w, o, "--max-new-tokens", "0"), "max_new_tokens"),
    ("decode-limit-0", lambda w, o: decode(w, o, "--limit", "0"), "--limit"),
    ("decode-limit-negative", lambda w, o: decode(w, o, "--limit", "-3"), "--limit"),
    ("decode-shard-size-0", lambda w, o: decode(w, o, "--shard-size", "0"), "--shard-size"),
    ("decode-threads-0", lambda w, o: decode(w, o, "--threads", "0"), "--threads"),
    ("decode-device", lambda w, o: decode(w, o, "--device", "tpu"), "device"),
    ("decode-dtype", lambda w, o: decode(w, o, "--dtype", "float64"), "--dtype"),
    ("decode-verification-rule-unknown", lambda w, o: decode(w, o, "--verification-rule", "bogus"), "verification rule"),
    ("decode-verifier-value", lambda w, o: decode(w, o, "--verification-rule", "lenience:l=abc"), "lenience:l=abc"),
    ("decode-chain-length-0", lambda w, o: decode(w, o, "--speculation", "chain", "--chain-length", "0"), "chain length"),
    ("decode-decoder-unknown", lambda w, o: decode(w, o, "--speculation", "beam"), "--speculation"),
    ("decode-unknown-flag", lambda w, o: decode(w, o, "--bogus"), "--bogus"),
    ("decode-missing-drafter", lambda w, o: [a for a in decode(w, o) if not a.startswith(("--drafter", "standalone"))],
     "--drafter"),
    # decode: models
    ("decode-drafter-spec", lambda w, o: with_arg(decode(w, o), "--drafter", "medusa:3"), "drafter spec"),
    ("decode-drafter-layers-text", lambda w, o: with_arg(decode(w, o), "--drafter", "early-exit:x"), "early-exit:x"),
    ("decode-drafter-missing-dir", lambda w, o: with_arg(decode(w, o), "--drafter", f"standalone:{w.root}/nope"),
     "standalone drafter"),
    ("decode-drafter-eagle3-missing", lambda w, o: with_arg(decode(w, o), "--drafter", f"eagle3:{w.root}/nope"),
     "EAGLE-3"),
    ("decode-exit-head-missing", lambda w, o: with_arg(decode(w, o), "--drafter", f"early-exit:2:{w.root}/nope"),
     "exit head"),
    ("decode-exit-head-not-safetensors",
     lambda w, o: with_arg(decode(w, o), "--drafter", f"early-exit:2:{w.head_not_safetensors}"), "exit head"),
    ("decode-drafter-layers-over-target", lambda w, o: with_arg(decode(w, o), "--drafter", "early-exit:99"),
     "early-exit layers"),
    ("decode-target-missing", lambda w, o: with_arg(decode(w, o), "--target", f"{w.root}/nope"), "target"),
    ("decode-target-corrupt-config", lambda w, o: with_arg(decode(w, o), "--target", str(w.tgt_bad_config)),
     "config.json"),
    ("decode-target-no-config", lambda w, o: with_arg(decode(w, o), "--target", str(w.tgt_no_config)),
     "config.json"),
    ("decode-target-truncated-gguf", lambda w, o: with_arg(decode(w, o), "--target", str(w.gguf_truncated)),
     "truncated.gguf"),
    ("decode-target-fake-gguf", lambda w, o: with_arg(decode(w, o), "--target", str(w.gguf_fake)), "GGUF"),
    ("decode-target-pickled-bin", lambda w, o: with_arg(decode(w, o), "--target", str(w.bins["tgt_pickled"])),
     "tgt_pickled/pytorch_model.bin"),
    ("decode-target-bin-not-tensors",
     lambda w, o: with_arg(decode(w, o), "--target", str(w.bins["tgt_not_tensors"])),
     "tgt_not_tensors/pytorch_model.bin"),
    ("decode-drafter-pickled-bin",
     lambda w, o: with_arg(decode(w, o), "--drafter", f"standalone:{w.bins['drf_pickled']}"),
     "drf_pickled/pytorch_model.bin"),
    ("decode-eagle3-pickled-bin",
     lambda w, o: with_arg(decode(w, o), "--drafter", f"eagle3:{w.bins['eagle3_pickled']}"),
     "eagle3_pickled/pytorch_model.bin"),
    ("decode-target-not-pickle",
     lambda w, o: with_arg(decode(w, o), "--target", str(w.bins["tgt_not_pickle"])),
     ("tgt_not_pickle/pytorch_model.bin", "not a pickle")),
    ("decode-target-plain-file", lambda w, o: with_arg(decode(w, o), "--target", str(w.text)), "target"),
    ("decode-tracking-not-mlflow", lambda w, o: decode(w, o, "--tracking-uri", w.not_mlflow), NOT_MLFLOW),
    ("decode-experiment-empty", lambda w, o: decode(w, o, "--tracking-uri", str(w.db), "--experiment", ""),
     "--experiment"),
    # decode: prompts
    ("decode-prompts-missing", lambda w, o: with_arg(decode(w, o), "--prompts", f"{w.root}/nope.jsonl"),
     "prompt file"),
    ("decode-prompts-malformed", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_malformed)),
     "malformed.jsonl line 2"),
    ("decode-prompts-empty-file", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_empty_file)),
     "no prompts"),
    ("decode-prompt-empty", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_empty)),
     "empty_prompt.jsonl line 2"),
    ("decode-prompt-blank", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_blank)), "is empty"),
    ("decode-prompts-duplicate", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_dup)), "duplicate"),
    ("decode-prompts-humaneval", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_humaneval)), "task_id"),
    ("decode-prompts-neither", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_neither)), "line 1"),
    ("decode-prompts-latin1", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_latin1)), "UTF-8"),
    ("decode-prompt-too-long", lambda w, o: with_arg(decode(w, o), "--prompts", str(w.p_long)), "max_new_tokens"),
    # decode: output
    ("decode-out-file", lambda w, o: decode(w, w.file), "--out"),
    ("decode-out-under-file", lambda w, o: decode(w, w.file / "run"), "--out"),
    ("decode-out-read-only", lambda w, o: decode(w, w.ro / "run"), "--out"),
    ("decode-out-other-run", lambda w, o: decode(w, w.other_run), "different run"),
    ("decode-out-bad-manifest", lambda w, o: decode(w, w.bad_manifest_out), "manifest"),
    # featurize
    ("featurize-run-missing", lambda w, o: ["featurize", str(w.root / "nope")], "run directory"),
    ("featurize-run-is-file", lambda w, o: ["featurize", str(w.file)], "run directory"),
    ("featurize-no-manifest", lambda w, o: ["featurize", str(w.runs["no_manifest"])], "manifest.json"),
    ("featurize-malformed-manifest", lambda w, o: ["featurize", str(w.runs["bad_manifest"])], "line 2"),
    ("featurize-manifest-not-object", lambda w, o: ["featurize", str(w.runs["list_manifest"])], "manifest"),
    ("featurize-manifest-no-temperature", lambda w, o: ["featurize", str(w.runs["no_temperature"])], "temperature"),
    ("featurize-no-shards", lambda w, o: ["featurize", str(w.runs["no_shards"])], "rounds"),
    ("featurize-truncated-shard", lambda w, o: ["featurize", str(w.runs["truncated"])], "shard-00001.parquet"),
    ("featurize-corrupted-shard", lambda w, o: ["featurize", str(w.runs["corrupted"])], "shard-00001.parquet"),
    ("featurize-text-shard", lambda w, o: ["featurize", str(w.runs["text_shard"])], "shard-00001.parquet"),
    ("featurize-missing-column", lambda w, o: ["featurize", str(w.runs["missing_column"])], "q_edge"),
    ("featurize-out-is-dir", lambda w, o: ["featurize", str(w.run), "--out", str(w.ro)], "--out"),
    ("featurize-out-read-only", lambda w, o: ["featurize", str(w.run), "--out", str(w.ro / "f.parquet")], "--out"),
    ("featurize-edges-out-read-only",
     lambda w, o: ["featurize", str(w.run), "--out", str(o / "f.parquet"), "--edges-out", str(w.ro / "e.parquet")],
     "--edges-out"),
    ("featurize-edges-out-is-out",
     lambda w, o: ["featurize", str(w.run), "--out", str(o / "f.parquet"), "--edges-out", str(o / "f.parquet")],
     "--edges-out"),
    ("featurize-out-is-a-shard",
     lambda w, o: ["featurize", str(w.run), "--out", str(w.run / "rounds" / "shard-00000.parquet")], "run file"),
    ("featurize-tracking-not-mlflow",
     lambda w, o: ["featurize", str(w.run), "--out", str(o / "f.parquet"), "--tracking-uri", w.not_mlflow], NOT_MLFLOW),
    ("featurize-tracking-read-only",
     lambda w, o: ["featurize", str(w.run), "--out", str(o / "f.parquet"), "--edges-out", str(o / "e.parquet"),
                   "--tracking-uri", w.read_only_mlflow], "MLflow"),
    ("featurize-tracking-read-only-over-features",  # the features file it would replace is put back
     lambda w, o: ["featurize", str(w.run), "--tracking-uri", w.read_only_mlflow], "MLflow"),
    ("featurize-experiment-empty",
     lambda w, o: ["featurize", str(w.run), "--out", str(o / "f.parquet"), "--tracking-uri", str(w.db),
                   "--experiment", " "], "--experiment"),
    # train
    ("train-features-missing", lambda w, o: replaced(train(w, o), str(w.features), str(w.root / "nope.parquet")),
     "features"),
    ("train-features-not-parquet", lambda w, o: replaced(train(w, o), str(w.features), str(w.not_parquet)),
     "not.parquet"),
    ("train-features-not-specrank", lambda w, o: replaced(train(w, o), str(w.features), str(w.features_no_q)),
     "features_no_q.parquet"),
    ("train-features-without-q", lambda w, o: replaced(train(w, o), str(w.features), str(w.features_meta_no_q)),
     "missing columns q"),
    ("train-features-text-in-a-numeric-column",
     lambda w, o: replaced(train(w, o), str(w.features), str(w.features_text_column)), ("log_q", "'n/a'")),
    ("train-sklearn-feature-all-nan",
     lambda w, o: with_arg(replaced(train(w, o, "--backend", "sklearn"), str(w.features), str(w.features_nan_rows)),
                           "--rerankers", "rows"), "cache_logp"),
    ("train-rerankers-unknown", lambda w, o: with_arg(train(w, o), "--rerankers", "isotonic,forest"), "forest"),
    ("train-rerankers-empty", lambda w, o: with_arg(train(w, o), "--rerankers", ","), "reranker"),
    ("train-learning-rate-0", lambda w, o: train(w, o, "--learning-rate", "0"), "learning_rate"),
    ("train-learning-rate-negative", lambda w, o: train(w, o, "--learning-rate", "-1"), "learning_rate"),
    ("train-learning-rate-nan", lambda w, o: train(w, o, "--learning-rate", "nan"), "learning_rate"),
    ("train-num-leaves-1", lambda w, o: with_arg(train(w, o), "--num-leaves", "1"), "num_leaves"),
    ("train-n-estimators-0", lambda w, o: with_arg(train(w, o), "--n-estimators", "0"), "n_estimators"),
    ("train-n-jobs-0", lambda w, o: with_arg(train(w, o), "--n-jobs", "0"), "n_jobs"),
    ("train-tune-trials-negative", lambda w, o: train(w, o, "--tune-trials", "-1"), "--tune-trials"),
    ("train-backend-unknown", lambda w, o: train(w, o, "--backend", "xgboost"), "--backend"),
    ("train-boost-from-draft-sklearn", lambda w, o: train(w, o, "--backend", "sklearn", "--boost-from-draft"),
     "boost_from_draft"),
    ("train-per-depth-without-edges", lambda w, o: with_arg(train(w, o), "--rerankers", "isotonic,per_depth"),
     "--edges"),
    ("train-per-depth-edges-are-features",
     lambda w, o: with_arg(train(w, o, "--edges", str(w.features)), "--rerankers", "isotonic,per_depth"), "edges"),
    ("train-edges-from-another-run",
     lambda w, o: with_arg(train(w, o, "--edges", str(w.b.edges)), "--rerankers", "isotonic,per_depth"),
     lambda w: (w.digest, w.b.digest, "--edges")),
    ("train-out-dir-holds-the-features",
     lambda w, o: replaced(train(w, w.features_named_predictions.parent), str(w.features),
                           str(w.features_named_predictions)), "features"),
    ("train-out-dir-file", lambda w, o: train(w, w.file), "--out-dir"),
    ("train-out-dir-read-only", lambda w, o: train(w, w.ro / "out"), "--out-dir"),
    ("train-tracking-garbage-scheme", lambda w, o: train(w, o, "--tracking-uri", "foo://bar"), "tracking URI"),
    ("train-tracking-read-only-sqlite", lambda w, o: train(w, o, "--tracking-uri", f"sqlite:///{w.ro_db}"),
     "tracking URI"),
    ("train-tracking-read-only-dir", lambda w, o: train(w, o, "--tracking-uri", str(w.ro / "store")),
     "tracking URI"),
    ("train-tracking-missing-dir", lambda w, o: train(w, o, "--tracking-uri", f"sqlite:///{w.root}/no/x.db"),
     "tracking URI"),
    ("train-tracking-not-sqlite", lambda w, o: train(w, o, "--tracking-uri", str(w.fake_db)), "SQLite"),
    ("train-tracking-unreachable", lambda w, o: train(w, o, "--tracking-uri", f"http://127.0.0.1:{free_port()}"),
     "unreachable"),
    ("train-tracking-database-without-driver",
     lambda w, o: train(w, o, "--tracking-uri", f"{missing_driver()}://u:p@127.0.0.1:1/db"), "pip install"),
    ("train-tracking-not-mlflow", lambda w, o: train(w, o, "--tracking-uri", w.not_mlflow), NOT_MLFLOW),
    ("train-tracking-read-only", lambda w, o: train(w, o, "--tracking-uri", w.read_only_mlflow), "MLflow"),
    ("train-experiment-empty", lambda w, o: train(w, o, "--tracking-uri", str(w.db), "--experiment", ""),
     "--experiment"),
    # evaluate
    ("evaluate-run-missing", lambda w, o: replaced(evaluate(w, o), str(w.run), str(w.root / "nope")),
     "run directory"),
    ("evaluate-predictions-missing", lambda w, o: evaluate(w, o, predictions=w.root / "nope.parquet"),
     "predictions"),
    ("evaluate-predictions-not-parquet", lambda w, o: evaluate(w, o, predictions=w.not_parquet), "not.parquet"),
    ("evaluate-predictions-no-keys", lambda w, o: evaluate(w, o, predictions=w.preds_no_keys), "missing columns"),
    ("evaluate-predictions-nan", lambda w, o: evaluate(w, o, predictions=w.preds_nan), "NaN"),
    ("evaluate-predictions-other-run", lambda w, o: evaluate(w, o, predictions=w.preds_other_run), "predictions"),
    ("evaluate-predictions-from-another-run", lambda w, o: evaluate(w, o, predictions=w.b.preds),
     lambda w: (w.digest, w.b.digest, "--predictions")),
    ("evaluate-models-from-another-run", lambda w, o: evaluate(w, o, "--models", str(w.b.models)),
     lambda w: (w.digest, w.b.digest, "--models")),
    ("evaluate-budgets-0", lambda w, o: evaluate(w, o, "--budgets", "0"), "--budgets"),
    ("evaluate-bootstrap-0", lambda w, o: with_arg(evaluate(w, o), "--bootstrap", "0"), "--bootstrap"),
    ("evaluate-out-is-the-run", lambda w, o: evaluate(w, w.run), "run directory"),
    ("evaluate-out-file", lambda w, o: evaluate(w, w.file), "--out"),
    ("evaluate-out-read-only", lambda w, o: evaluate(w, w.ro / "eval"), "--out"),
    ("evaluate-models-missing", lambda w, o: evaluate(w, o, "--models", str(w.root / "nope")), "--models"),
    ("evaluate-models-empty", lambda w, o: evaluate(w, o, "--models", str(w.models_empty)), "--models"),
    ("evaluate-models-pickle", lambda w, o: evaluate(w, o, "--models", str(w.models_pickle)),
     "not a specrank reranker"),
    ("evaluate-models-damaged", lambda w, o: evaluate(w, o, "--models", str(w.models_damaged)), "damaged"),
    ("evaluate-models-param-unknown", lambda w, o: evaluate(w, o, "--models", str(w.mm["param_unknown"])),
     "params.depth"),
    ("evaluate-models-state-empty", lambda w, o: evaluate(w, o, "--models", str(w.mm["state_empty"])),
     "state.task_categories"),
    ("evaluate-models-backend-switched", lambda w, o: evaluate(w, o, "--models", str(w.mm["backend_switched"])),
     "params.backend"),
    ("evaluate-models-files-empty", lambda w, o: evaluate(w, o, "--models", str(w.mm["files_empty"])), "files"),
    ("evaluate-models-booster-unlisted",
     lambda w, o: evaluate(w, o, "--models", str(w.mm["booster_unlisted"])), "lightgbm.txt"),
    ("evaluate-models-unlisted-file", lambda w, o: evaluate(w, o, "--models", str(w.mm["unlisted_file"])),
     "notes.txt"),
    ("evaluate-tracking-garbage-scheme", lambda w, o: evaluate_tracked(w, o, "--tracking-uri", "foo:bar"),
     "tracking URI"),
    ("evaluate-tracking-read-only-sqlite", lambda w, o: evaluate_tracked(w, o, "--tracking-uri", str(w.ro_db)),
     "tracking URI"),
    ("evaluate-tracking-store-refuses", lambda w, o: evaluate_tracked(w, o, "--tracking-uri", w.forbidden), "MLflow"),
    ("evaluate-tracking-not-mlflow", lambda w, o: evaluate_tracked(w, o, "--tracking-uri", w.not_mlflow), NOT_MLFLOW),
    ("evaluate-tracking-read-only", lambda w, o: evaluate_tracked(w, o, "--tracking-uri", w.read_only_mlflow),
     "MLflow"),
    ("evaluate-experiment-empty", lambda w, o: evaluate_tracked(w, o, "--tracking-uri", str(w.db), "--experiment", ""),
     "--experiment"),
    # report
    ("report-eval-missing", lambda w, o: ["report", str(w.root / "nope"), "--out", str(o)], "evaluation directory"),
    ("report-eval-is-run", lambda w, o: ["report", str(w.run), "--out", str(o)], "evaluation directory"),
    ("report-eval-bad-meta", lambda w, o: ["report", str(w.eval_bad_meta), "--out", str(o)], "meta.json"),
    ("report-eval-truncated-table", lambda w, o: ["report", str(w.eval_truncated), "--out", str(o)],
     "summary.parquet"),
    ("report-out-file", lambda w, o: ["report", str(w.evald), "--out", str(w.file)], "--out"),
    ("report-out-read-only", lambda w, o: ["report", str(w.evald), "--out", str(w.ro / "r")], "--out"),
    # online
    ("online-limit-0", lambda w, o: online(w, o, "--limit", "0", "--no-tracking"), "--limit"),
    ("online-limit-negative", lambda w, o: online(w, o, "--limit", "-3", "--no-tracking"), "--limit"),
    ("online-warmup-negative", lambda w, o: online(w, o, "--warmup", "-1", "--no-tracking"), "--warmup"),
    ("online-bootstrap-0", lambda w, o: with_arg(online(w, o, "--no-tracking"), "--bootstrap", "0"), "--bootstrap"),
    ("online-strategies-unknown", lambda w, o: online(w, o, "--strategies", "draft,best", "--no-tracking"), "--strategies"),
    ("online-strategies-empty", lambda w, o: online(w, o, "--strategies", ",", "--no-tracking"), "--strategies"),
    ("online-strategies-repeated", lambda w, o: online(w, o, "--strategies", "draft,draft", "--no-tracking"), "--strategies"),
    ("online-compare-unknown", lambda w, o: online(w, o, "--compare", "covering", "--no-tracking"), "--compare"),
    ("online-compare-reranked-alone", lambda w, o: online(w, o, "--compare", "reranked", "--reranker",
                                                          str(w.models / "isotonic-fold0"), "--no-tracking"),
     "--compare"),
    ("online-reranked-without-reranker", lambda w, o: online(w, o, "--strategies", "reranked", "--no-tracking"),
     "--reranker"),
    ("online-reranker-missing", lambda w, o: online(w, o, "--strategies", "reranked", "--reranker",
                                                    str(w.root / "nope"), "--no-tracking"), "no reranker"),
    ("online-reranker-pickle", lambda w, o: online(w, o, "--strategies", "reranked", "--reranker", str(w.pickle),
                                                   "--no-tracking"), "not a specrank reranker"),
    *[(f"online-reranker-{name.replace('_', '-')}",
       lambda w, o, name=name: online(w, o, "--strategies", "reranked", "--reranker", str(w.rr[name]), "--no-tracking"),
       field) for name, field in [("param_unknown", "params.depth"), ("state_empty", "state.task_categories"),
                                  ("backend_switched", "params.backend"), ("booster_unlisted", "lightgbm.txt"),
                                  ("unlisted_file", "notes.txt")]],
    ("online-reranker-scheme-without-its-library",
     lambda w, o: online(w, o, "--strategies", "reranked", "--reranker", f"{missing_scheme()}://bucket/rows",
                         "--no-tracking"), "pip install"),
    ("online-reranker-http-url", lambda w, o: online(w, o, "--strategies", "reranked", "--reranker",
                                                     f"{w.not_mlflow}/rows.zip", "--no-tracking"), "http(s) URL"),
    ("online-reranker-unknown-scheme", lambda w, o: online(w, o, "--strategies", "reranked", "--reranker",
                                                           "ftp://host/rows.zip", "--no-tracking"), "ftp"),
    ("online-tracking-not-mlflow", lambda w, o: online(w, o, "--tracking-uri", w.not_mlflow), NOT_MLFLOW),
    ("online-experiment-empty", lambda w, o: online(w, o, "--tracking-uri", str(w.db), "--experiment", ""),
     "--experiment"),
    ("online-reranker-models-uri-nothing",
     lambda w, o: online(w, o, "--strategies", "reranked", "--reranker", "models:/rows/3", "--tracking-uri", str(w.db),
                         "--no-tracking"), "models:/rows/3"),
    ("online-reranker-runs-uri-nothing",
     lambda w, o: online(w, o, "--strategies", "reranked", "--reranker", "runs:/0123456789abcdef/rows", "--tracking-uri",
                         str(w.db), "--no-tracking"), "runs:/0123456789abcdef/rows"),
    ("online-reranker-uri-store-missing",
     lambda w, o: online(w, o, "--strategies", "reranked", "--reranker", "models:/rows/1", "--tracking-uri",
                         f"sqlite:///{w.root}/absent.db", "--no-tracking"), "no MLflow database"),
    ("online-reranker-uri-default-store",
     lambda w, o: online(w, o, "--strategies", "reranked", "--reranker", "models:/rows/1", "--no-tracking"),
     "no MLflow database"),
    ("online-reranker-greedy-mismatch",
     lambda w, o: with_arg(online(w, o, "--strategies", "reranked", "--reranker", str(w.models / "isotonic-fold0"),
                                  "--no-tracking"), "--temperature", "0"), "labels"),
    ("online-reranker-topk-mismatch",
     lambda w, o: with_arg(online(w, o, "--strategies", "reranked", "--reranker", str(w.models / "isotonic-fold0"),
                                  "--no-tracking"), "--topk", "4"), "topk"),
    ("online-temperature-nan", lambda w, o: with_arg(online(w, o, "--no-tracking"), "--temperature", "nan"),
     "temperature"),
    ("online-out-file", lambda w, o: online(w, w.file, "--no-tracking"), "--out"),
    ("online-out-read-only", lambda w, o: online(w, w.ro / "o", "--no-tracking"), "--out"),
    ("online-tracking-garbage-scheme", lambda w, o: online(w, o, "--tracking-uri", "foo://bar"), "tracking URI"),
    ("online-drafter-spec", lambda w, o: with_arg(online(w, o, "--no-tracking"), "--drafter", "early-exit"),
     "drafter spec"),
    # drafter fit-exit-head
    ("fit-exit-head-text-missing", lambda w, o: with_arg(fit_head(w, o / "h.safetensors"), "--text",
                                                         str(w.root / "nope.txt")), "--text"),
    ("fit-exit-head-layers-0", lambda w, o: with_arg(fit_head(w, o / "h.safetensors"), "--layers", "0"), "--layers"),
    ("fit-exit-head-layers-over-target", lambda w, o: with_arg(fit_head(w, o / "h.safetensors"), "--layers", "9"),
     "--layers"),
    ("fit-exit-head-window-1", lambda w, o: fit_head(w, o / "h.safetensors", "--window", "1"), "--window"),
    ("fit-exit-head-holdout", lambda w, o: fit_head(w, o / "h.safetensors", "--holdout", "1.5"), "--holdout"),
    ("fit-exit-head-ridge-negative", lambda w, o: fit_head(w, o / "h.safetensors", "--ridge", "-1"), "--ridge"),
    ("fit-exit-head-out-read-only", lambda w, o: fit_head(w, w.ro / "h.safetensors"), "--out"),
    ("fit-exit-head-out-is-dir", lambda w, o: fit_head(w, w.ro), "--out"),
    ("fit-exit-head-out-is-text", lambda w, o: fit_head(w, w.text), "--text"),
    ("fit-exit-head-out-is-target-weights", lambda w, o: fit_head(w, w.tgt / "model.safetensors"), "target weights"),
    ("fit-exit-head-text-too-short", lambda w, o: with_arg(fit_head(w, o / "h.safetensors"), "--text",
                                                           str(w.text_short)), "--text"),
    ("fit-exit-head-target-missing", lambda w, o: with_arg(fit_head(w, o / "h"), "--target", str(w.root / "nope")),
     "target"),
    # drafter train
    ("drafter-train-temperature-nan", lambda w, o: drafter_train(w, o, "--temperature", "nan"), "--temperature"),
    ("drafter-train-temperature-inf", lambda w, o: drafter_train(w, o, "--temperature", "inf"), "--temperature"),
    ("drafter-train-steps-0", lambda w, o: with_arg(drafter_train(w, o), "--steps", "0"), "steps"),
    ("drafter-train-lr-0", lambda w, o: drafter_train(w, o, "--lr", "0"), "lr"),
    ("drafter-train-max-new-tokens-0", lambda w, o: drafter_train(w, o, "--max-new-tokens", "0"), "--max-new-tokens"),
    ("drafter-train-layers-over-target", lambda w, o: drafter_train(w, o, "--layers", "0", "1", "99"), "--layers"),
    ("drafter-train-draft-vocab-0", lambda w, o: drafter_train(w, o, "--draft-vocab", "0"), "--draft-vocab"),
    ("drafter-train-out-file", lambda w, o: drafter_train(w, w.file), "--out"),
    ("drafter-train-prompts-missing", lambda w, o: with_arg(drafter_train(w, o), "--prompts", str(w.root / "no.jsonl")),
     "prompt file"),
    ("drafter-train-tracking-garbage", lambda w, o: with_arg(drafter_train(w, o), "--tracking-uri", "foo://x"),
     "tracking URI"),
    ("drafter-no-action", lambda w, o: ["drafter"], "ACTION"),
    # verify-sweep
    ("sweep-grid-unknown", lambda w, o: with_arg(sweep(w, o, "--no-tracking"), "--grid", "bogus:x=1"), "bogus"),
    ("sweep-grid-value", lambda w, o: with_arg(sweep(w, o, "--no-tracking"), "--grid", "lenience:l=a/b"), "lenience"),
    ("sweep-temperature-nan", lambda w, o: sweep(w, o, "--temperature", "nan", "--no-tracking"), "temperature"),
    ("sweep-limit-0", lambda w, o: sweep(w, o, "--limit", "0", "--no-tracking"), "--limit"),
    ("sweep-chain-length-0", lambda w, o: sweep(w, o, "--chain-length", "0", "--no-tracking"), "chain length"),
    ("sweep-budget-0", lambda w, o: with_arg(sweep(w, o, "--no-tracking"), "--budget", "0"), "budget"),
    ("sweep-decoders-unknown", lambda w, o: sweep(w, o, "--speculations", "beam", "--no-tracking"), "--speculations"),
    ("sweep-out-read-only", lambda w, o: sweep(w, w.ro / "s", "--no-tracking"), "--out"),
    ("sweep-tracking-garbage", lambda w, o: sweep(w, o, "--tracking-uri", "foo://x"), "tracking URI"),
    # demo
    ("demo-temperatures-text", lambda w, o: demo(w, o, "--temperatures", "1,warm"), "--temperatures"),
    ("demo-temperatures-nan", lambda w, o: demo(w, o, "--temperatures", "nan"), "--temperatures"),
    ("demo-temperatures-empty", lambda w, o: demo(w, o, "--temperatures", ","), "--temperatures"),
    ("demo-limit-0", lambda w, o: demo(w, o, "--limit", "0"), "--limit"),
    ("demo-limit-too-few-to-tune", lambda w, o: demo(w, o, "--limit", "2"), "--limit"),
    ("demo-out-file", lambda w, o: demo(w, w.file), "--out"),
    ("demo-drafter-spec", lambda w, o: demo(w, o, "--drafter", "nope"), "drafter spec"),
    ("demo-tracking-garbage", lambda w, o: with_arg(demo(w, o), "--tracking-uri", "foo://x"), "tracking URI"),
    # study
    ("study-rounds-0", lambda w, o: study(w, o, "--rounds", "0"), "--rounds"),
    ("study-greedy-rounds-text", lambda w, o: study(w, o, "--greedy-rounds", "many"), "--greedy-rounds"),
    ("study-temperatures-text", lambda w, o: study(w, o, "--temperatures", "1,warm"), "--temperatures"),
    ("study-out-file", lambda w, o: study(w, w.file), "--out"),
    ("study-drafter-spec", lambda w, o: study(w, o, "--drafter", "nope"), "drafter spec"),
    ("study-prompts-missing", lambda w, o: with_arg(study(w, o), "--prompts", str(w.root / "nope.jsonl")), "nope.jsonl"),
    ("study-prompts-malformed", lambda w, o: with_arg(study(w, o), "--prompts", str(w.p_malformed)), "malformed"),
    ("study-experiment-blank", lambda w, o: study(w, o, "--experiment", " "), "--experiment"),
    ("study-tracking-garbage", lambda w, o: with_arg(study(w, o), "--tracking-uri", "foo://x"), "tracking URI"),
    ("study-workers-0", lambda w, o: study(w, o, "--workers", "0"), "workers"),
    ("tree-config-topk-0", lambda w, o: tree_config(w, o, "--topk", "0", "--no-tracking"), "--topk"),
    ("tree-config-topk-text", lambda w, o: tree_config(w, o, "--topk", "two", "--no-tracking"), "--topk"),
    ("tree-config-draft-tokens-beyond-the-pool",
     lambda w, o: tree_config(w, o, "--topk", "2", "--num-draft-tokens", "64", "--no-tracking"), "--num-draft-tokens"),
    ("tree-config-eagle-two-values", lambda w, o: tree_config(w, o, "--eagle", "2,2", "--no-tracking"), "--eagle"),
    ("tree-config-eagle-total-token-too-large",
     lambda w, o: tree_config(w, o, "--eagle", "2,1,20", "--no-tracking"), ("--eagle", "num_draft_tokens 20")),
    ("tree-config-temperature-nan", lambda w, o: tree_config(w, o, "--temperature", "nan", "--no-tracking"),
     "--temperature"),
    ("tree-config-prompts-missing", lambda w, o: with_arg(tree_config(w, o, "--no-tracking"), "--prompts",
                                                          str(w.root / "none.jsonl")), "none.jsonl"),
    ("tree-config-reranker-missing", lambda w, o: tree_config(w, o, "--reranker", str(w.root / "no-model"),
                                                           "--no-tracking"), "no-model"),
    ("tree-config-engine-timing-no-plain",
     lambda w, o: tree_config(w, o, "--engine-timing", "k1=28.8", "--no-tracking"), "--engine-timing"),
    ("tree-config-engine-timing-unscored-setting",
     lambda w, o: tree_config(w, o, "--engine-timing", "plain=25,k9=40", "--no-tracking"), "k1-s9-n10"),
    ("tree-config-tracking-not-mlflow", lambda w, o: tree_config(w, o, "--tracking-uri", w.not_mlflow), NOT_MLFLOW),
    # the command line itself
    ("cli-unknown-command", lambda w, o: ["deploy"], "deploy"),
    ("cli-no-command", lambda w, o: [], "COMMAND"),
]


PREFIXES = {"fit": "drafter", "sweep": "verify-sweep", "tree": "tree-config"}  # fit-exit-head is a drafter action


def command_of(case_id: str) -> str:
    """The command a case tries (``cli`` for the command line itself)."""
    prefix = case_id.split("-")[0]
    return PREFIXES.get(prefix, prefix)


@pytest.fixture
def sandbox(world, tmp_path, monkeypatch):
    """A fresh working directory and output path per case; the shared inputs must come out unchanged."""
    monkeypatch.setenv("SPECRANK_CACHE", str(world.cache))
    monkeypatch.delenv("SPECRANK_DEBUG", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = snapshot(world.root)
    yield tmp_path / "out", cwd
    assert snapshot(world.root) == before, "a case changed its inputs or left output among them"


def assert_one_line_error(rc, err, field):
    """``field``: the text the line must name, or a tuple of texts it must all name."""
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err and all(f in lines[0] for f in (field if isinstance(field, tuple) else (field,))), \
        lines[0]
    assert lines[0].startswith("specrank"), lines[0]


@pytest.mark.parametrize("case_id, argv, field", CASES, ids=[c[0] for c in CASES])
def test_bad_input(world, sandbox, capfd, case_id, argv, field):
    out, cwd = sandbox
    argv = argv(world, out)
    capfd.readouterr()
    rc = main(argv)
    assert_one_line_error(rc, capfd.readouterr().err, field(world) if callable(field) else field)
    assert not out.exists(), f"left {sorted(p.name for p in out.rglob('*'))}"
    assert not any(cwd.iterdir()), f"left {sorted(p.name for p in cwd.iterdir())} in the working directory"


def test_the_suite_covers_every_command():
    from specrank.cli import COMMANDS

    tried = {command_of(c[0]) for c in CASES}
    assert len(CASES) >= 60 and set(COMMANDS) | {"cli"} == tried


def run_cli(args, cwd, **env):
    src = str(Path(__file__).parents[1] / "src")  # kept ahead of an inherited PYTHONPATH
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": path, **env}
    environment.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "specrank.cli", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


SUBPROCESS_CASES = [  # as a user types them: the installed entry point's exit status and stderr
    ("decode-temperature-nan", lambda w, o: decode(w, o, "--temperature", "nan"), "temperature"),
    ("decode-target-plain-pickle",
     lambda w, o: with_arg(decode(w, o), "--target", str(w.bins["tgt_plain_pickle"])),
     "tgt_plain_pickle/pytorch_model.bin"),
    ("decode-eagle3-plain-pickle",
     lambda w, o: with_arg(decode(w, o), "--drafter", f"eagle3:{w.bins['eagle3_plain_pickle']}"),
     "eagle3_plain_pickle/pytorch_model.bin"),
    ("tree-config-eagle3-plain-pickle",
     lambda w, o: with_arg(tree_config(w, o, "--no-tracking"), "--drafter", f"eagle3:{w.bins['eagle3_plain_pickle']}"),
     "eagle3_plain_pickle/pytorch_model.bin"),
    ("online-reranker-uri-default-store",
     lambda w, o: online(w, o, "--strategies", "reranked", "--reranker", "models:/rows/1", "--no-tracking"),
     "no MLflow database"),
]


@pytest.mark.parametrize("case_id, argv, field", SUBPROCESS_CASES, ids=[c[0] for c in SUBPROCESS_CASES])
def test_bad_input_from_a_shell(world, sandbox, case_id, argv, field):
    out, cwd = sandbox
    proc = run_cli(argv(world, out), cwd, SPECRANK_CACHE=str(world.cache))
    assert_one_line_error(proc.returncode, proc.stderr, field)
    assert not out.exists() and not any(cwd.iterdir())


@pytest.mark.parametrize("how", ["--debug", "SPECRANK_DEBUG=1"])
def test_debug_shows_the_traceback(world, sandbox, capfd, monkeypatch, how):
    """``--debug`` and ``SPECRANK_DEBUG=1`` print the full traceback, then the same one-line error."""
    out, _ = sandbox
    argv = train(world, out, "--learning-rate", "0")
    if how == "--debug":
        argv.append("--debug")
    else:
        monkeypatch.setenv("SPECRANK_DEBUG", "1")
    capfd.readouterr()
    rc = main(argv)
    err = capfd.readouterr().err
    assert rc == 2 and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("specrank train: error: The 'learning_rate' parameter")
    assert not out.exists()


@pytest.mark.parametrize("debug", [False, True])
def test_mlflow_notices_stay_off_stderr_unless_debug(world, sandbox, capfd, debug):
    """Creating a new store logs MLflow INFO lines; stderr shows them only with ``--debug``."""
    out, _ = sandbox
    out.mkdir()
    argv = ["featurize", str(world.run), "--out", str(out / "f.parquet"), "--tracking-uri", str(out / "new.db")]
    capfd.readouterr()
    assert main(argv + ["--debug"] * debug) == 0
    err = capfd.readouterr().err
    assert ("Creating initial MLflow database tables" in err) == debug, err
    if not debug:
        assert err == ""
    shutil.rmtree(out)


def test_a_later_failure_of_train_leaves_no_models(world, sandbox, capfd):
    """isotonic is fitted, then per_depth fails on its edges: neither model nor predictions are written."""
    out, _ = sandbox
    edges = pd.read_parquet(world.edges).drop(columns=["label"])
    bad = out.parent / "edges_no_label.parquet"
    from specrank.featurize import write_features

    edges.attrs = {"specrank": {"label_kind": "probability", "topk": 3, "temperature": 1.0, "version": "0.1.0"}}
    write_features(edges, bad)
    capfd.readouterr()
    rc = main(train(world, out, "--edges", str(bad), "--rerankers", "isotonic,per_depth"))
    captured = capfd.readouterr()
    assert "isotonic: cross-fitted" in captured.out  # the first reranker was fitted
    assert_one_line_error(rc, captured.err, "label")
    assert not out.exists()

