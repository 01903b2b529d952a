"""Engine tree settings scored on recorded rounds: the SGLang / EAGLE / vLLM conventions on hand-worked cases,
exactness against specrank's own Decoder (greedy round by round, sampled as a law with an off-by-one
negative control), and refusal of trees outside the recorded pool."""

import json
import re

import numpy as np
import pytest
from scipy.stats import chisquare

from specrank.decode import Decoder, PoolShape
from specrank.decode.config import DecodeConfig
from specrank.decode.runs import record_prompt, rounds_table
from specrank.engines.sglang.beam import beam_subpool, eagle_setting, sglang_setting, tree_grid
from specrank.engines.tree_settings import TreeConfigError, TreeSetting
from specrank.engines.vllm.token_trees import vllm_chain
from specrank.experiments.tree_config.recording_plan import recording_plan
from specrank.experiments.tree_config.setting_scores import score_setting
from specrank.experiments.tree_config.setting_table import position_table, setting_table
from specrank.selection import PoolBatch
from decode_helpers import PROMPT, tiny_pair


def test_engine_conventions_name_one_tree():
    s = sglang_setting(2, 3, 6)  # topk 2, 3 steps: 2 + 4 + 4 candidates, 5 of them verified beside the root
    assert (s.budget, s.candidates) == (5, 10)
    assert ("--speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 6"
            in s.sglang_flags())
    assert eagle_setting(2, 2, 6) == s and s.eagle_arguments() == "top_k=2, depth=2, total_token=6"
    chain = vllm_chain(3)
    assert chain == TreeSetting(1, 3, 4) and chain.budget == 3
    assert json.loads(chain.vllm_config("h")) == {"method": "eagle3", "model": "h", "num_speculative_tokens": 3}
    assert s.vllm_config() is None  # vLLM has no dynamic tree
    TreeSetting(2, 2, 7)  # 6 candidates + the root
    for bad, field in (((2, 2, 8), "num_draft_tokens 8"), ((1, 3, 5), "topk 1"), ((0, 2, 3), "topk"),
                       ((2, 2, 1), "num_draft_tokens")):
        with pytest.raises(TreeConfigError, match=field):
            TreeSetting(*bad)
    grid = tree_grid([1, 2], [2, 3], [4, 8])
    assert [g.label for g in grid] == ["k1-s2-n3", "k1-s3-n4", "k2-s2-n4", "k2-s3-n4", "k2-s3-n8"]
    assert {name: (r.topk, r.depth, r.expand) for name, r in recording_plan(grid).items()} == {
        "topk1-depth2": (1, 2, 1), "topk1-depth3": (1, 3, 1), "topk2-depth3": (2, 3, 2)}


def hand_pool():
    """One recorded round, topk 2, depth 3, expand 1: at depth 2 only candidate 4 (cumulative 0.27) grew."""
    q = np.array([0.6, 0.3, 0.4, 0.3, 0.9, 0.05, 0.5, 0.2])
    parent = np.array([-1, -1, 0, 0, 1, 1, 4, 4])
    depth = np.array([1, 1, 2, 2, 2, 2, 3, 3])
    logp = np.log(q)
    for j in range(2, 8):
        logp[j] += logp[parent[j]]
    p = np.array([0.5, 0.2, 0.8, 0.1, 0.6, 0.1, 0.3, 0.3])
    argmax = np.array([1, 0, 1, 0, 1, 0, 0, 0])
    arrays = dict(token=np.arange(8), parent=parent, depth=depth, q_edge=q.astype(np.float32),
                  draft_logp=logp.astype(np.float32), p_edge=p.astype(np.float32), p_argmax_child=argmax)
    return PoolBatch(**{k: v[None] for k, v in arrays.items()}, prompt_id=np.array(["a"])).validate()


def test_a_hand_worked_beam_and_a_tree_outside_the_recorded_pool():
    pool = hand_pool()
    chain, contained = beam_subpool(pool, 1, 2)  # the argmax chain: candidates 0 then 2
    assert contained.all() and chain.token.tolist() == [[0, 2]]
    sc = score_setting(pool, "sampling", TreeSetting(1, 2, 3))
    assert sc.accepted["draft"] == pytest.approx([0.5 + 0.5 * 0.8])  # p(x1) + p(x1) p(x2 | x1)
    assert sc.positions[0] == pytest.approx([0.5, 0.4])
    assert score_setting(pool, "greedy", TreeSetting(1, 2, 3)).accepted["draft"].tolist() == [2.0]
    # topk 2, 3 steps: the beam expands candidates 4 and 2 at depth 2, the recording only 4: never scored
    sub, contained = beam_subpool(pool, 2, 3)
    assert sub is None and not contained.any()
    sc = score_setting(pool, "sampling", TreeSetting(2, 3, 4))
    assert sc.outside == 1 and sc.accepted["draft"].size == 0
    ok = score_setting(pool, "sampling", TreeSetting(2, 2, 4))  # top 3 by draft: 0 (0.6), 1 (0.3), 4 (0.27)
    assert ok.accepted["draft"] == pytest.approx([0.5 + 0.2 + 0.2 * 0.6])
    table = setting_table([ok, sc], n_boot=20)
    flagged = table.set_index("setting").loc["k2-s3-n4"]
    assert flagged["status"].startswith("flagged") and flagged["rank"] == 0 and np.isnan(flagged["draft_length"])
    assert table.set_index("setting").loc["k2-s2-n4", "draft_length"] == pytest.approx(1.82)
    with pytest.raises(TreeConfigError, match="outside the recorded pool"):
        beam_subpool(pool, 3, 2)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(scale=0.05, seed=4)


