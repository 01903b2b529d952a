"""The public Decoder: lossless for every strategy, greedy and seeded sampling, token ids and prompt lists,
round records, and one-line errors at construction before any model pass."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specrank.decode import Decoder, PoolShape, STRATEGY_NAMES, StrategyError
from specrank.decode.config import DecodeConfig
from specrank.decode.prompts import encode_prompt
from specrank.decode.runs import record_prompt, rounds_table
from specrank.featurize import featurize_rounds
from specrank.rerankers import GBMReranker, IsotonicFirstFactor
from decode_helpers import PROMPT, greedy_reference, tiny_pair

SHAPE = PoolShape(4, 3, 4)
# SmolLM2's tests draft the default topk two levels deep (110 candidates): what they check (greedy identity, the
# reranker's tree paths) holds at any pool, and one expansion pass is a seventh of the default pool's seven; the
# README test and the recording fixture keep the default pool.
SMOLLM2_SHAPE = PoolShape(10, 2, 10)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(scale=0.05, seed=4)


def fitted(pair, temperature=0.0, topk=4, cls=GBMReranker):
    target, drafter = pair
    config = DecodeConfig(PoolShape(topk, 3, 4), budget=4, extra=20, temperature=temperature, max_new_tokens=30)
    records = []
    for i in range(4):
        records += record_prompt(target, drafter, PROMPT[:-1] + [6 + i, 30 + i], config, f"p{i}", "t")[1]
    frame = featurize_rounds(rounds_table(records, config.shape.size, topk), {"temperature": temperature, "topk": topk})
    if cls is GBMReranker:
        return GBMReranker(features="rows", n_estimators=20, num_leaves=7, min_child_samples=5, n_jobs=1).fit(frame)
    return cls(n_bins=8).fit(frame)


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_every_strategy_generates_the_target_greedy_text(pair, strategy):
    target, drafter = pair
    reranker = fitted(pair) if strategy == "reranked" else None
    dec = Decoder(target, drafter, strategy, reranker=reranker, budget=5, shape=SHAPE)
    out = dec.generate(PROMPT, max_new_tokens=24)
    assert out.tokens == greedy_reference(target, PROMPT, 24)
    assert out.text == target.tokenizer.decode(out.tokens, skip_special_tokens=True)
    s = out.stats
    assert s.tokens == len(out.tokens) and s.rounds == len(s.accepted) and sum(s.accepted) + s.rounds >= s.tokens  # EOS cuts the last round
    root_pass = strategy in ("root", "root_draw", "pearl")  # a root pass, and a tree pass unless it is skipped
    assert s.rounds <= s.passes <= 2 * s.rounds if root_pass else s.passes <= s.rounds
    assert s.tokens_per_s > 0 and set(s.time_split) >= {"prefill", "draft", "target", "rerank", "bookkeeping"}


def test_token_ids_text_and_lists_of_prompts(pair):
    target, drafter = pair
    dec = Decoder(target, drafter, "root_draw", budget=5, shape=SHAPE)
    text = "the cat and the dog"
    one = dec.generate(text, max_new_tokens=8)
    assert one.prompt_tokens == encode_prompt(target.tokenizer, text) and one.tokens == greedy_reference(target, one.prompt_tokens, 8)
    many = dec.generate([text, PROMPT], max_new_tokens=8)
    assert [m.tokens for m in many] == [one.tokens, greedy_reference(target, PROMPT, 8)]


def test_sampling_is_seeded_and_rounds_yield_records(pair):
    target, drafter = pair
    dec = Decoder(target, drafter, "draft", budget=5, shape=SHAPE, temperature=1.0)
    a, b = (dec.generate(PROMPT, max_new_tokens=16, seed=3).tokens for _ in range(2))
    c = dec.generate(PROMPT, max_new_tokens=16, seed=4).tokens
    assert a == b and a != c
    records = list(dec.rounds(PROMPT, max_new_tokens=16, seed=3))
    assert sum(r["accepted"] + 1 for r in records) >= 16 and [r["round"] for r in records] == list(range(len(records)))
    assert all(r["strategy"] == "draft" and len(r["token"]) == SHAPE.size for r in records)


def test_construction_errors_are_one_line_before_any_model_pass(pair, tmp_path):
    target, drafter = pair
    greedy = fitted(pair, cls=IsotonicFirstFactor)
    calls = []
    forward = target.forward
    target.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    try:
        cases = [
            (dict(strategy="reranked", reranker=tmp_path / "nope"), "no reranker at"),
            (dict(strategy="best"), "unknown strategy 'best'"),
            (dict(strategy="reranked"), "needs a reranker"),
            (dict(strategy="draft", reranker=greedy), "takes no reranker"),
            (dict(strategy="reranked", reranker=greedy, temperature=1.0), "trained on argmax labels"),
            (dict(strategy="reranked", reranker=greedy, shape=PoolShape(3, 3, 3)), "topk=4, this run has topk=3"),
            (dict(strategy="reranked", reranker=object()), "not a fitted specrank reranker"),
            (dict(strategy="draft", budget=0), "budget 0 must be in"),
        ]
        for kwargs, message in cases:
            kwargs = {"shape": SHAPE, "budget": 4, **kwargs}
            with pytest.raises((StrategyError, ValueError, FileNotFoundError), match=re.escape(message)) as err:
                Decoder(target, drafter, **kwargs)
            assert "\n" not in str(err.value), kwargs
        dec = Decoder(target, drafter, "reranked", reranker=greedy, shape=SHAPE, budget=4)
        with pytest.raises(StrategyError, match="this run needs probability"):
            dec.generate(PROMPT, max_new_tokens=4, temperature=0.7)  # checked again when generate changes the law
        with pytest.raises(ValueError, match="temperature must be a finite number"):
            dec.generate(PROMPT, max_new_tokens=4, temperature=float("nan"))
        assert not calls
    finally:
        target.forward = forward


def test_importing_evaluation_leaves_the_matplotlib_backend_alone():
    code = ("import matplotlib; matplotlib.use('svg'); import specrank.evaluation, specrank.experiments.verify_sweep.sweep_tables; "
            "from specrank.evaluation.figures import acceptance_figure; import pandas as pd; "
            "acceptance_figure(pd.DataFrame({'strategy': ['a'], 'statistic': ['realized'], 'mean': [1.0], "
            "'low': [0.5], 'high': [1.5]})).savefig('/dev/null', format='png'); print(matplotlib.get_backend())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg"


def test_gpu_benchmark_runs_at_a_tiny_shape_on_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--shape", "tiny", "--rounds", "3",
                          "--prompt-len", "24", "--budget", "8", "--threads", "1",
                          "--rerankers", "rows,base,isotonic,per-depth", "--profile-rounds", "2", "--graphs", "both"],
                         capture_output=True, text=True, check=True, timeout=300)
    result = json.loads(out.stdout)
    reranked = ("reranked", "reranked-base", "reranked-isotonic", "reranked-per-depth")
    for name in ("draft",) + reranked:
        split = result["budgets"]["8"][name]["split"]
        assert split["rounds"] == 3 and split["draft"] > 0 and split["target"] > 0 and split["bookkeeping"] >= 0
    assert all(result["budgets"]["8"][name]["split"]["rerank"] > 0 for name in reranked)
    assert set(result["reranker_share_of_round"]["8"]) == {"rows", "base", "isotonic", "per-depth"}
    assert result["gbm"]["rows"] == {"n_estimators": 100, "num_leaves": 15, "learning_rate": 0.1}  # the default
    profile = result["bookkeeping_profile"]["8"]  # the commit's slices and verification's argmax, at least
    assert profile["decoder"] == "draft" and profile["ops_per_round"] > 2 and "aten::argmax" in profile["ops"]
    spans = profile["spans"]  # wall time only: a CPU has no device timeline
    assert {"total", "draft", "target", "bookkeeping"} <= set(spans) and spans["total"]["wall_ms"] > spans["draft"]["wall_ms"] > 0
    assert all(row["gpu_busy_ms"] is None for row in spans.values())
    # both graph settings timed: the figures with graphs where the docs read them, without beside them
    assert result["graphs"] == "both" and set(result["budgets_no_graphs"]["8"]) == set(result["budgets"]["8"])
    assert set(result["graphs_speedup"]["8"]) == {"draft", *reranked} and all(
        x > 0 for x in result["graphs_speedup"]["8"].values())


def test_device_busy_time_is_the_union_of_the_device_intervals_inside_a_span():
    from specrank.decode.runs.timeline import busy_within, merged

    busy = merged([(5.0, 8.0), (0.0, 2.0), (1.0, 3.0), (7.0, 10.0)])  # two streams overlap: busy once
    assert busy == [(0.0, 3.0), (5.0, 10.0)]
    assert busy_within(busy, 2.0, 6.0) == 2.0 and busy_within(busy, 3.0, 5.0) == 0.0
    assert busy_within(busy, -1.0, 20.0) == 8.0 and busy_within(busy, 6.0, 7.0) == 1.0


def test_the_full_vocabulary_path_records_and_reranks_token_ids_above_65535():
    """Llama-3.1-8B's 128,256-token vocabulary at a tiny width: a recorded round scores all M = 710 edges and
    keeps ids above 65,535, and reranked rounds decode."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--shape", "tiny-128k-vocab",
                          "--rounds", "2", "--prompt-len", "24", "--budget", "8", "--threads", "1", "--record-rounds", "1",
                          "--strategies", "reranked", "--warmup-rounds", "0"],
                         capture_output=True, text=True, check=True, timeout=300)
    result = json.loads(out.stdout)
    record, reranked = result["record"], result["budgets"]["8"]["reranked"]["split"]
    assert record["pool_size"] == 710 and record["p_edge_finite"] == 1.0 and 65535 < record["max_token"] < 128256
    assert reranked["rounds"] == 2 and reranked["rerank"] > 0 and result["budgets"]["8"]["peak_mib"] > 0


