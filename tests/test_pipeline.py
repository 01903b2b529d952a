"""Pipelined decoding: the drafter in a worker process keeps every strategy exact (greedy text, sampled law),
the root pass runs while it drafts, and a dead worker stops the decode with one line instead of a hang."""

import json
import os
import signal
import time

import numpy as np
import pandas as pd
import pytest

from specrank.cli import main
from specrank.decode import Decoder
from specrank.decode.config import DecodeConfig
from specrank.decode.pipeline import PipelineError, PipelinedDrafter, WorkerError, drafter_payload
from specrank.decode.core import PoolShape, PoolShapeError
from specrank.decode.engine.timer import Timer
from specrank.decode.worker import build_drafter
from specrank.decode.loading import load_drafter
from specrank.decode.strategies import STRATEGIES, make_strategy
from specrank.testing import save_tiny_eagle3, save_tiny_llama
from decode_helpers import (
    PROMPT, DrafterRowDraw, decode_prompt_online, greedy_reference, sampled_pvalue, tiny_pair,
)

SHAPE = PoolShape(4, 4, 4)  # 52 candidates
ROOT_STRATEGIES = ("root", "root_draw", "pearl")


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


# The tests that share the module's worker: pytest-xdist keeps them on one worker process, which starts it once.
SHARED_WORKER = pytest.mark.xdist_group("pipeline-worker")


@pytest.fixture(scope="module")
def worker(pair):
    w = PipelinedDrafter(pair[1], threads=1)
    yield w
    w.close()
    assert not w.alive  # reaped


@pytest.fixture(scope="module")
def local_copy(pair):
    """The worker's drafter rebuilt in this process from the same payload (BLAS results depend on memory
    alignment, so the in-process original may differ from any copy in the last float32 bits)."""
    return build_drafter(drafter_payload(pair[1]), "cpu")


@SHARED_WORKER
@pytest.mark.parametrize("strategy, budget", [(r, 8) for r in sorted(STRATEGIES)] + [(r, 3) for r in ROOT_STRATEGIES])
def test_pipelined_greedy_equals_target_greedy_round_by_round_as_serial(pair, worker, local_copy, strategy, budget):
    target = pair[0]
    config = DecodeConfig(SHAPE, budget=budget, extra=0, max_new_tokens=32)
    piped, serial = Timer(), Timer()
    out, records = decode_prompt_online(target, worker, PROMPT, config, make_strategy(strategy), timer=piped)
    ref, ref_records = decode_prompt_online(target, local_copy, PROMPT, config, make_strategy(strategy), timer=serial)
    assert out == ref == greedy_reference(target, PROMPT, 32)
    assert len(records) == len(ref_records) and piped.passes == serial.passes
    for a, b in zip(records, ref_records):  # the same pools, trees, rows and acceptance, round by round
        assert a.keys() == b.keys()
        for key, value in a.items():
            np.testing.assert_array_equal(np.asarray(b[key]), np.asarray(value), err_msg=key)
    assert serial.root_pass_hidden_s == 0.0 and 0.0 <= piped.root_pass_hidden_s <= piped.root
    assert piped.drafting > 0 and (piped.root > 0) == STRATEGIES[strategy].needs_root_pass


@SHARED_WORKER
def test_root_pass_runs_while_the_worker_drafts(pair, worker):
    """A root pass made slower than drafting hides the drafting: the target barely waits for the pool."""
    target = pair[0]
    forward = target.forward

    def slow_root(ids, *args, **kwargs):
        if len(ids) == 1:
            time.sleep(0.05)
        return forward(ids, *args, **kwargs)

    target.forward = slow_root
    try:
        timer = Timer()
        config = DecodeConfig(SHAPE, budget=4, extra=0, max_new_tokens=24)
        out, _ = decode_prompt_online(target, worker, PROMPT, config, make_strategy("root_draw"), timer=timer)
    finally:
        del target.forward
    assert out == greedy_reference(target, PROMPT, 24)
    assert 0 < timer.root_pass_hidden_s <= timer.root  # how much is hidden is a timing: benchmarks/bench_pipeline.py


def test_sampled_first_tokens_follow_target_law_and_wrong_draw_fails():
    target, drafter = tiny_pair(vocab=32, hidden_size=16, num_layers=1, seed=2, scale=0.5)
    with PipelinedDrafter(drafter, threads=1) as worker:
        for strategy in ("root_draw", "root"):  # PEARL-style shares root-draw's forced first draw
            assert sampled_pvalue(target, worker, make_strategy(strategy)) > 1e-3, strategy
        assert sampled_pvalue(target, worker, DrafterRowDraw()) < 1e-4


