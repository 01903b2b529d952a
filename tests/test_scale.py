"""Shards on Ray workers (``specrank.scale``) on a local Ray (2 CPUs, no dashboard, loopback only) with tiny
models: the same rounds as one process, bit for bit; a killed worker loses only its shard and a rerun finishes
exactly it; Ctrl-C leaves no partial shard; missing Ray and an unreachable cluster are one-line errors."""

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from specrank.cli import main
from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.prompts import Prompt, read_prompts
from specrank.scale import ScaleError, Workers, ray_session
from specrank.testing import save_tiny_llama
from decode_helpers import saved_tiny_inputs

# These tests share costly module fixtures: pytest-xdist keeps them on one worker.
pytestmark = pytest.mark.xdist_group("ray")

if importlib.util.find_spec("ray") is None:  # importing it here would settle its address before `cluster` does
    pytest.skip("Ray is not installed (pip install 'specrank[ray]')", allow_module_level=True)

TEXTS = ["the cat is big", "write code for a dog", "what is the sun", "one two three four", "red car on the road",
         "how do we read", "a bird in the tree", "nine plus ten is"]
POOL = ["--topk", "3", "--depth", "3", "--expand", "3", "--budget", "6", "--extra", "6"]


@pytest.fixture(scope="module")
def cluster():
    """One local Ray for the module (starting one costs seconds): its address, for drivers in subprocesses."""
    with ray_session(Workers(2), num_cpus=2) as ray:
        yield ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("scale")
    tgt, drf, prompts = saved_tiny_inputs(d, TEXTS)
    args = ["decode", "--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts), *POOL,
            "--max-new-tokens", "16", "--shard-size", "1", "--threads", "1", "--no-progress", "--no-tracking"]
    return d, args


@pytest.fixture(scope="module")
def reference(models):
    """Single-process runs, greedy and at T = 1."""
    d, args = models
    refs = {t: d / f"ref-t{t}" for t in (0, 1)}
    for t, out in refs.items():
        assert main(args + ["--temperature", str(t), "--out", str(out)]) == 0
    torch.set_num_threads(1)
    return refs


def shard_bytes(run: Path) -> dict:
    return {f.relative_to(run).as_posix(): f.read_bytes() for f in sorted(run.glob("*/shard-*.parquet"))}


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def temps(run: Path) -> list:
    return [f for f in run.rglob("*") if f.name.endswith(".tmp")]


def test_workers_record_the_rounds_and_manifest_of_one_process(cluster, models, reference, tmp_path):
    from specrank.decode.loading.model_spec import ModelSpec
    from specrank.decode.runs.workers import RunSpec, decode_on_workers

    d, args = models
    cfg = dict(shape=PoolShape(3, 3, 3), budget=6, extra=6, max_new_tokens=16)
    runs = [RunSpec(str(tmp_path / f"t{t}"), DecodeConfig(temperature=float(t), **cfg)) for t in (0, 1)]
    argv = dict(zip(args[1::2], args[2::2]))
    outcome = decode_on_workers(Workers(2, threads=1), ModelSpec(argv["--target"], argv["--drafter"]),
                                read_prompts(argv["--prompts"]), argv["--prompts"], runs, shard_size=1, progress=False)
    assert sum(t.shards for t in outcome.timings) == 2 * len(TEXTS)
    assert all(t.shards > 0 for t in outcome.timings)  # both workers took part
    for t in (0, 1):
        run, ref = tmp_path / f"t{t}", reference[t]
        assert shard_bytes(run) == shard_bytes(ref) != {}  # every shard file, bit for bit
        assert manifest(run).pop("workers") == 2
        assert {k: v for k, v in manifest(run).items() if k != "workers"} == manifest(ref)
    assert main(args + ["--out", str(tmp_path / "t0")]) == 0  # one process resumes the workers' run: the same run


