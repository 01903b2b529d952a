"""Packages a machine may lack (a GPU image with torch but not MLflow, Ray, Optuna, gguf or LightGBM): the study
runs to its results without MLflow and Ray, and whatever needs a missing package is refused in one line naming
it and its install command, exit status 2, before any output.

Each command runs in a subprocess whose ``sys.modules`` hides the packages (set to None, an import of them
fails as if they were not installed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specrank.errors import installed, user_message
from specrank.testing import save_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["the cat is big", "write code for a dog", "what is the sun", "one two three four", "red car on the road",
         "how do we read", "a bird in the tree", "nine plus ten is"]


def specrank(argv, hidden, cwd):
    """``specrank ARGV`` in a subprocess where the modules ``hidden`` cannot be imported."""
    code = (f"import sys\nfor m in {list(hidden)!r}: sys.modules[m] = None\n"
            f"from specrank.cli import main\nsys.exit(main({list(map(str, argv))!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("optional")
    tgt = save_tiny_llama(d / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(d / "drf", seed=0, vocab_size=128, num_layers=2)
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"p{i}", "category": ["qa", "writing"][i % 2],
                                           "turns": [t]}) + "\n" for i, t in enumerate(WORDS)))
    return d, ["--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts), "--temperatures",
               "1", "--rounds", "40", "--max-new-tokens", "12", "--chunk", "4", "--bootstrap", "20",
               "--n-estimators", "20", "--threads", "1"]


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    return lines[0]


def test_the_study_runs_to_its_results_without_mlflow_and_ray_and_says_so_once(models):
    d, args = models
    out = d / "study"
    proc = specrank(["study", "--out", out, *args, "--tune-trials", "1", "--online-budgets", "8"], ["mlflow", "ray"], d)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    notice = ("specrank study: MLflow is not installed, so the study logs nothing to it (as with --no-tracking) "
              "(pip install mlflow)")
    assert lines[0] == notice and lines.count(notice) == 1
    # the rest: the online phase naming its champion's inference path, once per decoding call
    assert lines[1:] and all(line.startswith(f"reranker {out / 't1' / 'champion'}: ") for line in lines[1:])
    results = json.loads((out / "results.json").read_text())
    assert set(results["temperatures"]) == {"1"} and results["temperatures"]["1"]["rounds"] >= 40
    assert (out / "results.md").is_file() and not (out / "mlflow.db").exists()


@pytest.mark.parametrize("option,expected", [
    (["--tracking-uri", "sqlite:///x.db"], "--tracking-uri needs mlflow"),
    (["--experiment", "mine"], "--experiment needs mlflow"),
])
def test_asking_the_study_for_mlflow_without_it_is_one_line(models, option, expected):
    d, args = models
    out = d / "refused"
    line = one_line(specrank(["study", "--out", out, *args, "--tune-trials", "0", *option], ["mlflow"], d))
    assert line == f"specrank study: error: {expected}, which is not installed here: pip install mlflow"
    assert not out.exists() and not (d / "x.db").exists()


def test_a_study_on_ray_workers_without_ray_is_one_line(models):
    d, args = models
    line = one_line(specrank(["study", "--out", d / "ray", *args, "--no-tracking", "--workers", "2"], ["ray"], d))
    assert line == "specrank study: error: --workers needs Ray, an optional extra: pip install 'specrank[ray]'"
    assert not (d / "ray").exists()


def test_tuning_without_optuna_is_one_line_naming_the_untuned_choice(models):
    d, args = models
    line = one_line(specrank(["study", "--out", d / "tune", *args, "--no-tracking"], ["optuna"], d))
    assert line == ("specrank study: error: --tune-trials 4 (tuning Base and Rows; 0 fits them untuned) needs "
                    "optuna, which is not installed here: pip install optuna")


def test_a_gguf_target_without_gguf_is_one_line_before_any_output(models, tmp_path):
    d, args = models
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    argv = ["study", "--out", tmp_path / "out", *args[2:], "--target", str(gguf), "--no-tracking", "--tune-trials", "0"]
    line = one_line(specrank(argv, ["gguf"], tmp_path))
    assert line == f"specrank study: error: --target {gguf} (a GGUF model) needs gguf, which is not installed here: pip install gguf"
    assert not (tmp_path / "out").exists()


def test_without_lightgbm_every_command_says_so_in_one_line(tmp_path):
    line = one_line(specrank(["study", "--help"], ["lightgbm"], tmp_path))
    assert line == "specrank: error: this command needs lightgbm, which is not installed here: pip install lightgbm"


def test_a_library_naming_a_missing_package_is_translated_and_an_installed_one_is_a_bug(monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)
    assert not installed("gguf") and installed("numpy")
    message = "Please install torch and gguf>=0.10.0 to load a GGUF checkpoint in PyTorch."  # transformers' words
    assert user_message(ImportError(message)) == "this command needs gguf, which is not installed here: pip install gguf"
    assert user_message(ModuleNotFoundError("No module named 'gguf'", name="gguf")) is not None
    assert user_message(ModuleNotFoundError("No module named 'numpy.x'", name="numpy.x")) is None
    assert user_message(ImportError("cannot import name 'f' from 'numpy'")) is None


def test_decode_without_mlflow_records_its_run_and_says_so_once(models):
    d, args = models
    out = d / "decode"
    argv = ["decode", "--out", out, *args[:6], "--limit", "2", "--max-new-tokens", "4", "--threads", "1"]
    proc = specrank(argv, ["mlflow"], d)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[0] == ("specrank decode: MLflow is not installed, so the run logs nothing "
                                                   "to it (as with --no-tracking) (pip install mlflow)")
    assert (out / "manifest.json").is_file() and not (d / "mlflow.db").exists()
    line = one_line(specrank([*argv[:2], d / "decode-named", *argv[3:], "--run-name", "mine"], ["mlflow"], d))
    assert line == "specrank decode: error: --run-name needs mlflow, which is not installed here: pip install mlflow"


def test_a_run_records_specrank_s_version_from_a_source_copy_no_installer_has_seen(monkeypatch):
    """On a machine that runs the package from PYTHONPATH, importlib.metadata knows no specrank: the version comes
    from the package itself, and a package that is not installed has none."""
    from importlib import metadata

    import specrank
    from specrank.versions import package_version

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert package_version("specrank") == specrank.__version__
    assert package_version("numpy") is None