@pytest.mark.parametrize("fault, says", [(signal.SIGKILL, "was killed by SIGKILL"),
                                         (signal.SIGSTOP, "gave no reply within 3 s")], ids=["killed", "hung"])
def test_worker_killed_or_hung_mid_decode_is_a_one_line_error_and_reaped(pair, fault, says):
    target, drafter = pair
    with Decoder(target, drafter, "root_draw", budget=4, shape=SHAPE, pipeline=True, drafter_threads=1) as dec:
        out = dec.generate(PROMPT, max_new_tokens=16)
        assert out.tokens == greedy_reference(target, PROMPT, 16)
        assert 0.0 <= out.stats.root_pass_hidden_share <= 1.0 and out.stats.time_split["drafting"] > 0
        pid, forward, roots = dec.drafter.pid, target.forward, []
        dec.drafter.timeout = 3.0

        def faulty(ids, *args, **kwargs):  # the fault hits during the third root pass: while the worker drafts
            roots.extend([1] * (len(ids) == 1))
            if len(roots) == 3 and len(ids) == 1:
                os.kill(pid, fault)
            return forward(ids, *args, **kwargs)

        target.forward = faulty
        try:
            with pytest.raises(WorkerError) as err:
                dec.generate(PROMPT, max_new_tokens=64)
        finally:
            del target.forward
        message = str(err.value)
        assert "\n" not in message and f"pid {pid}" in message and says in message
        assert not dec.drafter.alive and dec.drafter._process.exitcode == -signal.SIGKILL  # reaped
        with pytest.raises(WorkerError):  # stays stopped: no hang on the next prompt
            dec.generate(PROMPT, max_new_tokens=4)


@SHARED_WORKER
def test_worker_errors_keep_their_type_and_interrupted_rounds_leave_no_stale_pool(worker, local_copy):
    worker.start(PROMPT)
    with pytest.raises(PoolShapeError, match="exceeds the draft vocabulary"):
        worker.grow_pool(5, PoolShape(topk=500, depth=2, expand=1))
    worker.start(PROMPT)
    worker.request_pool(5, SHAPE)  # an interrupted round: its pool is never received
    worker.start(PROMPT[:-1])
    local_copy.start(PROMPT[:-1])
    pool, fresh = worker.grow_pool(7, SHAPE), local_copy.grow_pool(7, SHAPE)
    np.testing.assert_array_equal(pool.token, fresh.token)
    np.testing.assert_array_equal(pool.draft_logp, fresh.draft_logp)
    assert worker.alive


def test_hidden_state_drafters_are_refused_with_one_line_error(pair, tmp_path):
    target = pair[0]
    eagle = load_drafter(f"eagle3:{save_tiny_eagle3(tmp_path / 'e', target.model.config)}", target)
    with pytest.raises(PipelineError, match="reads the target's hidden states") as err:
        Decoder(target, eagle, "root_draw", budget=4, shape=SHAPE, pipeline=True)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="pipeline=True"):
        Decoder(target, eagle, "root_draw", budget=4, shape=SHAPE, drafter_threads=1)


def test_online_command_pipeline(tmp_path, capsys):
    tgt = save_tiny_llama(tmp_path / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(tmp_path / "drf", seed=0, vocab_size=128, num_layers=2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(["the cat is big", "what is the sun"])))
    args = ["online", "--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts),
            "--topk", "3", "--depth", "3", "--expand", "3", "--budget", "4", "--max-new-tokens", "8",
            "--threads", "1", "--bootstrap", "100", "--no-tracking", "--strategies", "draft,root_draw,pearl"]
    assert main(args + ["--drafter-threads", "1", "--out", str(tmp_path / "x")]) == 2
    assert "place the worker of --pipeline" in capsys.readouterr().err
    assert main(args + ["--pipeline", "--drafter-threads", "1", "--out", str(tmp_path / "out")]) == 0
    decoders = pd.read_parquet(tmp_path / "out" / "online_strategies.parquet").set_index("strategy")
    assert decoders.loc[["root_draw", "pearl"], "root_pass_hidden_share"].between(0, 1).all()
    assert np.isnan(decoders.loc["draft", "root_pass_hidden_share"]) and (decoders["drafter_busy_s"] > 0).all()


