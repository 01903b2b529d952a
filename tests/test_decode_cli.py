import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specrank.cli import main
from specrank.decode.runs.tables import read_rounds
from specrank.testing import save_tiny_llama

TEXTS = ["the cat is big", "write code for a dog", "what is the sun", "one two three four", "red car on the road",
         "how do we read", "a bird in the tree", "nine plus ten is"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("decode_cli")
    tgt = save_tiny_llama(d / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(d / "drf", seed=0, vocab_size=128, num_layers=2)
    bad = save_tiny_llama(d / "bad", seed=1, vocab_size=128, tokenizer_vocab=100, num_layers=1)
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(TEXTS)))
    args = ["decode", "--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts),
            "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "6", "--extra", "6",
            "--max-new-tokens", "16", "--shard-size", "1", "--threads", "1", "--no-progress", "--no-tracking"]
    return d, args, bad


def _assert_same_rounds(a, b):
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for col in a.columns:
        if col == "accepted_nodes":  # variable-length lists
            assert all(list(p) == list(q) for p, q in zip(a[col], b[col]))
            continue
        x, y = np.stack(a[col].map(np.asarray)), np.stack(b[col].map(np.asarray))
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-6, equal_nan=True, err_msg=col)
        else:
            np.testing.assert_array_equal(x, y, err_msg=col)


@pytest.fixture(scope="module")
def reference(setup):
    """An uninterrupted run of the 8 prompts."""
    d, args, _ = setup
    assert main(args + ["--out", str(d / "ref")]) == 0
    return d / "ref"


def test_sigkill_then_rerun_equals_uninterrupted_run(setup, reference):
    d, args, _ = setup
    ref, run = reference, d / "run"
    src = str(Path(__file__).parents[1] / "src")  # kept ahead of an inherited PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "specrank.cli", *args, "--out", str(run)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while not list((run / "rounds").glob("shard-*.parquet")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {f.name: f.stat().st_mtime_ns for f in (run / "rounds").glob("shard-*.parquet")}
    assert 1 <= len(before) < len(TEXTS), "the kill must land mid-run"
    assert main(args + ["--out", str(run)]) == 0
    after = {f.name: f.stat().st_mtime_ns for f in (run / "rounds").glob("shard-*.parquet")}
    assert all(after[k] == v for k, v in before.items())  # finished shards untouched
    assert not [f for f in (run / "rounds").iterdir() if f.suffix not in (".parquet", ".sha256")]  # no temp files
    assert len(pd.read_parquet(run / "rounds")) == len(read_rounds(run))  # the folder reads as one table
    a, b = read_rounds(ref), read_rounds(run)
    assert list(dict.fromkeys(b["prompt_id"])) == [str(i) for i in range(len(TEXTS))]  # none lost or duplicated
    assert b.groupby("prompt_id")["round"].apply(lambda r: list(r) == list(range(len(r)))).all()
    _assert_same_rounds(a, b)
    assert json.loads((run / "manifest.json").read_text()) == json.loads((ref / "manifest.json").read_text())


def _error(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("case, match", [
    ("malformed", "line 2: malformed JSON"),
    ("empty", "no prompts"),
    ("tokenizer", "tokenizer differs"),
    ("budget", "budget 100 must be in 1..21"),
    ("device", "unknown device 'tpu'"),
])
def test_bad_input_is_one_line_and_leaves_no_output(setup, capsys, tmp_path, case, match):
    d, args, bad = setup
    argv = args + ["--out", str(tmp_path / "out")]
    if case == "malformed":
        (tmp_path / "p.jsonl").write_text('{"question_id": 1, "turns": ["a b"]}\n{"question_id": 2,\n')
        argv[argv.index("--prompts") + 1] = str(tmp_path / "p.jsonl")
    elif case == "empty":
        (tmp_path / "p.jsonl").write_text("")
        argv[argv.index("--prompts") + 1] = str(tmp_path / "p.jsonl")
    elif case == "tokenizer":
        argv[argv.index("--drafter") + 1] = f"standalone:{bad}"
    elif case == "budget":
        argv += ["--budget", "100"]
    else:
        argv += ["--device", "tpu"]
    assert match in _error(capsys, argv)
    assert not (tmp_path / "out").exists()


def test_rerun_with_a_different_manifest_is_refused(setup, capsys, tmp_path):
    _, args, _ = setup
    out = tmp_path / "out"
    assert main(args + ["--out", str(out), "--limit", "1", "--max-new-tokens", "4"]) == 0
    capsys.readouterr()
    err = _error(capsys, args + ["--out", str(out), "--limit", "1", "--max-new-tokens", "4", "--temperature", "1"])
    assert "holds a different run (differs in: temperature)" in err
    # The same prompts from another path (another checkout) resume the run; other prompts do not.
    prompts = Path(args[args.index("--prompts") + 1])
    moved, edited = tmp_path / "moved.jsonl", tmp_path / "edited.jsonl"
    moved.write_bytes(prompts.read_bytes())
    edited.write_bytes(prompts.read_bytes() + b"\n")  # a blank line: same prompts, other bytes
    same = [str(moved) if a == str(prompts) else a for a in args]
    assert main(same + ["--out", str(out), "--limit", "1", "--max-new-tokens", "4"]) == 0
    other = [str(edited) if a == str(prompts) else a for a in args]
    assert "differs in: prompts_sha256" in _error(capsys, other + ["--out", str(out), "--limit", "1", "--max-new-tokens", "4"])


def _silently_wrong_flip(path):
    """Bytes of ``path`` with one byte flipped where pyarrow alone (no checksums) still decodes a table, but a
    different one: the corruption a resume must not trust."""
    import pyarrow.parquet as pq

    data, original = path.read_bytes(), pq.read_table(path)
    probe = path.with_name("probe.parquet")
    for pos in range(len(data) // 4, len(data) - 8, 97):
        flipped = bytearray(data)
        flipped[pos] ^= 0xFF
        probe.write_bytes(flipped)
        try:
            if not pq.read_table(probe).equals(original):
                probe.unlink()
                return bytes(flipped)
        except Exception:  # noqa: BLE001 - this position is one pyarrow notices by itself
            continue
    pytest.fail("no silently wrong position found")


def test_truncated_or_corrupted_shards_are_detected_and_redone(setup, reference, tmp_path, capsys):
    from specrank.decode.runs.shards import checksum_path, done_prompts, file_damage

    d, args, _ = setup
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    shards = sorted((run / "rounds").glob("shard-*.parquet"))
    truncated, corrupted, legacy = shards[1], shards[4], shards[6]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    corrupted.write_bytes(_silently_wrong_flip(corrupted))
    checksum_path(legacy).unlink()  # written before checksums: read whole, page checksums verified
    assert file_damage(legacy) is None
    legacy.write_bytes(legacy.read_bytes()[:-100])
    assert all(file_damage(f) for f in (truncated, corrupted, legacy))
    untouched = {f.name: f.stat().st_mtime_ns for f in shards if f not in (truncated, corrupted, legacy)}
    assert main(args + ["--out", str(run)]) == 0
    err = capsys.readouterr().err
    assert err.count("damaged shard rounds/") == 3, err
    assert {f.name: f.stat().st_mtime_ns for f in shards if f.name in untouched} == untouched
    assert not any(file_damage(f) for f in shards) and done_prompts(run) == set(range(len(TEXTS)))
    _assert_same_rounds(read_rounds(reference), read_rounds(run))
