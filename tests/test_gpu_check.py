"""``benchmarks/gpu_check.sh``, the GPU check's one script: its syntax, and the relay that brings a model too large
for one call in parts over several calls (each stashed, joined once all are there, checked against its sha256).
Its stages themselves run in the tests of their pieces (the study without MLflow: test_optional_packages.py;
bench_gpu at a tiny shape with graphs on and off: test_decoder.py)."""

import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_the_script_parses_and_explains_itself():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    usage = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert usage.startswith("The GPU check:") and "gpu_check.sh tests bench" in usage and "set -uo" not in usage


def call(tmp_path, part, *stages):
    """One call of the script carrying ``part`` (``PARTS_DIR`` holds it alone), as the device machine runs it."""
    carried = tmp_path / "carried"
    carried.mkdir(exist_ok=True)
    for old in carried.glob("part-*"):
        old.unlink()
    if part is not None:
        (carried / part).write_bytes((tmp_path / "parts" / part).read_bytes())
    (carried / "model.sha256").write_bytes((tmp_path / "parts" / "model.sha256").read_bytes())
    env = {**os.environ, "PARTS_DIR": str(carried), "STASH": str(tmp_path / "stash"), "OUT": str(tmp_path / "out"),
           "SITE": str(tmp_path / "site"), "DEVICE": "cpu", "PATH": os.environ["PATH"]}
    return subprocess.run(["bash", str(SCRIPT), *stages], env=env, capture_output=True, text=True, timeout=300)


def split(tmp_path, data: bytes):
    parts = tmp_path / "parts"
    parts.mkdir()
    third = -(-len(data) // 3)
    for i in range(3):
        (parts / f"part-{i + 1}").write_bytes(data[i * third:(i + 1) * third])
    (parts / "model.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  model.gguf\n")


def test_the_model_arrives_in_three_calls_and_is_joined_only_when_whole(tmp_path):
    data = os.urandom(3000) + b"tail"
    split(tmp_path, data)
    assert "part-1 (of 3)" in call(tmp_path, "part-1").stdout
    early = call(tmp_path, "part-2", "study")  # two of three parts: refused, naming the missing one
    assert early.returncode == 1
    assert "model part-3 is not in" in early.stderr and "carry .model/part-3" in early.stderr
    assert not (tmp_path / "stash" / "model.gguf").exists()
    assert "part-1 part-2 part-3 (of 3)" in call(tmp_path, "part-3").stdout
    joined = call(tmp_path, None, "model")
    assert joined.returncode == 0, joined.stderr
    joined = next(line for line in joined.stdout.splitlines() if line.endswith(".gguf"))
    assert Path(joined) == tmp_path / "stash" / "model.gguf" and Path(joined).read_bytes() == data


def test_parts_that_do_not_match_the_sha256_are_refused(tmp_path):
    split(tmp_path, os.urandom(3000))
    for part in ("part-1", "part-2"):
        call(tmp_path, part)
    (tmp_path / "parts" / "part-3").write_bytes(b"not the third part")
    out = call(tmp_path, "part-3", "study")
    assert out.returncode == 1 and "do not match model.sha256" in out.stderr
    assert not (tmp_path / "stash" / "model.gguf").exists()
