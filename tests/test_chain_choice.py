"""A chain's first token chosen by specrank: the fan pool, the rules scored on it, the ranking reranker and the
tree-config command's chain choices."""

import json

import numpy as np
import pandas as pd
import pytest

from specrank.decode import Decoder, PoolShape, StaticTreeSelection
from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShapeError
from specrank.decode.runs import record_prompt, rounds_table
from specrank.experiments.tree_config.chain_choice import (
    ChainChoice,
    choice_seconds,
    choice_table,
    chain_values,
    score_choice,
)
from specrank.engines.tree_settings import TreeConfigError
from specrank.featurize import featurize_rounds
from specrank.featurize.synthetic import synthetic_rounds
from specrank.rerankers import GBMReranker
from specrank.selection import PoolBatch
from decode_helpers import PROMPT, tiny_pair


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(scale=0.05, seed=4)


def test_a_fan_shape_counts_its_chains_and_says_children_only_when_set():
    fan = PoolShape(4, 3, 4, children=1)
    assert fan.level_sizes() == ([4, 4, 4], [4, 4, 0]) and fan.size == 12
    assert PoolShape(4, 3, 2).size == 4 + 16 + 8  # children default to topk
    assert PoolShape(4, 3, 2).as_manifest() == {"topk": 4, "depth": 3, "expand": 2}
    assert fan.as_manifest() == {"topk": 4, "depth": 3, "expand": 4, "children": 1}
    with pytest.raises(PoolShapeError, match="children"):
        PoolShape(4, 3, 4, children=-1)


def test_a_fan_holds_the_drafters_greedy_chain_below_each_first_token(pair):
    """Each chain of the fan is what the drafter's argmax drafts below that first token: the first child of every
    node of a pool that expands every node with all its children."""
    from specrank.selection.static_tree import StaticTree, static_columns

    target, drafter = pair
    config = DecodeConfig(PoolShape(4, 3, 4, children=1), budget=3, extra=0)
    records = record_prompt(target, drafter, PROMPT, config, "0", strategy=StaticTreeSelection(StaticTree((1, 1, 1))))[1]
    fan = PoolBatch.from_frame(rounds_table(records, 12, 4).to_pandas())
    full_config = DecodeConfig(PoolShape(4, 3, 16), budget=3, extra=0)
    full_records = record_prompt(target, drafter, PROMPT, full_config, "0",
                                 strategy=StaticTreeSelection(StaticTree((1, 1, 1))))[1]
    full = PoolBatch.from_frame(rounds_table(full_records, 4 + 16 + 64, 4).to_pandas())
    assert [r["position"] for r in records] == [r["position"] for r in full_records]  # the same chain verified
    tree = StaticTree((4, 1, 1))
    a, _ = static_columns(tree, fan.parent)
    b, _ = static_columns(tree, full.parent)
    for name in ("token", "q_edge", "p_edge"):
        x, y = np.take_along_axis(getattr(fan, name), a, 1), np.take_along_axis(getattr(full, name), b, 1)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=name)


def fan_recorded(pair, k, temperature, seed=0, tokens=24, first=4):
    target, drafter = pair
    choice = ChainChoice(k, first, 2)
    config = DecodeConfig(PoolShape(*choice.fan_shape), budget=k, extra=0, temperature=temperature,
                          max_new_tokens=tokens, seed=seed)
    records = record_prompt(target, drafter, PROMPT, config, "0", strategy=StaticTreeSelection(choice.chain))[1]
    frame = rounds_table(records, config.shape.size, first).to_pandas()
    return choice, records, PoolBatch.from_frame(frame)