def recorded(pair, shape, budget, temperature, seed=0, tokens=24):
    target, drafter = pair
    config = DecodeConfig(shape, budget=budget, extra=0, temperature=temperature, max_new_tokens=tokens, seed=seed)
    records = record_prompt(target, drafter, PROMPT, config, "0")[1]
    frame = rounds_table(records, shape.size, shape.topk).to_pandas()
    return records, PoolBatch.from_frame(frame)


def engine_shape(s: TreeSetting) -> PoolShape:
    return PoolShape(s.topk, s.num_steps, s.topk)


def test_greedy_prediction_equals_the_decoder_round_by_round(pair):
    target, drafter = pair
    s = sglang_setting(2, 3, 5)
    records, pool = recorded(pair, engine_shape(s), s.budget, 0.0)
    predicted = score_setting(pool, "greedy", s).accepted["draft"]
    out = Decoder(target, drafter, "draft", budget=s.budget, shape=engine_shape(s)).generate(PROMPT, max_new_tokens=24)
    assert predicted.tolist() == out.stats.accepted == [r["accepted"] for r in records]
    # the same tree read out of a larger recording (topk 3, depth 4): identical wherever a round starts at the
    # same position (greedy: the same context)
    big_records, big = recorded(pair, PoolShape(3, 4, 3), 6, 0.0)
    sub, contained = beam_subpool(big, s.topk, s.num_steps)
    from_big = score_setting(big, "greedy", s).accepted["draft"]
    small_sub, _ = beam_subpool(pool, s.topk, s.num_steps)
    at = {r["position"]: i for i, r in enumerate(records)}
    shared = [(at[r["position"]], j) for j, r in enumerate(big_records) if r["position"] in at and contained[j]]
    assert len(shared) >= 3
    held = np.flatnonzero(contained).tolist()  # rows of the sub-pool: the rounds that hold the tree
    for i, j in shared:
        assert from_big[held.index(j)] == predicted[i]
        assert (sub.token[held.index(j)] == small_sub.token[i]).all()


def accepted_law(positions: np.ndarray) -> np.ndarray:
    """(R, s + 1) probability of accepting exactly j draft tokens, from P(>= d) per position."""
    ge = np.concatenate([np.ones((len(positions), 1)), positions, np.zeros((len(positions), 1))], axis=1)
    return ge[:, :-1] - ge[:, 1:]


def pooled_test(observed_counts, law):
    expected = law.sum(axis=0)
    obs = np.bincount(observed_counts, minlength=law.shape[1]).astype(float)
    keep = expected >= 5
    e = np.append(expected[keep], expected[~keep].sum())
    o = np.append(obs[keep], obs[~keep].sum())
    if e[-1] == 0:
        e, o = e[:-1], o[:-1]
    return chisquare(o, e * o.sum() / e.sum()).pvalue


def test_sampled_acceptance_matches_the_decoder_and_an_off_by_one_budget_fails(pair):
    target, drafter = pair
    s = sglang_setting(4, 2, 3)  # 2 draft tokens beside the root; the wrong convention verifies 3
    wrong = sglang_setting(4, 2, 4)
    realized, laws, wrong_laws = [], [], []
    for seed in range(100):
        records, pool = recorded(pair, engine_shape(s), s.budget, 0.7, seed=seed, tokens=16)
        if seed < 3:  # the recorder decodes exactly as the Decoder does at that seed
            out = Decoder(target, drafter, "draft", budget=s.budget, shape=engine_shape(s)).generate(
                PROMPT, max_new_tokens=16, temperature=0.7, seed=seed, prompt_id="0")
            assert out.stats.accepted == [r["accepted"] for r in records]
        realized += [r["accepted"] for r in records]
        laws.append(accepted_law(score_setting(pool, "sampling", s).positions))
        wrong_laws.append(accepted_law(score_setting(pool, "sampling", wrong).positions))
    realized = np.array(realized)
    assert len(realized) >= 900
    assert pooled_test(realized, np.concatenate(laws)) > 1e-3
    assert pooled_test(realized, np.concatenate(wrong_laws)) < 1e-6
    table = position_table([score_setting(pool, "sampling", s)])
    assert table["position"].tolist() == [1, 2] and (table["acceptance_rate"].diff().dropna() <= 1e-12).all()