def readme_example() -> str:
    """The README's decoding example, as written (the Python block after its marker comment)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- decoding-example -->", 1)[1]
    return block.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def smollm2():
    from specrank.decode import load_drafter, load_target

    if not os.environ.get("PYTEST_XDIST_WORKER"):  # a worker beside another keeps its one thread
        torch.set_num_threads(2)
    target = load_target("smollm2")
    return target, load_drafter("early-exit:8", target)


@pytest.mark.slow
def test_readme_example_runs_as_written_and_equals_target_greedy(smollm2, tmp_path, monkeypatch):
    """The README block, run as written in a directory holding ``runs/greedy`` made by the README's commands."""
    from specrank.cli import main
    from specrank.decode.prompts import encode_prompt

    monkeypatch.chdir(tmp_path)
    # the README's commands at a small size: two prompts, 8 tokens, three pool levels (the reranker is checked
    # against the pool's topk only, and the block decodes with the default pool)
    for argv in (["decode", "--drafter", "early-exit:8", "--out", "runs/greedy", "--limit", "2", "--max-new-tokens",
                  "8", "--depth", "3", "--budget", "8", "--extra", "0", "--no-progress"],
                 ["featurize", "runs/greedy"],
                 ["train", "runs/greedy/features.parquet", "--rerankers", "rows", "--n-estimators", "50"]):
        assert main(argv) == 0
    target = smollm2[0]
    scope = {}
    exec(readme_example(), scope)
    out = scope["out"]
    ids = encode_prompt(target.tokenizer, "Write a haiku about rain.")
    assert out.tokens == greedy_reference(target, ids, 32)
    assert out.text == target.tokenizer.decode(out.tokens, skip_special_tokens=True)
    assert out.stats.rounds == len(out.stats.accepted) and out.stats.passes == out.stats.rounds