def test_comparisons_inside_a_kept_worker_share_it_and_decode_as_with_their_own(pair, monkeypatch):
    """A study's budgets decode in one worker (``kept_worker``): it outlives the comparisons inside its block, is
    stopped when the block ends, and each comparison decodes what it decodes with a worker of its own."""
    from specrank.decode.loading.model_spec import Models
    from specrank.decode.prompts import Prompt
    from specrank.experiments.online import comparison
    from specrank.experiments.online.comparison import OnlineSettings, Protocol, compare_online, kept_worker

    prompts = [Prompt("a", "qa", "the cat is big")]
    models = Models(*pair)
    protocol = Protocol(warmup=0, bootstrap=20, pipeline=("root_draw",))

    def rounds(budget):  # each strategy's rounds: the token a round starts from, what it accepted and emitted
        config = DecodeConfig(SHAPE, budget=budget, extra=0, max_new_tokens=6)
        settings = OnlineSettings(prompts, ("draft", "root_draw"), config=config, protocol=protocol)
        result = compare_online(models, settings, progress=False)
        table = result.tables["online_rounds"].sort_values(["strategy", "prompt_id", "round"])
        return table[["strategy", "round", "root_token", "accepted", "continuation"]].values.tolist()

    alone = rounds(8)
    with kept_worker(models) as worker:
        assert worker.alive
        started = []  # workers the comparisons start themselves: none inside the block
        monkeypatch.setattr(comparison, "PipelinedDrafter", lambda *a, **k: started.append(a) or PipelinedDrafter(*a, **k))
        assert rounds(3) and rounds(8) == alone and started == []
        assert worker.alive  # the same worker served both, and outlives them
    assert not worker.alive
    with kept_worker(models, start=False) as none:
        assert none is None


def test_root_overlap_and_speed_gain_figure_from_a_decodes_table():
    from specrank.evaluation.figures import speed_gain_figure
    from specrank.experiments.online.online_tables import root_overlap, speed_ratios

    piped = "root_draw-pipelined"
    decodes = pd.DataFrame({
        "prompt_id": list("abab"), "strategy": ["draft", "draft", piped, piped], "tokens": [10, 10, 12, 12],
        "rounds": [5, 5, 5, 5], "seconds": [2.0, 2.0, 1.5, 1.5], "draft_s": [1.0, 1.0, 0.5, 0.5],
        "drafter_busy_s": [1.0] * 4, "root_pass_s": [0.0, 0.0, 0.2, 0.4], "root_pass_hidden_s": [0.0, 0.0, 0.2, 0.2],
        "tree_pass_s": [0.5] * 4})
    overlap = root_overlap(decodes, 200)
    assert overlap["strategy"].tolist() == [piped]
    assert overlap.loc[0, "hidden"] == pytest.approx(0.4 / 0.6) and overlap.loc[0, "low"] <= overlap.loc[0, "high"]
    assert overlap.loc[0, "root_pass_ms"] == pytest.approx(60.0)
    speed = speed_ratios(decodes, "draft", 200).assign(budget=8)
    fig = speed_gain_figure(speed, order=["draft", piped])
    assert [p.get_height() for p in fig.axes[0].patches] == [pytest.approx(60.0)]  # 12/1.5 over 10/2: +60%


@pytest.mark.slow
def test_smollm2_pipelined_early_exit_equals_target_greedy():
    import torch

    from specrank.decode.loading.targets import load_target
    from specrank.decode.prompts import default_prompts_path, encode_prompt, read_prompts

    torch.set_num_threads(1)
    target = load_target("smollm2")
    text = next(p for p in read_prompts(default_prompts_path()) if p.prompt_id == "summarization-00").text
    ids = encode_prompt(target.tokenizer, text)
    reference = greedy_reference(target, ids, 12)
    config = DecodeConfig(PoolShape(10, 2, 10), budget=8, extra=0, max_new_tokens=12)  # the default topk, 2 levels
    with PipelinedDrafter(load_drafter("early-exit:8", target), threads=1) as worker:
        for strategy in ("draft",) + ROOT_STRATEGIES:
            timer = Timer()
            out, _ = decode_prompt_online(target, worker, ids, config, make_strategy(strategy), timer=timer)
            assert out == reference, strategy
            assert timer.root_pass_hidden_s <= timer.root