def tiny_command(tmp_path, out, num_draft_tokens: str) -> list[str]:
    """``specrank tree-config`` on a tiny random target and drafter, 4 prompts, topk 1 and 2 at 2 steps."""
    from specrank.testing import save_tiny_llama

    tgt = save_tiny_llama(tmp_path / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(tmp_path / "drf", seed=0, vocab_size=128, num_layers=2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(["the cat is big", "write code", "what is the sun", "a dog"])))
    return ["tree-config", "--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts),
            "--topk", "1,2", "--num-steps", "2", "--num-draft-tokens", num_draft_tokens, "--max-new-tokens", "6",
            "--reranker", "none", "--repeats", "1", "--bootstrap", "50", "--threads", "1", "--out", str(out),
            "--no-tracking"]


def test_the_command_end_to_end_on_tiny_models(tmp_path, capsys):
    """The whole command, cost model included: recordings, ranked table, flags, timings on this device."""
    import pandas as pd

    from specrank.cli import main

    out = tmp_path / "out"
    rc = main(tiny_command(tmp_path, out, "3,4"))
    assert rc == 0
    table = pd.read_parquet(out / "tree_config_table.parquet")
    assert len(table) == 3 and (table["outside"] == 0).all()  # k1-s2-n3, k2-s2-n3, k2-s2-n4
    assert (table["draft_length"] >= 1).all() and (table["tokens_per_s"] > 0).all()
    assert "--speculative-num-draft-tokens" in capsys.readouterr().out


def test_the_command_scores_a_vllm_static_tree_on_its_own_recording(tmp_path, capsys):
    import pandas as pd

    from specrank.cli import main

    out = tmp_path / "out"
    argv = tiny_command(tmp_path, out, "3")
    argv[argv.index("--topk") + 1] = "1"
    tree = ["--vllm-tree", "[(0,), (1,), (0, 0), (1, 0)]"]
    assert main(argv + tree) == 2  # current vLLM (0.21.0 on, after its PR #42121) drafts no static tree
    assert "drafts no static tree" in capsys.readouterr().err
    assert main(argv + tree + ["--vllm-version", "0.21.0"]) == 2 and not out.exists()
    assert main(argv + tree + ["--vllm-version", "latest"]) == 2
    rc = main(argv + tree + ["--vllm-version", "0.20.2"])
    assert rc == 0
    table = pd.read_parquet(out / "tree_config_table.parquet").set_index("setting")
    assert sorted(table.index) == ["k1-s2-n3", "vllm-tree-2x1"] and (table["outside"] == 0).all()
    static = table.loc["vllm-tree-2x1"]
    assert static["num_draft_tokens"] == 5 and static["sglang_flags"] == "" and static["tokens_per_s"] > 0
    assert json.loads(static["vllm_config"])["speculative_token_tree"] == "[(0,), (1,), (0, 0), (1, 0)]"
    assert sorted(p.name for p in (out / "recordings").iterdir()) == ["full-topk3-depth2", "topk1-depth2"]
    cost = pd.read_parquet(out / "tree_config_cost.parquet")
    assert ((cost["part"] == "draft") & (cost["topk"] == 2) & (cost["expand"] == 2)).any()
    summary = json.loads((out / "summary.json").read_text())
    assert "speculative_token_tree" in summary["best_vllm"]["flags"]["vllm"] or \
        summary["best_vllm"]["setting"] == "k1-s2-n3"
    printed = capsys.readouterr().out
    assert "best vllm" in printed
    assert main(argv + ["--vllm-tree", "[(0,), (1,), (0, 0)]", "--vllm-version", "0.20.2", "--out",
                        str(tmp_path / "x")]) == 2


def test_a_run_stopped_after_its_recordings_resumes_them(tmp_path, monkeypatch):
    """A tree-config that dies after recording (here in the cost model) leaves its recordings in --out and nothing
    else; the same command then reuses every recorded shard and writes the outputs."""
    import pandas as pd

    import specrank.experiments.tree_config.configure as measured
    from specrank.cli import main

    out = tmp_path / "out"
    argv = tiny_command(tmp_path, out, "3")
    real = measured.measure_cost

    def dies(*args, **kwargs):
        raise KeyboardInterrupt  # as a Ctrl-C would, once every recording is done

    monkeypatch.setattr(measured, "measure_cost", dies)
    assert main(argv) == 130  # the CLI's Ctrl-C exit
    shards = {f: f.stat().st_mtime_ns for f in out.glob("recordings/*/rounds/*.parquet")}
    assert len(shards) == 2 and not (out / "tree_config_table.parquet").exists()  # one shard per recording
    assert sorted(p.name for p in out.iterdir()) == ["recordings"]  # no partial outputs, no stage left behind
    monkeypatch.setattr(measured, "measure_cost", real)
    assert main(argv) == 0
    assert {f: f.stat().st_mtime_ns for f in out.glob("recordings/*/rounds/*.parquet")} == shards  # reused
    assert len(pd.read_parquet(out / "tree_config_table.parquet")) == 2