@pytest.mark.slow
def test_smollm2_every_lossless_strategy_equals_target_greedy(smollm2):
    from specrank.decode.prompts import default_prompts_path, read_prompts

    target, drafter = smollm2
    text = next(p for p in read_prompts(default_prompts_path()) if p.prompt_id == "summarization-00").text
    for strategy in ("draft", "root", "root_draw", "pearl", "covering"):
        out = Decoder(target, drafter, strategy, budget=8, shape=SMOLLM2_SHAPE).generate(text, max_new_tokens=12)
        assert out.tokens == greedy_reference(target, out.prompt_tokens, 12), strategy


@pytest.fixture(scope="module")
def smollm2_recorded(smollm2):
    """Two SmolLM2 prompts recorded greedily (early-exit:8, ``SMOLLM2_SHAPE``, B = 8): the config, and each
    prompt's (prompt ids, output, round records)."""
    from specrank.decode.prompts import default_prompts_path, read_prompts

    target, early_exit = smollm2
    config = DecodeConfig(SMOLLM2_SHAPE, budget=8, extra=0, temperature=0.0, max_new_tokens=12)
    chosen = ("summarization-00", "math_reasoning-00")
    recorded = []
    for p in [p for p in read_prompts(default_prompts_path()) if p.prompt_id in chosen]:
        ids = encode_prompt(target.tokenizer, p.text)
        out, records = record_prompt(target, early_exit, ids, config, p.prompt_id, p.task)
        recorded.append((ids, out, records))
    return config, recorded


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2-rows")  # shares the recording with the Rows reranker's tests
def test_smollm2_recording_equals_its_own_greedy_decode(smollm2, smollm2_recorded):
    """The recording loop emits what transformers' own greedy ``generate`` does."""
    target = smollm2[0]
    config, recorded = smollm2_recorded
    for ids, out, records in recorded:
        with torch.no_grad():
            ref = target.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):]
        assert out == ref.tolist()
        assert records and all(r["n_scored"] >= config.budget for r in records)  # each round scores its tree


