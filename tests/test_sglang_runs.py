"""SGLang runs read without an engine (``specrank.engines.sglang.engine_runs``): accept length, greedy identity and
first differences against plain decoding, and the paired prompt-bootstrap gain, with controls; an earlier run checked
against tree-config's prediction; SGLang's tree sampling ported to torch for its CPU engine (``cpu_shims``); the
held-out prompts ``benchmarks/bench_sglang.py`` decodes (``specrank.experiments.held_out``); and that benchmark's
refusals, through its command line."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specrank.engines.sglang.engine_runs import (chosen_settings, earlier_engine, engine_figures, inside_predicted,
                                             paired_gain)

ROOT = Path(__file__).resolve().parent.parent


def bench_sglang(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_sglang.py"), *args], capture_output=True,
                          text=True, timeout=600)


def run(rows):
    """A ``specrank.engines.sglang.runner`` output: (id, output ids, verify steps, correct drafts) per prompt, 1 s
    each."""
    return {"rows": [{"id": i, "output_ids": out, "seconds": 1.0, "verify_ct": v, "correct_drafts": c,
                      "completion_tokens": len(out)} for i, out, v, c in rows]}


def test_accept_length_counts_the_bonus_token_and_differences_name_their_first_token():
    plain = run([("a", [1, 2, 3, 4], 0, 0), ("b", [5, 6, 7, 8], 0, 0), ("c", [9, 9], 0, 0)])
    spec = run([("a", [1, 2, 3, 4], 2, 2), ("b", [5, 6, 0, 8], 3, 1), ("c", [9, 9, 9], 1, 1)])
    fig = engine_figures(spec, plain)
    assert fig["accept_length"] == pytest.approx(1 + 4 / 6)  # SGLang's correct drafts a verify step, plus its bonus
    assert fig["identical_to_plain"] == "1/3"
    assert fig["first_differences"] == [("b", 2, 7, 0), ("c", 2, None, 9)]  # (prompt, index, plain's, this run's)
    assert "accept_length" not in engine_figures(plain, None)  # plain decoding verifies nothing
    assert "identical_to_plain" not in engine_figures(spec, None)  # no reference, no comparison


def test_the_paired_gain_finds_a_real_gain_and_none_where_there_is_none():
    rng = np.random.default_rng(0)
    verify = rng.integers(20, 40, 40)
    correct = rng.binomial(verify * 3, 0.2)
    rows = [(f"p{i}", [0], int(v), int(c)) for i, (v, c) in enumerate(zip(verify, correct))]
    own = run(rows)
    better = run([(i, o, v, c + v // 5) for i, o, v, c in rows])  # 0.2 more accepted a step on every prompt
    gain = paired_gain(own, better)
    assert gain["gain"] == pytest.approx(float(sum(v // 5 for v in verify) / verify.sum()))
    assert 0 < gain["low"] <= gain["gain"] <= gain["high"]
    same = paired_gain(own, own)  # control: the same run against itself gains nothing, with a zero-width interval
    assert same == {"gain": 0.0, "low": 0.0, "high": 0.0}


def sampled_tree(n_samples, threshold_single=1.0, seed=0):
    """``n_samples`` requests verifying one tree with ``tree_sampling``'s port of SGLang's kernel: root (node 0)
    with children 1 and 2 (tokens 2 and 4, tried in that order), node 1 with child 3 (token 1); V = 6. Returns the
    target rows (4, V) and the first two emitted tokens of each request (the second -1 when nothing was accepted)."""
    import torch

    from specrank.engines.sglang.cpu_shims.tree_sampling import tree_speculative_sampling_target_only

    rng = np.random.default_rng(seed)
    rows = torch.tensor(rng.dirichlet(np.ones(6), 4), dtype=torch.float32)
    rows[0] = torch.tensor([0.1, 0.05, 0.35, 0.2, 0.25, 0.05])  # the root's: a child of mass >= 0.3
    bs, n, depth = n_samples, 4, 3
    candidates = torch.tensor([[0, 2, 4, 1]] * bs)
    index = torch.arange(bs)[:, None] * n + torch.arange(n)
    next_token, next_sibling = torch.tensor([[1, 3, -1, -1]] * bs), torch.tensor([[-1, 2, -1, -1]] * bs)
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index, accepted = torch.full((bs, depth), -1, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed)
    coins, final = torch.rand(bs, n, generator=gen), torch.rand(bs, generator=gen)
    target = rows[None].expand(bs, n, 6).contiguous()
    tree_speculative_sampling_target_only(predicts, accept_index, accepted, candidates, index, next_token,
                                          next_sibling, coins, final, target, torch.zeros_like(target),
                                          threshold_single=threshold_single)
    first = predicts[index[:, 0]].numpy()
    second = np.where(accepted.numpy() >= 1, predicts[accept_index[:, 1].clamp(min=0).long()].numpy(), -1)
    return rows.double().numpy(), first, second


@pytest.mark.parametrize("threshold_single, lossless", [(1.0, True), (0.3, False)])
def test_sglangs_tree_sampling_port_emits_the_targets_law_and_a_lossy_threshold_does_not(threshold_single, lossless):
    """SGLang's target-only tree verification, ported for its CPU engine (``--sampling-verify``): the first token
    follows the root's target row, and the token after an accepted node 1 follows node 1's row, whichever of its
    child or the residual draw emits it. A single-token threshold of 0.3 (SGLang's lossy
    ``speculative_accept_threshold_single``) accepts node 1 whatever its coin: the test sees it."""
    from scipy.stats import chisquare

    rows, first, second = sampled_tree(6000, threshold_single)
    law = rows / rows.sum(1, keepdims=True)  # float32 rows, summed again in float64
    p_first = chisquare(np.bincount(first, minlength=6), law[0] * len(first)).pvalue
    after = second[first == 2]  # node 1 accepted: the second token comes from node 1's row
    p_second = chisquare(np.bincount(after, minlength=6), law[1] * len(after)).pvalue
    assert (min(p_first, p_second) > 1e-3) == lossless, (p_first, p_second)


def test_a_larger_held_out_set_leaves_out_every_prompt_the_head_or_a_champion_trained_on(tmp_path):
    """``--prompts spec-bench``: the Spec-Bench questions in a study's order, less every one the shipped head or
    either shipped champion learned from (their cards name a few dozen), written where tree-config reads them;
    asking for more than remain is refused in one line; a prompt a champion learned from, added to the set, is left
    out."""
    from specrank.decode.loading.drafters import trained_on
    from specrank.decode.prompts import prompt_digest, read_prompts, spec_bench_path
    from specrank.experiments.held_out import HeldOutError, held_out_prompts, write_prompts
    from specrank.rerankers import load_reranker
    from specrank.rerankers.defaults import default_reranker_dir
    from specrank.workflow.champion import training_prompts

    seen = set().union(*(training_prompts(load_reranker(default_reranker_dir(t))) for t in (0.0, 1.0)))
    everything = read_prompts(spec_bench_path())
    learned = [p for p in everything if prompt_digest(p.text) in seen]
    assert len(learned) >= 40  # the champions learned from Spec-Bench prompts: the filter has work to do
    unseen = len(everything) - len({p.prompt_id for p in learned} | set(trained_on("eagle3:default", everything)))

    prompts = held_out_prompts("eagle3:default", unseen, "spec-bench")
    assert len(prompts) == unseen and not {prompt_digest(p.text) for p in prompts} & seen
    path = tmp_path / "held-out.jsonl"
    write_prompts(path, prompts)
    assert [p.prompt_id for p in read_prompts(path)] == [p.prompt_id for p in prompts]
    assert {p.task for p in prompts[:40]} >= {"translation", "summarization", "qa", "math_reasoning", "rag"}

    with pytest.raises(HeldOutError) as refused:
        held_out_prompts("eagle3:default", unseen + 1, "spec-bench")
    assert f"{unseen} prompts that neither" in str(refused.value) and len(str(refused.value).splitlines()) == 1

    learned_too = tmp_path / "learned-too.jsonl"  # the held-out set and one prompt a champion learned from
    learned_too.write_text(path.read_text() + json.dumps({"question_id": "learned", "category": learned[0].task,
                                                          "turns": [learned[0].text]}) + "\n")
    kept = held_out_prompts("eagle3:default", unseen, str(learned_too))
    assert len(kept) == unseen and "learned" not in {p.prompt_id for p in kept}


def test_an_earlier_engine_run_is_checked_against_the_prediction_only_on_the_same_prompts(tmp_path):
    """``--part predict --engine-results NAME``: an engine run's measured gain is marked inside or outside the
    predicted interval; a run of other prompts, or one without an engine part, is refused in one line."""
    figures = {"prompt_ids": ["a", "b"], "max_new_tokens": 128, "settings": {"champion_b8": {"topk": 10}}}
    engine = {"t1": {"plugin_gain": {"gain": 0.048, "low": 0.022, "high": 0.076}, "sglang": {"accept_length": 1.36},
                     "plugin": {"accept_length": 1.41}}}
    (tmp_path / "eng.json").write_text(json.dumps({"figures": figures | {"engine": engine}}))
    got = earlier_engine(tmp_path / "eng.json", figures)
    assert got["t1"]["plugin_gain"]["gain"] == 0.048 and got["from_results"] == "eng.json"

    for point, low, high, inside, covered in ((0.05, 0.01, 0.09, True, True), (0.06, 0.05, 0.09, False, True),
                                              (0.08, 0.05, 0.09, False, False)):
        both = {"predicted": {"champion_b8_t1": {"plugin_gain": point, "plugin_gain_low": low,
                                                 "plugin_gain_high": high, "draft_low": 1.3, "draft_high": 1.35,
                                                 "plugin_low": 1.35, "plugin_high": 1.45,
                                                 "plugin_gain_run_low": low - 0.01, "plugin_gain_run_high": high}},
                "engine": json.loads(json.dumps(got))}
        inside_predicted(both)
        assert both["engine"]["t1"]["gain_inside_predicted_interval"] is inside
        assert both["engine"]["t1"]["predicted_gain_inside_measured_interval"] is covered
        assert both["engine"]["t1"]["gain_inside_predicted_run_interval"] is (low - 0.01 <= 0.048 <= high)
        assert not both["engine"]["t1"]["sglang"]["inside_predicted_interval"]  # 1.36 above [1.3, 1.35]
        assert both["engine"]["t1"]["plugin"]["inside_predicted_interval"]

    (tmp_path / "other.json").write_text(
        json.dumps({"figures": figures | {"prompt_ids": ["a", "c"], "engine": engine}}))
    (tmp_path / "bare.json").write_text(json.dumps({"figures": figures}))
    for name, says in (("other", "its prompt_ids differ"), ("bare", "no engine part"), ("missing", "no such results")):
        with pytest.raises(ValueError) as refused:
            earlier_engine(tmp_path / f"{name}.json", figures)
        assert says in str(refused.value) and len(str(refused.value).splitlines()) == 1


def test_the_benchmark_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path):
    """Exit 2 and one line for an engine run named outside ``--part predict``, an unknown setting and a missing
    results file; that last refusal comes after the held-out prompts are chosen, before anything is written."""
    for args, says in ((["--part", "engine", "--engine-results", "eng"], "only with --part predict"),
                       (["--settings", "sglang_default,b16"], "b16 is not one of")):
        out = bench_sglang(*args)
        assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    work = tmp_path / "work"
    out = bench_sglang("--part", "predict", "--prompts", "spec-bench", "--limit", "40", "--work", str(work),
                       "--engine-results", "no-such-results-file")
    assert out.returncode == 2 and "no such results" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not work.exists()


def test_the_default_shape_is_checked_beside_the_champion_and_an_unknown_setting_is_refused():
    """The plugin at SGLang's default shape gets its own marks (``default_``), and SGLang's tree and the plugin
    there each get theirs, independent of the champion's; ``--settings`` names only known settings."""
    pred = {"plugin_gain": 0.02, "plugin_gain_low": 0.01, "plugin_gain_high": 0.03, "plugin_gain_run_low": -0.01,
            "plugin_gain_run_high": 0.05, "draft_low": 1.6, "draft_high": 1.7, "plugin_low": 1.62, "plugin_high": 1.72}
    engine = {"t0": {"sglang_default": {"accept_length": 1.65}, "plugin_default": {"accept_length": 1.75},
                     "plugin_default_gain": {"gain": 0.04, "low": 0.0, "high": 0.08}}}
    both = {"predicted": {"sglang_default_t0": pred}, "engine": engine}
    inside_predicted(both)
    fig = both["engine"]["t0"]
    assert fig["default_gain_inside_predicted_interval"] is False  # 0.04 above [0.01, 0.03]
    assert fig["default_gain_inside_predicted_run_interval"] is True  # inside [-0.01, 0.05]
    assert fig["default_predicted_gain_inside_measured_interval"] is True
    assert fig["sglang_default"]["inside_predicted_interval"] and not fig["plugin_default"]["inside_predicted_interval"]
    assert "gain_inside_predicted_interval" not in fig  # the champion's mark: no champion figures here

    assert chosen_settings(None, gain_only=True) == ["champion_b8"]
    assert chosen_settings(None, gain_only=False) == ["sglang_default", "champion_b8"]
    assert chosen_settings("sglang_default", gain_only=True) == ["sglang_default"]
    with pytest.raises(ValueError, match="b16 is not one of"):
        chosen_settings("sglang_default,b16", gain_only=False)
