"""benchmarks/bench_online.py --champion on tiny models: a tiny target, a tiny EAGLE-3 head where `make drafter` puts
``eagle3:default`` and a tiny champion where a rerun of the default study installs ``reranker:default``, both under
a temporary ``$SPECRANK_CACHE``; and its refusals, each in one line before a model loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specrank.decode.prompts import default_prompts_path, prompt_digest, read_prompts
from specrank.featurize.features import META_KEY
from specrank.rerankers import IsotonicFirstFactor
from specrank.rerankers.defaults import cached_reranker_dir
from specrank.testing import save_tiny_eagle3, save_tiny_llama, tiny_llama_config

ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = 2  # --prompts: the first two bundled prompts


def install_champion(law: str, learned_from, rounds: int = 200):
    """A tiny isotonic champion of ``law`` with a model card naming ``learned_from``, saved as ``reranker:default``."""
    rng = np.random.default_rng(0)
    q = rng.uniform(size=rounds)
    kind = "probability" if law == "sampling" else "argmax"
    features = pd.DataFrame({"q": q, "label": q**2 if kind == "probability" else (q > 0.5).astype(float)})
    features.attrs[META_KEY] = {"label_kind": kind, "topk": 10}  # the default pool's
    champion = IsotonicFirstFactor(n_bins=4).fit(features)
    champion.card_ = {"reranker": "isotonic", "temperature": 1.0 if law == "sampling" else 0.0, "rounds": rounds,
                      "training_prompts": sorted(prompt_digest(p.text) for p in learned_from)}
    champion.save(cached_reranker_dir(law))
    return cached_reranker_dir(law)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRANK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_champion_mode_decodes_draft_against_the_default_champion_at_t1(cache, tmp_path):
    target = save_tiny_llama(tmp_path / "target", seed=0, vocab_size=128)
    save_tiny_eagle3(cache / "drafters" / "smollm2-eagle3", tiny_llama_config(vocab_size=128), seed=0)
    prompts = read_prompts(default_prompts_path())
    path = install_champion("sampling", prompts[HELD_OUT:HELD_OUT + 3])
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_online.py"), "--champion", "--target",
                          str(target), "--drafter", "eagle3:default", "--temperature", "1", "--prompts", str(HELD_OUT),
                          "--max-new-tokens", "6", "--budgets", "4,8", "--threads", "1", "--bootstrap", "50"],
                         capture_output=True, text=True, timeout=300)
    printed = json.loads(out.stdout)
    assert out.returncode == int(not printed["met"]), out.stderr
    record = json.loads((Path(os.environ["SPECRANK_BENCH_RESULTS"]) / "bench_online_champion_t1.json").read_text())
    assert record["figures"] == printed and printed["complete"]
    assert printed["temperature"] == 1.0 and printed["drafter"] == "eagle3:default" and printed["held_out_prompts"] == 2
    champion = printed["champion"]
    assert {k: champion[k] for k in ("path", "law", "reranker", "rounds")} == {
        "path": str(path.resolve()), "law": "sampling", "reranker": "isotonic", "rounds": 200}
    assert f"reranker:default (sampling): {path}" in out.stderr  # the file the run loaded, as it said
    assert set(printed["budgets"]) == {"4", "8"}
    for budget in printed["budgets"].values():
        draft, reranked = budget["strategies"]["draft"], budget["strategies"]["reranked"]
        assert draft["speed_vs_draft"] == [1.0, 1.0, 1.0] and draft["ms_per_round"]["rerank"] == 0
        ratio, low, high = reranked["speed_vs_draft"]
        assert low <= ratio <= high and reranked["rounds"] > 0
        mean, low, high = reranked["realized"]
        assert low <= mean <= high
        ms = reranked["ms_per_round"]
        assert ms["rerank"] > 0 and reranked["break_even_gain"]["cpu_round"] == ms["rerank"] / ms["seconds"]
        assert len(reranked["realized_minus_draft"]) == 3
    assert "met_back_to_back" not in printed  # no back-to-back timing in this mode


def test_the_default_mode_still_fits_four_rerankers_and_writes_the_same_figures(tmp_path):
    target = save_tiny_llama(tmp_path / "target", seed=0, vocab_size=128)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_online.py"), "--target", str(target),
                          "--drafter", "early-exit:2", "--prompts", str(HELD_OUT), "--train-prompts", "3",
                          "--train-tokens", "12", "--max-new-tokens", "6", "--budgets", "4", "--threads", "1",
                          "--bootstrap", "50", "--gbm-size", "5x3@0.3"], capture_output=True, text=True, timeout=300)
    printed = json.loads(out.stdout)
    assert out.returncode == int(not printed["met"]), out.stderr
    record = json.loads((Path(os.environ["SPECRANK_BENCH_RESULTS"]) / "bench_online.json").read_text())
    assert record["figures"] == printed
    assert list(printed) == ["target", "drafter", "threads", "held_out_prompts", "gpu_round_ms", "budgets", "gbm",
                             "goals", "met", "met_back_to_back", "complete"]  # a greedy run's fields, as before
    strategies = printed["budgets"]["4"]["strategies"]
    assert list(strategies) == ["draft", "reranked-rows", "reranked-base", "reranked-isotonic", "reranked-per-depth"]
    assert list(strategies["reranked-rows"]) == [
        "tokens_per_s", "tokens_per_pass", "rounds", "realized", "speed_vs_draft", "ms_per_round", "inference",
        "rerank_back_to_back_ms", "break_even_gain", "realized_minus_draft"]
    assert strategies["draft"]["speed_vs_draft"] == [1.0, 1.0, 1.0]
    assert strategies["reranked-rows"]["inference"].startswith("QuickScorer")
    assert set(printed["budgets"]["4"]["inference_ms"]) == {"rows", "base"}


def bench_online(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_online.py"), *args], capture_output=True,
                          text=True, timeout=300)


def test_the_champion_mode_refuses_another_drafter_and_a_prompt_the_champion_learned_from(cache):
    nowhere = str(cache / "no-target")  # a refusal comes before any model loads
    out = bench_online("--champion", "--target", nowhere, "--drafter", "early-exit:1", "--prompts", str(HELD_OUT))
    assert out.returncode == 2
    assert out.stderr.splitlines()[-1].endswith("--champion: reranker:default was trained with eagle3:default, not "
                                                "early-exit:1 (pass --drafter eagle3:default)")
    install_champion("greedy", read_prompts(default_prompts_path())[1:3])  # the second held-out prompt among them
    out = bench_online("--champion", "--target", nowhere, "--drafter", "eagle3:default", "--prompts", str(HELD_OUT))
    assert out.returncode == 2
    assert "reranker reranker:default learned from 1 of these 2 prompts" in out.stderr.splitlines()[-1]
    assert not list(Path(os.environ["SPECRANK_BENCH_RESULTS"]).glob("bench_online_champion_greedy*"))  # nothing written