def test_the_drafters_chain_on_a_fan_is_vllms_chain_round_by_round(pair):
    """Greedy: the fan's draft rule predicts exactly what a decoder of vLLM's chain accepts each round, and root
    selection at the choice never accepts less."""
    target, drafter = pair
    choice, records, fan = fan_recorded(pair, 3, 0.0)
    score = score_choice(choice, fan, "greedy")
    chain = Decoder(target, drafter, "draft", budget=3, shape=PoolShape(1, 3, 1)).generate(PROMPT, max_new_tokens=24)
    assert score.accepted["draft"].tolist() == chain.stats.accepted == [r["accepted"] for r in records]
    assert (score.accepted["root"] >= score.accepted["draft"]).all()
    assert score.accepted["root"].sum() > score.accepted["draft"].sum()  # the tiny drafter is often wrong


def hand_fan(rounds: int = 1) -> PoolBatch:
    """Three first tokens, each with a chain of 2 (K = 3, k = 2), one round a prompt; pool order: level 1, then
    level 2."""
    def rows(a):
        return np.repeat(np.array([a]), rounds, axis=0)

    return PoolBatch(
        token=rows([10, 11, 12, 20, 21, 22]), parent=rows([-1, -1, -1, 0, 1, 2]), depth=rows([1, 1, 1, 2, 2, 2]),
        q_edge=rows([0.5, 0.3, 0.2, 0.1, 0.9, 0.5]), draft_logp=np.log(rows([0.5, 0.3, 0.2, 0.05, 0.27, 0.1])),
        p_edge=rows([0.2, 0.35, 0.4, 0.5, 1.0, 0.0]), p_argmax_child=rows([0, 0, 1, 1, 1, 0]),
        prompt_id=np.array(["a", "b", "c"][:rounds])).validate()


def test_each_rule_picks_its_first_token_and_takes_that_chains_exact_value():
    pool = hand_fan()
    values, _ = chain_values(pool, "sampling", 2)
    np.testing.assert_allclose(values, [[0.2 + 0.1, 0.35 + 0.35, 0.4 + 0.0]])
    first = np.array([[0.1, 0.3, 0.5]])  # the reranker prefers token 12 ...
    ranking = np.array([[0.0, 1.0, 0.2]])  # ... the ranking reranker token 11
    score = score_choice(ChainChoice(2, 3, 2), pool, "sampling", first, ranking)
    got = {rule: float(v[0]) for rule, v in score.accepted.items()}
    # draft: token 10; root: argmax p = token 12 (0.4), whose chain dies; reranked: token 12 too; best_chain: the
    # top 2 by r (12, 11) estimated 0.5 (1 + 0.5) = 0.75 against 0.3 (1 + 0.9) = 0.57: token 12
    assert got == pytest.approx({"draft": 0.3, "root": 0.4, "reranked": 0.4, "best_chain": 0.4, "ranking": 0.7})
    assert score.first["ranking"][0] == pytest.approx(0.35)
    # with the drafter's deeper factor of token 11 higher, best of 2 switches to the longer chain
    score = score_choice(ChainChoice(2, 3, 2), pool, "sampling", np.array([[0.1, 0.45, 0.5]]))
    assert score.accepted["best_chain"][0] == pytest.approx(0.7) and score.accepted["reranked"][0] == pytest.approx(0.4)
    # greedy: the argmax chain (token 12) accepts one token, token 11's chain none
    greedy = score_choice(ChainChoice(2, 3, 1), pool, "greedy", first)
    assert greedy.accepted["root"][0] == 1 and greedy.accepted["draft"][0] == 0
    with pytest.raises(TreeConfigError, match="drafted_chains 4 exceeds"):
        ChainChoice(2, 3, 4)


