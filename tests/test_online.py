"""Online strategies: exactness of every lossless strategy, sampled law, root-pass KV reuse, --compare scoring."""

import numpy as np
import pytest
import torch

from specrank.decode.config import DecodeConfig
from specrank.decode.engine.timer import Timer
from specrank.decode.strategies import STRATEGIES, DraftSelection, RootDrawSelection, StrategyError, make_strategy
from specrank.decode.runs.measure import Measure
from decode_helpers import decode_prompt_online
from specrank.decode.core import PoolShape
from decode_helpers import PROMPT, DrafterRowDraw, greedy_reference, sampled_pvalue, tiny_pair

SHAPE = PoolShape(4, 4, 4)  # 4 + 16 + 16 + 16 = 52 candidates


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.mark.parametrize("strategy, budget", [(r, 8) for r in sorted(STRATEGIES)]
                         + [(r, 3) for r in ("root", "root_draw", "pearl", "covering")])
def test_greedy_text_equals_target_greedy_and_realized_equals_expected(pair, strategy, budget):
    target, drafter = pair
    config = DecodeConfig(SHAPE, budget=budget, extra=0, max_new_tokens=32)
    timer = Timer()
    out, records = decode_prompt_online(target, drafter, PROMPT, config, make_strategy(strategy), timer=timer)
    assert out == greedy_reference(target, PROMPT, 32)
    realized = np.array([r["realized"] for r in records], float)
    expected = np.array([r["expected"] for r in records], float)
    if strategy != "covering":  # greedy: the tree's value is the count of its nodes on the greedy path
        np.testing.assert_array_equal(realized, expected)
    root_passes = STRATEGIES[strategy].needs_root_pass
    assert timer.passes <= len(records) * (1 + root_passes)
    if strategy == "draft":  # nothing but root + tree is scored without --compare / recording
        assert all(r["n_scored"] == budget + 1 for r in records) and timer.passes == len(records)


def test_root_pass_kv_is_reused_not_recomputed(pair):
    """Tree passes exclude the root: the target sees each root once (root pass) and the cache never
    holds a duplicate position."""
    target, drafter = pair
    seen = []
    forward = target.forward

    def spy(ids, pos, mask, cache, layers=None, **kwargs):
        seen.append((ids.tolist(), pos.tolist(), cache.get_seq_length()))
        return forward(ids, pos, mask, cache, layers, **kwargs)

    target.forward = spy
    try:
        config = DecodeConfig(SHAPE, budget=6, extra=0, max_new_tokens=20)
        _, records = decode_prompt_online(target, drafter, PROMPT, config, RootDrawSelection())
    finally:
        del target.forward
    calls = seen[1:]  # after the prefill: a root pass, then a tree pass unless skipped, per round
    root_passes = [ids[0] for ids, _, _ in calls if len(ids) == 1]  # a tree pass holds >= 2 nodes or is skipped
    assert root_passes == [r["root_token"] for r in records]
    for ids, pos, past in calls:  # a tree pass re-scoring the root would hold position past - 1
        assert min(pos) >= past


def test_compare_scores_other_trees_without_changing_verified_rows(pair):
    target, drafter = pair
    config = DecodeConfig(SHAPE, budget=5, extra=0, max_new_tokens=32)
    plain_out, plain = decode_prompt_online(target, drafter, PROMPT, config, DraftSelection())
    strategies = ("draft", "root", "root_draw", "pearl")
    out, measured = decode_prompt_online(target, drafter, PROMPT, config, DraftSelection(), measure=Measure(strategies))
    assert out == plain_out and len(measured) == len(plain)
    worst = 0.0
    for a, b in zip(plain, measured):
        known = ~np.isnan(a["p_edge"])  # edges at rows of the root and the verified tree
        worst = max(worst, float(np.abs(a["p_edge"][known] - b["p_edge"][known]).max()))
        assert b["n_scored"] > a["n_scored"] or b["n_scored"] == a["n_scored"] == 6
        assert b["expected_draft"] == pytest.approx(b["expected"])  # the decoder's own tree, two ways
        assert all(np.isfinite(b[f"expected_{r}"]) for r in strategies)
    assert worst < 1e-5
    assert not any(k.startswith("expected_") for k in plain[0])


def test_sampled_first_tokens_follow_target_law_and_wrong_draw_fails():
    target, drafter = tiny_pair(vocab=32, hidden_size=16, num_layers=1, seed=2, scale=0.5)
    for strategy in ("root_draw", "root", "covering"):  # PEARL-style shares root-draw's forced first draw
        assert sampled_pvalue(target, drafter, make_strategy(strategy)) > 1e-3, strategy
    assert sampled_pvalue(target, drafter, DrafterRowDraw()) < 1e-4


def test_unknown_rule_and_missing_reranker_are_one_line_errors():
    with pytest.raises(StrategyError, match="unknown strategy 'best'"):
        make_strategy("best")
    with pytest.raises(StrategyError, match="needs a reranker"):
        make_strategy("reranked")


def test_recording_draft_round_reproduces_the_recorder(pair):
    """With recording on, the online round of draft selection scores and records exactly what the
    recording loop does (same scored set, same columns), so one round function can serve both."""
    from specrank.decode.runs.recorder import record_prompt as decode_prompt

    target, drafter = pair
    config = DecodeConfig(SHAPE, budget=6, extra=10, temperature=1.0, max_new_tokens=24, seed=5)
    out_a, rec_a = decode_prompt(target, drafter, PROMPT, config, prompt_id="p")
    out_b, rec_b = decode_prompt_online(target, drafter, PROMPT, config, DraftSelection(), prompt_id="p",
                                        measure=Measure(record=True))
    assert out_a == out_b and len(rec_a) == len(rec_b)
    for a, b in zip(rec_a, rec_b):
        for key, value in a.items():
            if isinstance(value, str):
                assert b[key] == value
                continue
            np.testing.assert_allclose(np.asarray(b[key], float), np.asarray(value, float), rtol=0, atol=1e-6,
                                       err_msg=key)