def driver(args, cluster, out):
    """``specrank decode --workers 2`` in a subprocess joined to the module's Ray, and its worker pids."""
    src = str(Path(__file__).parents[1] / "src")  # kept ahead of an inherited PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    # SIGINT back to its default in the child: a suite started as a background job (`make test &`, CI runners)
    # inherits SIGINT ignored, Python then installs no KeyboardInterrupt handler, and the driver would sail past
    # the Ctrl-C test's interrupt and finish every shard.
    proc = subprocess.Popen([sys.executable, "-m", "specrank.cli", *args, "--workers", "2", "--ray-address", cluster,
                             "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    err, pids = [], []

    def read():
        for line in proc.stdout:
            err.append(line)
            found = re.match(r"2 workers .*: (.*)", line)
            if found:
                pids.extend(int(p) for p in re.findall(r"pid (\d+)", found[1]))

    threading.Thread(target=read, daemon=True).start()
    deadline = time.time() + 240
    while not list(out.glob("rounds/shard-*.parquet")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None and len(pids) == 2, "".join(err)
    return proc, pids, err


def gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_killed_worker_loses_only_its_shard_and_the_rerun_finishes_it(cluster, models, reference, tmp_path):
    d, args = models
    run = tmp_path / "run"
    proc, pids, err = driver(args + ["--temperature", "0"], cluster, run)
    os.kill(pids[0], signal.SIGKILL)  # mid-run: every shard is decoded by one worker or the other
    proc.wait(timeout=240)
    time.sleep(0.2)  # the reader's last lines
    text = "".join(err)
    assert proc.returncode == 2, text
    assert re.search(r"error: 1 shard\(s\) lost when workers died: prompts .*; rerun the same command", text), text
    lost = [int(m) for m in re.findall(r"^lost prompts (\d+)-\1 .*died", text, re.M)]
    assert len(lost) == 1, text
    assert f"pid {pids[0]}" in text
    assert not temps(run)
    before = {f.name: f.stat().st_mtime_ns for f in run.glob("rounds/shard-*.parquet")}
    name = lambda i: f"shard-{i:05d}-{i:05d}.parquet"  # noqa: E731
    kept, lost_names = {name(i) for i in range(len(TEXTS)) if i not in lost}, {name(i) for i in lost}
    # the kill can land after the lost shard's file was written and before its worker answered: then the file is
    # whole (written atomically), and the rerun keeps it like any finished shard
    assert kept <= set(before) <= kept | lost_names
    assert main(args + ["--temperature", "0", "--workers", "2", "--out", str(run)]) == 0  # the same command
    after = {f.name: f.stat().st_mtime_ns for f in run.glob("rounds/shard-*.parquet")}
    assert set(after) - set(before) == lost_names - set(before)  # exactly those still missing
    assert all(after[k] == v for k, v in before.items())
    assert shard_bytes(run) == shard_bytes(reference[0]) and not temps(run)


def test_ctrl_c_stops_the_workers_and_leaves_no_partial_shard(cluster, models, reference, tmp_path):
    d, args = models
    run = tmp_path / "run"
    # 64 new tokens a prompt (not the reference's 16): the seven shards left after the first take seconds, and
    # the interrupt is handled within the shard in flight.
    proc, pids, err = driver(args + ["--temperature", "1", "--max-new-tokens", "64"], cluster, run)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    time.sleep(0.2)
    assert proc.returncode == 130, "".join(err)
    assert all(gone(pid) for pid in pids)
    assert not temps(run)
    done = sorted(run.glob("*/shard-*.parquet"))
    assert 1 <= len(done) < len(shard_bytes(reference[1]))
    for shard in done:  # finished shards only, each whole: it reads back, one prompt's rounds to its last token
        table = pq.read_table(shard).to_pandas()
        assert table["prompt_id"].nunique() == 1 and len(table) > 0


def _one_line_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


def test_no_ray_and_an_unreachable_cluster_are_one_line_errors_before_any_model_loads(models, tmp_path, monkeypatch,
                                                                                      capsys):
    d, args = models
    args = [a.replace(str(d / "tgt"), str(d / "no-such-target")) for a in args]  # a model load would fail otherwise
    out = tmp_path / "out"
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = _one_line_error(capsys, args + ["--workers", "2", "--ray-address", f"127.0.0.1:{port}", "--out", str(out)])
    assert f"--ray-address 127.0.0.1:{port}: cannot reach" in err
    assert "needs --workers" in _one_line_error(capsys, args + ["--ray-address", "auto", "--out", str(out)])
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    assert "pip install 'specrank[ray]'" in _one_line_error(capsys, args + ["--workers", "2", "--out", str(out)])
    train = ["drafter", "train", "--target", str(d / "no-such-target"), "--out", str(out), "--workers", "2"]
    assert "pip install 'specrank[ray]'" in _one_line_error(capsys, train)
    assert not out.exists()
    with pytest.raises(ScaleError, match="positive"):
        Workers(0)


def test_verify_sweep_cells_on_workers_equal_one_process(cluster, models, tmp_path):
    d, args = models
    common = ["verify-sweep", *args[1:7], "--grid", "lossless", "minp:p_base=0.3", "--temperature", "1",
              "--chain-length", "2", *POOL[:-2], "--max-new-tokens", "12", "--limit", "4", "--shard-size", "1",
              "--threads", "1", "--no-progress", "--no-tracking"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(common + ["--out", str(one)]) == 0
    assert main(common + ["--workers", "2", "--out", str(two)]) == 0
    cells = sorted(p.relative_to(one) for p in one.glob("runs/*/*"))
    assert len(cells) == 4 and cells == sorted(p.relative_to(two) for p in two.glob("runs/*/*"))
    import pandas as pd

    for cell in cells:
        rounds = {k: v for k, v in shard_bytes(one / cell).items() if k.startswith("rounds/")}
        assert rounds == {k: v for k, v in shard_bytes(two / cell).items() if k.startswith("rounds/")}
        a, b = (pd.read_parquet(r / cell / "diagnostics") for r in (one, two))
        pd.testing.assert_frame_equal(a.drop(columns="prompt_seconds"), b.drop(columns="prompt_seconds"))
    a, b = (pd.read_parquet(r / "verify_sweep.parquet") for r in (one, two))
    pd.testing.assert_frame_equal(a.drop(columns="tokens_per_s"), b.drop(columns="tokens_per_s"))


def test_drafter_data_on_workers_equals_one_process(cluster, tmp_path):
    from safetensors import safe_open

    from specrank.decode.loading.targets import load_target
    from specrank.drafter_training.data import GenerationSpec, generate_corpus

    target = load_target(str(save_tiny_llama(tmp_path / "tgt", seed=1)))
    prompts = [Prompt(f"p{i}", "t", "the cat is " + "big " * i) for i in range(4)]
    spec = GenerationSpec(layers=(1, 2, 3), samples=1, max_new_tokens=6, batch_size=2, seed=3)
    one = generate_corpus(target, prompts, spec, root=tmp_path / "one")
    two = generate_corpus(target, prompts, spec, root=tmp_path / "two", workers=Workers(2, threads=1))
    files = sorted(f.name for f in one.glob("shard-*.safetensors"))
    assert len(files) == 4 and files == sorted(f.name for f in two.glob("shard-*.safetensors"))
    for name in files:
        with safe_open(str(one / name), "pt") as a, safe_open(str(two / name), "pt") as b:
            assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
            for key in a.keys():
                assert torch.equal(a.get_tensor(key), b.get_tensor(key)), (name, key)


def test_a_run_on_workers_is_logged_to_mlflow_like_one_process(cluster, models, tmp_path_factory, tmp_path):
    from mlflow.tracking import MlflowClient

    from mlflow_store import migrated_db

    d, args = models
    db = migrated_db(tmp_path_factory, tmp_path / "store" / "mlflow.db")
    tracked = [a for a in args if a != "--no-tracking"] + ["--limit", "2", "--tracking-uri", f"sqlite:///{db}",
                                                           "--experiment", "scale", "--run-name", "on-workers"]
    assert main(tracked + ["--workers", "2", "--out", str(tmp_path / "run")]) == 0
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("scale").experiment_id])
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert run.info.run_name == "on-workers" and run.data.metrics["workers"] == 2
    assert run.data.metrics["rounds"] == run.data.metrics["recorded_rounds"] > 0
    assert run.data.params["manifest.prompts_sha256"] == manifest["prompts_sha256"]
    # the same command in one process, logged beside it: the same run but for what only workers have
    one = [a if a != "on-workers" else "one-process" for a in tracked]
    assert main(one + ["--out", str(tmp_path / "one")]) == 0
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("scale").experiment_id])}
    w, o = runs["on-workers"].data, runs["one-process"].data
    only_workers = {k for k in set(w.params) ^ set(o.params)}
    assert all("worker" in k for k in only_workers), only_workers
    differing = {k for k in set(w.params) & set(o.params) if w.params[k] != o.params[k]}
    assert differing <= {"out", "run_dir", "manifest.out"} | {k for k in differing if "worker" in k or "time" in k}, differing
    assert set(o.metrics) <= set(w.metrics), set(o.metrics) - set(w.metrics)
    for k in ("rounds", "recorded_rounds", "prompts", "tokens"):
        if k in o.metrics:
            assert w.metrics[k] == o.metrics[k], k
    assert o.metrics["rounds"] > 0