def test_recordings_of_another_run_in_out_are_refused_before_any_model_loads(tmp_path, monkeypatch, capsys):
    import specrank.decode.loading.model_spec as model_spec
    from specrank.cli import main

    out = tmp_path / "out"
    argv = tiny_command(tmp_path, out, "3")
    assert main(argv) == 0
    capsys.readouterr()

    def no_models(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(model_spec, "load_target", no_models)
    longer = argv[:argv.index("--max-new-tokens") + 1] + ["7"] + argv[argv.index("--max-new-tokens") + 2:]
    assert main(longer) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "recordings/topk1-depth2 holds a different run (differs in: max_new_tokens)" in err


def test_vllm_static_trees_are_read_as_vllm_drafts_them():
    from specrank.engines.tree_settings import StaticTreeSetting
    from specrank.engines.vllm.token_trees import vllm_tree
    from specrank.selection import StaticTree, StaticTreeError

    tree = StaticTree.from_choices("[(0,), (1,), (0, 0), (1, 0)]")
    assert tree.branching == (2, 1) and tree.size == 4 and tree.widths == (2, 2)
    assert tree.choices == [(0,), (1,), (0, 0), (1, 0)] and tree.parents.tolist() == [-1, -1, 0, 1]
    # vLLM drafts the top child of each node whatever the last index labels it: the same tree
    assert StaticTree.from_choices([(1,), (0,), (1, 1), (0, 0)]) == tree
    assert StaticTree.from_choices("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]").branching \
        == (3, 2)
    for bad, why in (("[(0,), (1,), (0, 0)]", "variable branching at depth 1"), ("[(0,), (0, 0, 0)]", "no parent"),
                     ("[(0,), (0,)]", "distinct"), ("[]", "non-empty"), ("trees", "not a list"),
                     ("[(0,), (-1,)]", ">= 0")):
        with pytest.raises(StaticTreeError, match=re.escape(why)):
            StaticTree.from_choices(bad)
    assert vllm_tree("[(0,), (0, 0), (0, 0, 0)]") == vllm_chain(3)  # single children: the chain
    st = vllm_tree("[(0,), (1,), (0, 0), (1, 0)]")
    assert isinstance(st, StaticTreeSetting) and (st.budget, st.num_draft_tokens, st.num_steps) == (4, 5, 2)
    assert st.sglang_flags() is None and st.draft_shape == (2, 2, 2)
    assert json.loads(st.vllm_config("h")) == {"method": "eagle3", "model": "h", "num_speculative_tokens": 4,
                                               "speculative_token_tree": "[(0,), (1,), (0, 0), (1, 0)]"}
    with pytest.raises(TreeConfigError, match="more than 1024"):
        StaticTreeSetting(StaticTree((8, 8, 8, 8)))
    plan = recording_plan(tree_grid([2], [3], [4]) + [st, vllm_tree("[(0,), (0, 0), (0, 1)]")])
    assert {name: (r.topk, r.depth, r.expand, r.budget) for name, r in plan.items()} == {
        "topk2-depth3": (2, 3, 2, 3), "full-topk3-depth2": (3, 2, 3, 4)}


def test_a_hand_worked_static_tree_and_one_outside_the_recorded_pool():
    from specrank.engines.tree_settings import StaticTreeSetting
    from specrank.selection import StaticTree

    pool = hand_pool()  # both depth-1 candidates expanded, only candidate 4 at depth 2
    sc = score_setting(pool, "sampling", StaticTreeSetting(StaticTree((2, 1))))  # nodes 0, 1, 2, 4
    assert sc.outside == 0
    assert sc.accepted["draft"] == pytest.approx([0.5 + 0.2 + 0.5 * 0.8 + 0.2 * 0.6])
    assert sc.positions[0] == pytest.approx([0.7, 0.52])
    assert sc.accepted["root"] == pytest.approx(sc.accepted["draft"])  # both first tokens are in the tree
    one = StaticTreeSetting(StaticTree((1, 1)))
    chosen = score_setting(pool, "sampling", one, first_factor=np.array([[0.1, 0.9]]))  # reranked: 1, then 4
    assert chosen.accepted["draft"] == pytest.approx([0.5 + 0.5 * 0.8])
    assert chosen.accepted["reranked"] == pytest.approx([0.2 + 0.2 * 0.6])
    outside = score_setting(pool, "sampling", StaticTreeSetting(StaticTree((2, 1, 1))))  # node 2 never grew
    assert outside.outside == 1 and outside.accepted["draft"].size == 0
    table = setting_table([sc, outside], n_boot=20).set_index("setting")
    assert table.loc["vllm-tree-2x1x1", "status"].startswith("flagged")
    assert table.loc["vllm-tree-2x1", "tree"] == "[(0,), (1,), (0, 0), (1, 0)]"
    with pytest.raises(TreeConfigError, match="outside the recorded pool"):
        score_setting(pool, "sampling", StaticTreeSetting(StaticTree((3,))))


def static_recorded(pair, tree, temperature, seed=0, tokens=24):
    """One prompt decoded with vLLM's static tree (every node verified) on a pool expanding every node."""
    from specrank.decode import StaticTreeSelection

    target, drafter = pair
    shape = PoolShape(*tree.full_pool())
    config = DecodeConfig(shape, budget=tree.size, extra=0, temperature=temperature, max_new_tokens=tokens, seed=seed)
    records = record_prompt(target, drafter, PROMPT, config, "0", strategy=StaticTreeSelection(tree))[1]
    return records, PoolBatch.from_frame(rounds_table(records, shape.size, shape.topk).to_pandas())


def test_a_static_tree_greedy_prediction_equals_the_decoder_round_by_round(pair):
    from specrank.decode import StaticTreeSelection, StrategyError
    from specrank.engines.tree_settings import StaticTreeSetting
    from specrank.selection import StaticTree

    target, drafter = pair
    tree = StaticTree((2, 2, 1))
    records, pool = static_recorded(pair, tree, 0.0)
    predicted = score_setting(pool, "greedy", StaticTreeSetting(tree)).accepted["draft"]
    out = Decoder(target, drafter, StaticTreeSelection(tree), budget=tree.size,
                  shape=PoolShape(*tree.full_pool())).generate(PROMPT, max_new_tokens=24)
    plain = Decoder(target, drafter, "draft", budget=1, shape=PoolShape(1, 1, 1)).generate(PROMPT, max_new_tokens=24)
    assert out.tokens == plain.tokens  # lossless: the target's own greedy output
    assert predicted.tolist() == out.stats.accepted == [r["accepted"] for r in records]
    assert max(out.stats.accepted) >= 1
    with pytest.raises(StrategyError, match="does not expand every node"):
        Decoder(target, drafter, StaticTreeSelection(tree), budget=tree.size, shape=PoolShape(2, 3, 2))
    with pytest.raises(StrategyError, match="budget 3"):
        Decoder(target, drafter, StaticTreeSelection(tree), budget=3, shape=PoolShape(*tree.full_pool()))


def test_a_static_tree_sampled_law_matches_the_decoder_and_a_narrower_tree_fails(pair):
    """The law of accepted tokens predicted for the static tree fits the realized counts; the law of a tree
    verifying two first tokens fewer (what a misread ``speculative_token_tree`` would score) must not."""
    from specrank.engines.tree_settings import StaticTreeSetting
    from specrank.selection import StaticTree

    tree, narrower = StaticTree((4, 1)), StaticTreeSetting(StaticTree((2, 1)))
    realized, laws, wrong_laws = [], [], []
    for seed in range(100):
        records, pool = static_recorded(pair, tree, 0.7, seed=seed, tokens=16)
        realized += [r["accepted"] for r in records]
        laws.append(accepted_law(score_setting(pool, "sampling", StaticTreeSetting(tree)).positions))
        wrong_laws.append(accepted_law(score_setting(pool, "sampling", narrower).positions))
    realized = np.array(realized)
    assert len(realized) >= 800
    assert pooled_test(realized, np.concatenate(laws)) > 1e-3
    assert pooled_test(realized, np.concatenate(wrong_laws)) < 1e-6


def test_the_plugin_score_is_sglangs_tree_rescored_by_the_reranker():
    """SGLang with the plugin ranks r(x1) prod g_d(q_d) over the beam it grew by draft scores: with g_d the identity
    it is the reranked score; a per-depth map that reorders the deeper candidates changes the tree it verifies."""
    from specrank.experiments.tree_config.setting_scores import PluginFactors

    pool, setting = hand_pool(), TreeSetting(2, 2, 4)
    first = np.array([[0.2, 0.9]])  # the reranker prefers candidate 1 (draft 0.3) to candidate 0 (draft 0.6)
    reranked = score_setting(pool, "sampling", setting, first).accepted["reranked"]
    identity = PluginFactors(first, lambda depth, q: np.asarray(q, dtype=np.float64))
    plugin = score_setting(pool, "sampling", setting, plugin=identity).accepted["plugin"]
    assert plugin == pytest.approx(reranked)
    # top 3 of 0.9 * q below candidate 1 and 0.2 * q below 0: 1 (0.9), 4 (0.81), 0 (0.2) -> p 0.2 + 0.2 * 0.6 + 0.5
    assert plugin == pytest.approx([0.2 + 0.2 * 0.6 + 0.5])
    flat = PluginFactors(first, lambda depth, q: np.where(np.asarray(q) > 0.5, 0.01, 0.5))  # demotes candidate 4
    moved = score_setting(pool, "sampling", setting, plugin=flat).accepted["plugin"]
    assert moved != pytest.approx(plugin)
    assert "plugin_length" in setting_table([score_setting(pool, "sampling", setting, plugin=identity)], n_boot=20)


def test_the_engine_sees_no_prompt_rows_and_no_task():
    import pandas as pd

    from specrank.featurize.engine import engine_visible

    features = pd.DataFrame({"round": [0, 0, 3, 3], "cache_age": [1.0, 1.0, 2.0, 2.0],
                             "cache_logp": [-1.0, -2.0, -0.5, -3.0], "cache_gap": [0.0, -1.0, 0.0, -2.5],
                             "same_token_logp": [-1.0, -2.0, -0.5, -3.0], "task": pd.Categorical(["qa"] * 4)})
    seen = engine_visible(features)
    assert seen["cache_logp"].isna().tolist() == [True, True, False, False]  # round 0 read the prompt's row
    assert seen["same_token_logp"].tolist() == features["same_token_logp"].tolist()
    assert set(seen["task"].astype(str)) == {""} and set(features["task"].astype(str)) == {"qa"}


def test_engine_timing_is_parsed_and_malformed_ones_name_their_part():
    from specrank.experiments.tree_config.engine_timing import EngineTimingError, parse_engine_timing

    t = parse_engine_timing("plain=25.7, k1=28.8,k4-s3-n8=41")
    assert t.plain_ms == 25.7 and t.measured == (("k1-s1-n2", 28.8), ("k4-s3-n8", 41.0))
    for bad, named in (("k1=28.8", "plain=MS"), ("plain=25", "plain=MS"), ("plain=25,k1=x", "'k1=x'"),
                       ("plain=25,k1=-3", "'k1=-3'"), ("plain=25,top=3", "'top'"), ("plain=25,k1", "'k1'")):
        with pytest.raises(EngineTimingError, match=named):
            parse_engine_timing(bad)


def test_engine_speed_recovers_an_engine_whose_passes_are_ours_scaled_and_a_wrong_scale_misses():
    """An engine whose verify costs a * ours and whose drafting costs b * ours, timed plain and at one chain:
    every other setting's round is predicted exactly. Negative control: timing the chain 20% slow moves every
    prediction."""
    import pandas as pd

    from specrank.decode.runs.cost import CostModel
    from specrank.experiments.tree_config.engine_timing import (
        engine_round_seconds, parse_engine_timing, with_engine_speed,
    )

    settings = [vllm_chain(k) for k in (1, 2, 3, 4)] + [sglang_setting(4, 3, 8)]
    cost = CostModel(draft={s.draft_shape: 0.004 * s.num_steps * s.topk ** 0.5 for s in settings},
                     verify={n: 0.050 + 0.002 * n for n in (1, 2, 3, 4, 5, 8)})
    a, b = 0.4, 0.6
    engine_ms = {s.label: 1000 * (a * cost.verify[s.num_draft_tokens] + b * cost.draft[s.draft_shape])
                 for s in settings}
    timing = parse_engine_timing(f"plain={1000 * a * cost.verify[1]},k2={engine_ms['k1-s2-n3']}")
    predicted = engine_round_seconds(timing, cost, settings)
    for s in settings:
        assert predicted[s.label] == pytest.approx(engine_ms[s.label] / 1000, rel=1e-12)
    slow = parse_engine_timing(f"plain={1000 * a * cost.verify[1]},k2={1.2 * engine_ms['k1-s2-n3']}")
    off = engine_round_seconds(slow, cost, settings)
    assert all(abs(off[s.label] / (engine_ms[s.label] / 1000) - 1) > 0.02 for s in settings)
    table = pd.DataFrame({"setting": [s.label for s in settings], "draft_length": 2.0, "draft_low": 1.5,
                          "draft_high": 2.5})
    table = with_engine_speed(table, predicted, timing).set_index("setting")
    assert table.loc["k1-s4-n5", "engine_tokens_per_s"] == pytest.approx(2000 / engine_ms["k1-s4-n5"])
    assert table.loc["k1-s4-n5", "engine_tokens_per_s_low"] < table.loc["k1-s4-n5", "engine_tokens_per_s_high"]
    assert table["engine_timed"].tolist() == [s.label == "k1-s2-n3" for s in settings]


def test_an_engine_whose_verify_is_flat_in_its_tokens_is_fitted_from_two_timed_steps_and_one_step_cannot():
    """An engine whose verify pass costs its plain step at every width (vLLM's CPU build) and whose drafting costs
    b * ours: timed at two chains, the growth comes out 0 and every setting's round is predicted exactly; timed at
    one, the model keeps specrank's growth and misses the others (the negative control)."""
    from specrank.decode.runs.cost import CostModel
    from specrank.experiments.tree_config.engine_timing import engine_round_seconds, engine_scales, parse_engine_timing

    settings = [vllm_chain(k) for k in (1, 2, 3, 4)] + [sglang_setting(4, 3, 8)]
    cost = CostModel(draft={s.draft_shape: 0.004 * s.num_steps * s.topk ** 0.5 for s in settings},
                     verify={n: 0.050 * (1.5 if n > 1 else 1) + 0.002 * n for n in (1, 2, 3, 4, 5, 8)})
    plain, b = 0.030, 0.7
    engine = {s.label: plain + b * cost.draft[s.draft_shape] for s in settings}
    timing = parse_engine_timing(f"plain={1000 * plain},k1={1000 * engine['k1-s1-n2']},k4={1000 * engine['k1-s4-n5']}")
    scales = engine_scales(timing, cost, settings)
    assert scales.growth == pytest.approx(0, abs=1e-9) and scales.draft == pytest.approx(b)
    predicted = engine_round_seconds(timing, cost, settings)
    for s in settings:
        assert predicted[s.label] == pytest.approx(engine[s.label], rel=1e-9)
    one = engine_round_seconds(parse_engine_timing(f"plain={1000 * plain},k1={1000 * engine['k1-s1-n2']}"), cost,
                               settings)
    assert all(abs(one[s.label] / engine[s.label] - 1) > 0.05 for s in settings if s.label != "k1-s1-n2")
    assert CostModel.from_rows(cost.rows()).round_seconds(settings[-1]) == cost.round_seconds(settings[-1])


def test_an_engine_whose_two_token_pass_costs_more_than_its_three_token_one_is_predicted_from_its_timed_passes():
    """vLLM's CPU build: its pass over 2 tokens costs more than over 3 (oneDNN's 2-row matmul). Timed passes over
    1-5 tokens (nN) and the steps at k = 2..4: k = 1 is predicted exactly, a setting wider than every timed pass is
    not predicted (NaN), and a timed setting that wide is refused. Negative control: the same steps without the
    passes, fitted by the growth model, miss k = 1 by more than 10%."""
    import math

    from specrank.decode.runs.cost import CostModel
    from specrank.experiments.tree_config.engine_timing import (
        EngineTimingError, check_timed_settings, engine_round_seconds, parse_engine_timing,
    )

    settings = [vllm_chain(k) for k in (1, 2, 3, 4)] + [sglang_setting(4, 3, 8)]
    cost = CostModel(draft={s.draft_shape: 0.004 * s.num_steps for s in settings},
                     verify={n: 0.050 + 0.002 * n for n in (1, 2, 3, 4, 5, 8)})
    passes = {1: 50.0, 2: 59.5, 3: 45.0, 4: 43.0, 5: 46.0}  # ms, the engine's forward and logits alone
    plain, b = 57.0, 0.7
    engine_ms = {s.label: plain + passes[s.num_draft_tokens] - passes[1] + 1000 * b * cost.draft[s.draft_shape]
                 for s in settings[:4]}
    steps = ",".join(f"k{k}={engine_ms[vllm_chain(k).label]}" for k in (2, 3, 4))
    widths = ",".join(f"n{n}={ms}" for n, ms in passes.items())
    timing = parse_engine_timing(f"plain={plain},{steps},{widths}")
    assert timing.verify == tuple(passes.items())
    predicted = engine_round_seconds(timing, cost, settings)
    assert predicted["k1-s1-n2"] == pytest.approx(engine_ms["k1-s1-n2"] / 1000, rel=1e-12)
    assert math.isnan(predicted["k4-s3-n8"])
    growth = engine_round_seconds(parse_engine_timing(f"plain={plain},{steps}"), cost, settings)
    assert abs(growth["k1-s1-n2"] / (engine_ms["k1-s1-n2"] / 1000) - 1) > 0.10
    with pytest.raises(EngineTimingError, match="n1"):
        parse_engine_timing(f"plain={plain},{steps},n2=59.5")
    with pytest.raises(EngineTimingError, match="k4-s3-n8 verify more tokens than the widest timed pass n5"):
        check_timed_settings(parse_engine_timing(f"plain={plain},k4-s3-n8=80,{widths}"), settings)


def test_the_command_predicts_an_engines_speed_from_its_timed_steps(tmp_path, capsys):
    import pandas as pd

    from specrank.cli import main

    out = tmp_path / "out"
    # a step 20 ms over plain: room for specrank's timed verify growth however the machine's load skews it (a step
    # 3 ms over plain let a loaded machine's growth exceed it, and the draft scale stopped at 0)
    argv = tiny_command(tmp_path, out, "3,4") + ["--engine-timing", "plain=10,k1-s2-n3=30"]
    assert main(argv) == 0
    table = pd.read_parquet(out / "tree_config_table.parquet").set_index("setting")
    cost = pd.read_parquet(out / "tree_config_cost.parquet")
    assert ((cost["part"] == "verify") & (cost["num_draft_tokens"] == 1)).any()  # the plain step's pass, timed
    assert table.loc["k1-s2-n3", "engine_round_seconds"] == pytest.approx(0.030)  # one timed step: fitted exactly
    assert (table["engine_tokens_per_s"] > 0).all() and table["engine_timed"].sum() == 1
    assert "engine_tokens_per_s" in capsys.readouterr().out


def test_an_engines_steps_and_passes_become_one_engine_timing_that_parses_back_as_they_were_timed():
    """What ``bench_engine_parity.py --part speed`` hands tree-config: vLLM's plain step, its steps at each k and
    its verify passes over n tokens become one ``--engine-timing`` that parses back to the same figures."""
    from specrank.experiments.tree_config.engine_timing import engine_timing_text, parse_engine_timing

    text = engine_timing_text(54.8, {1: 72.3, 2: 59.8}, {1: 57.3, 2: 68.6, 3: 49.6})
    timing = parse_engine_timing(text)
    assert timing.plain_ms == 54.8 and timing.measured == (("k1-s1-n2", 72.3), ("k1-s2-n3", 59.8))
    assert timing.verify == ((1, 57.3), (2, 68.6), (3, 49.6))
    assert parse_engine_timing(engine_timing_text(54.8, {1: 72.3})).verify == ()


def test_the_accepted_tokens_variance_is_that_of_their_exact_distribution():
    """A chain with path probabilities 0.5, 0.25, 0.1 accepts 0..3 tokens with probabilities 0.5, 0.25, 0.15, 0.1;
    a tree (two first-level nodes of 0.4 and 0.3, a child of 0.2 under the first) 0..2 with 0.3, 0.5, 0.2. Greedy
    rows (path probabilities 0 or 1) have none. Negative control: the depths as independent coins
    (sum of p(1 - p)) is another number."""
    from specrank.experiments.tree_config.setting_scores import accepted_variance

    def exact(counts, probs):
        counts, probs = np.asarray(counts, float), np.asarray(probs, float)
        return float(probs @ counts ** 2 - (probs @ counts) ** 2)

    chain = np.array([[0.5, 0.25, 0.1]])
    got = accepted_variance(chain, np.array([1, 2, 3]))
    assert got[0] == pytest.approx(exact([0, 1, 2, 3], [0.5, 0.25, 0.15, 0.1]))
    assert abs(got[0] - float((chain * (1 - chain)).sum())) > 0.1
    tree = np.array([[0.4, 0.3, 0.2]])
    assert accepted_variance(tree, np.array([1, 1, 2]))[0] == pytest.approx(exact([0, 1, 2], [0.3, 0.5, 0.2]))
    assert accepted_variance(np.array([[1.0, 1.0, 0.0]]), np.array([1, 2, 3]))[0] == 0.0


def test_one_sampled_runs_accept_length_falls_in_the_run_interval_as_often_as_its_level_says():
    """Rounds whose accept counts are drawn from known chains: the mean of one simulated engine run lands inside
    ``run_interval`` in about 95% of runs, and inside the expectation's own interval (here exact, zero width, as
    on rounds known to the last digit) almost never: the negative control."""
    from types import SimpleNamespace

    from specrank.experiments.tree_config.setting_scores import accepted_variance
    from specrank.experiments.tree_config.setting_table import run_interval

    rng = np.random.default_rng(0)
    n = 300
    path = np.cumprod(rng.uniform(0.2, 0.8, (n, 3)), axis=1)  # (n, 3) chain path probabilities
    mean = float(path.sum(axis=1).mean())
    exact = SimpleNamespace(point=mean, low=mean, high=mean)
    iv = run_interval("x", exact, [accepted_variance(path, np.array([1, 2, 3]))], 0.95)
    conditional = path / np.concatenate([np.ones((n, 1)), path[:, :-1]], axis=1)  # P(accept d | accepted d - 1)
    runs = 4000
    coins = rng.random((runs, n, 3)) < conditional
    measured = np.cumprod(coins, axis=2).sum(axis=2).mean(axis=1)  # (runs,) each run's mean accepted tokens
    inside = np.mean((iv["x_low"] <= measured) & (measured <= iv["x_high"]))
    assert 0.93 <= inside <= 0.97, inside
    assert np.mean(measured == mean) < 0.01