def test_the_choice_table_shares_root_selections_gain_and_prices_the_plugin():
    c = ChainChoice(2, 3, 2)
    first = np.array([[0.1, 0.6, 0.5]] * 2)  # token 11: 0.7 against root's 0.4 and draft's 0.3
    score = score_choice(c, hand_fan(2), "sampling", first)
    seconds = choice_seconds(c, {(1, 2, 1): 0.010, (2, 2, 2, 1): 0.012}, 0.050, 0.001)
    assert seconds[(c.label, "best_chain")] == pytest.approx(0.063) and seconds[(c.label, "root")] == pytest.approx(0.06)
    table = choice_table([score], seconds, n_boot=50).set_index("rule")
    assert table.loc["reranked", "share_pct"] == pytest.approx(400.0)  # (0.7 - 0.3) / (0.4 - 0.3)
    assert table.loc["reranked", "first_acceptance"] == pytest.approx(0.35)
    assert table.loc["draft", "speed_over_draft"] == 1.0
    assert table.loc["reranked", "tokens_per_s"] == pytest.approx(1.7 / 0.061)


@pytest.fixture(scope="module")
def synthetic():
    return featurize_rounds(*synthetic_rounds(16, 20, topk=6, depth=3, expand=4, seed=7))


def top1(pred, features) -> float:
    frame = features.assign(pred=pred)
    best = frame.loc[frame.groupby(["prompt_id", "round"])["pred"].idxmax()]
    return float(best["label"].mean())


def test_a_lambdarank_reranker_orders_rounds_better_than_the_draft_and_a_shuffled_label_does_not(synthetic):
    params = dict(n_estimators=60, num_leaves=7, min_child_samples=5, n_jobs=1, features="rows")
    prompts = np.unique(synthetic["prompt_id"].astype(str))
    half = synthetic["prompt_id"].astype(str).isin(prompts[::2]).to_numpy()
    train, test = synthetic[half], synthetic[~half]
    ranked = GBMReranker(objective="lambdarank", **params).fit(train)
    pred = ranked.predict(test)
    assert ((pred >= 0) & (pred <= 1)).all()
    shuffled = train["label"].sample(frac=1.0, random_state=0).to_numpy()
    control = GBMReranker(objective="lambdarank", **params).fit(train, shuffled)
    learned, drafted, blind = top1(pred, test), top1(test["q"].to_numpy(), test), top1(control.predict(test), test)
    assert learned >= drafted - 0.02 and learned > blind
    with pytest.raises(ValueError, match="lambdarank"):
        GBMReranker(objective="lambdarank", backend="sklearn").fit(train)


def tiny_command(tmp_path, out) -> list[str]:
    from specrank.testing import save_tiny_llama

    tgt = save_tiny_llama(tmp_path / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(tmp_path / "drf", seed=0, vocab_size=128, num_layers=2)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(["the cat is big", "write code", "what is the sun", "a dog"])))
    return ["tree-config", "--target", str(tgt), "--drafter", f"standalone:{drf}", "--prompts", str(prompts),
            "--topk", "1", "--num-steps", "1", "--num-draft-tokens", "2", "--vllm-tokens", "2",
            "--vllm-choices", "3", "--drafted-chains", "2", "--max-new-tokens", "8", "--repeats", "1",
            "--bootstrap", "50", "--threads", "1", "--out", str(out), "--no-tracking"]


def test_the_command_scores_chain_choices_and_refuses_bad_ones_before_any_model_loads(tmp_path, capsys):
    from specrank.cli import main

    out = tmp_path / "out"
    assert main(tiny_command(tmp_path, out)) == 0
    table = pd.read_parquet(out / "tree_config_choices.parquet")
    assert set(table["rule"]) == {"draft", "root", "reranked", "best_chain", "ranking"}
    assert (table["choice"] == "k2-choose3-m2").all() and (table["tokens_per_s"] > 0).all()
    assert "chains whose first token specrank chooses" in capsys.readouterr().out
    manifest = json.loads((out / "recordings" / "fan-topk3-depth2" / "manifest.json").read_text())
    assert manifest["pool_shape"] == {"topk": 3, "depth": 2, "expand": 3, "children": 1}
    bad = tiny_command(tmp_path, tmp_path / "bad")
    bad[bad.index("--drafted-chains") + 1] = "4"
    assert main(bad) == 2
    assert "drafted_chains 4 exceeds first_choices 3" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