@pytest.fixture(scope="module")
def smollm2_rows(smollm2_recorded):
    """A Rows reranker fitted on the two recorded SmolLM2 prompts."""
    config, recorded = smollm2_recorded
    records = [r for _, _, prompt_records in recorded for r in prompt_records]
    frame = featurize_rounds(rounds_table(records, config.shape.size, config.shape.topk),
                             {"temperature": 0.0, "topk": config.shape.topk})
    return GBMReranker(features="rows", n_estimators=30, num_leaves=15, min_child_samples=5, n_jobs=1).fit(frame)


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2-rows")  # both share the fitted reranker: one worker fits it
@pytest.mark.parametrize("trees", ["quickscorer", "lightgbm"])
def test_smollm2_reranked_equals_target_greedy_with_early_exit_and_the_eagle3_head(smollm2, smollm2_rows, trees,
                                                                                    monkeypatch):
    """The reranked strategy with a Rows reranker (both tree paths) still decodes the target's greedy text with
    both default drafters: a reranker changes which tree is verified, never what is emitted."""
    from specrank.decode import load_drafter
    from specrank.decode.prompts import default_prompts_path, read_prompts

    target, early_exit = smollm2
    monkeypatch.setenv("SPECRANK_TREES", trees)
    text = next(p for p in read_prompts(default_prompts_path()) if p.prompt_id == "summarization-00").text
    for drafter in (early_exit, load_drafter("eagle3:default", target)):
        decoder = Decoder(target, drafter, "reranked", reranker=smollm2_rows, budget=8, shape=SMOLLM2_SHAPE)
        out = decoder.generate(text, max_new_tokens=12)
        assert out.tokens == greedy_reference(target, out.prompt_tokens, 12), drafter
        path = decoder.strategy.compiled.inference
        assert path.startswith("QuickScorer" if trees == "quickscorer" else "LightGBM predict")


def test_a_reranker_is_checked_against_the_temperature_it_decodes_at(pair):
    """A sampling reranker builds a decoder with no temperature and decodes at T = 1; at the default (greedy)
    it is refused in one line when generation starts, before any model pass."""
    target, drafter = pair
    sampling = fitted(pair, temperature=1.0, cls=IsotonicFirstFactor)
    dec = Decoder(target, drafter, "reranked", reranker=sampling, shape=SHAPE, budget=4)
    assert dec.generate(PROMPT, max_new_tokens=6, temperature=1.0).stats.rounds >= 1
    with pytest.raises(StrategyError, match="trained on probability labels, this run needs argmax") as err:
        dec.generate(PROMPT, max_new_tokens=6)
    assert "\n" not in str(err.value)


def test_decoding_takes_a_fitted_reranker_or_a_file_not_an_mlflow_uri(pair):
    target, drafter = pair
    with pytest.raises(StrategyError, match=re.escape("load it first with specrank.tracking.resolve_reranker")):
        Decoder(target, drafter, "reranked", reranker="models:/demo-t1@champion", shape=SHAPE, budget=4)
    code = "import sys, specrank.decode.decoder; assert 'mlflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src")})


def test_generate_leaves_the_decoder_unchanged_and_a_champion_is_resolved_when_it_is_built(pair, monkeypatch):
    """The champions of each law the decoder serves are loaded when it is built; generating at either temperature
    reassigns nothing on it (its attributes are the same objects after)."""
    import specrank.decode.decoder as decoder_module

    target, drafter = pair
    champions = {"greedy": fitted(pair, 0.0, cls=IsotonicFirstFactor), "sampling": fitted(pair, 1.0, cls=IsotonicFirstFactor)}
    loaded = []

    def load(temperature, name):
        loaded.append((temperature, name))
        return champions["greedy" if temperature == 0 else "sampling"]

    monkeypatch.setattr(decoder_module, "named_champion", lambda strategy, reranker, drafter: "default")
    monkeypatch.setattr(decoder_module, "load_default_reranker", load)
    monkeypatch.setattr(decoder_module, "default_reranker_dir", lambda temperature, name: Path(f"/{name}/{temperature}"))
    dec = Decoder(target, drafter, "reranked", config=DecodeConfig(SHAPE, budget=4, extra=0))
    assert loaded == [(0.0, "default")]  # a decoder built at T = 0 serves the greedy law only
    both = Decoder(target, drafter, "reranked", shape=SHAPE, budget=4)
    assert loaded[1:] == [(0.0, "default"), (1.0, "default")] and set(both.strategies) == {"greedy", "sampling"}
    before = {k: (id(v), v) for k, v in vars(both).items()}
    for t in (1.0, 0.0, 1.0):
        assert both.generate(PROMPT, max_new_tokens=4, temperature=t).stats.rounds >= 1
    assert {k: (id(v), v) for k, v in vars(both).items()} == before and len(loaded) == 3  # nothing reloaded
    assert both.strategy_for(DecodeConfig(SHAPE, 4, 0, 1.0)).reranker is champions["sampling"]
    with pytest.raises(StrategyError, match="built for T = 0"):
        dec.generate(PROMPT, max_new_tokens=4, temperature=1.0)  # the law it was not built for, in one line


def test_the_keywords_fold_into_one_config(pair):
    target, drafter = pair
    base = DecodeConfig(SHAPE, budget=4, extra=0, temperature=1.0)
    dec = Decoder(target, drafter, config=base, budget=3)
    assert dec.config == DecodeConfig(SHAPE, budget=3, extra=0, temperature=1.0) and dec.temperature == 1.0
    assert Decoder(target, drafter, shape=SHAPE, budget=4).temperature is None  # serves any temperature
