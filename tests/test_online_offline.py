"""Online vs offline: realized acceptance against the offline value on the recorded rounds, and the
reranker's online features and predictions against the offline featurizer's on the same rounds."""

import numpy as np
import pytest

from specrank.decode.config import DecodeConfig
from specrank.decode.strategies import RerankedSelection, StrategyError, make_strategy
from decode_helpers import decode_prompt_online
from specrank.decode.core import PoolShape
from specrank.decode.runs.tables import rounds_table
from specrank.featurize import featurize_rounds
from specrank.featurize.edges import edge_frame
from specrank.rerankers import IsotonicFirstFactor
from specrank.selection import PoolBatch, PromptBootstrap, draw_values, fixed_values, score_of, select_top
from specrank.selection import stacked_factors
from decode_helpers import tiny_pair
from online_helpers import CapturingReranked, assert_online_equals_offline, fitted_reranker, recorded

SHAPE = PoolShape(4, 3, 4)  # 4 + 16 + 16 = 36 candidates
PROMPTS = [[2, 5, 7, 16, 25, 19, 3, 2, 6 + i, 30 + 3 * i] for i in range(12)]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(scale=0.05, seed=4)


def _run(target, drafter, strategy, config, prompts=PROMPTS):
    return recorded(target, drafter, strategy, config, prompts)


@pytest.mark.parametrize("name", ["draft", "root_draw"])
def test_realized_acceptance_agrees_with_offline_value_on_recorded_rounds(pair, name):
    target, drafter = pair
    config = DecodeConfig(SHAPE, budget=4, extra=36, temperature=1.0, max_new_tokens=40, seed=1)
    records = _run(target, drafter, make_strategy(name), config)
    table = rounds_table(records, SHAPE.size, SHAPE.topk).to_pandas()
    pool = PoolBatch.from_frame(table)
    if name == "draft":
        offline = fixed_values(pool, score_of(pool, "draft"), [4])[0][:, 0]
    else:
        offline = draw_values(pool, [4])["root_draw"][0][:, 0]
    realized = np.array([r["realized"] for r in records], float)
    assert len(records) >= 150 and not np.isnan(offline).any()
    if name == "draft":  # the fixed tree's conditional value is the offline value, round by round
        np.testing.assert_allclose([r["expected"] for r in records], offline, atol=1e-6)
    gap = PromptBootstrap(table["prompt_id"].to_numpy(), 2000, 0).totals(
        {"realized": realized, "offline": offline}).gain("realized", "offline")
    assert gap.low <= 0.0 <= gap.high, gap
    assert abs(gap.point) < 0.25 * offline.mean()
    shifted = PromptBootstrap(table["prompt_id"].to_numpy(), 2000, 0).totals(  # negative control: the check
        {"realized": realized + 0.3, "offline": offline}).gain("realized", "offline")  # has power
    assert not shifted.low <= 0.0 <= shifted.high


GREEDY = DecodeConfig(SHAPE, budget=4, extra=36, temperature=0.0, max_new_tokens=40)
MANIFEST = {"temperature": 0.0, "topk": SHAPE.topk}


@pytest.fixture(scope="module")
def training_rounds(pair):
    return rounds_table(_run(*pair, make_strategy("draft"), GREEDY, PROMPTS[:6]), SHAPE.size, SHAPE.topk)


@pytest.mark.parametrize("kind,path", [("isotonic", "array lookup"), ("per-depth", "array lookup"),
                                       ("base", "QuickScorer arrays"), ("base", "LightGBM predict"),
                                       ("rows", "QuickScorer arrays"), ("rows", "LightGBM predict"),
                                       ("stacked", "QuickScorer arrays"), ("stacked", "LightGBM predict")])
def test_online_features_predictions_and_trees_equal_offline_on_recorded_rounds(pair, training_rounds, kind, path,
                                                                                 monkeypatch):
    monkeypatch.setenv("SPECRANK_TREES", "lightgbm" if path == "LightGBM predict" else "quickscorer")
    reranker = fitted_reranker(kind, training_rounds, MANIFEST)
    strategy = CapturingReranked(reranker)
    records = _run(*pair, strategy, GREEDY, PROMPTS[6:9])
    assert strategy.compiled.inference.startswith(path)  # prepared once, when the first decode checked it
    kernel = path == "QuickScorer arrays"
    assert (strategy.round_predictor is not None) == kernel  # one kernel call from the round's inputs
    if kernel:  # the decoder's inputs have the types compiled() compiled the kernel for: no compile mid-decode
        trees = getattr(strategy.compiled, "first", strategy.compiled).trees  # a stacked reranker's: its first factor's
        assert len(trees.round_kernel.signatures) == 1
    online_pred = assert_online_equals_offline(strategy, records, GREEDY, MANIFEST)
    assert ("task" in strategy.seen[0][0]) == (kind in ("base", "rows", "stacked"))  # only what the reranker reads
    assert len(np.unique(online_pred)) > 1  # the reranker is not a constant


def test_a_stacked_reranker_decodes_the_rows_plus_per_depth_score_and_its_deeper_factors_matter(pair,
                                                                                                  training_rounds):
    """Decoded online, a stacked reranker selects the trees of the offline "Rows + per-depth" score on its own
    recorded rounds (scores within 1e-12); negative control: without its deeper factors (the Rows score, r(x1)
    prod q_i, with the same first factors) the trees differ, so the check sees them."""
    stacked = fitted_reranker("stacked", training_rounds, MANIFEST)
    strategy = CapturingReranked(stacked)
    assert strategy.deeper
    records = _run(*pair, strategy, GREEDY, PROMPTS[6:9])
    online_pred = assert_online_equals_offline(strategy, records, GREEDY, MANIFEST)
    np.testing.assert_allclose(online_pred, stacked.first_factor_.predict_first_factor(
        featurize_rounds(rounds_table(records, SHAPE.size, SHAPE.topk), MANIFEST, labels=False)), rtol=0, atol=1e-12)
    table = rounds_table(records, SHAPE.size, SHAPE.topk)
    pool = PoolBatch.from_frame(table.to_pandas())
    first = online_pred.reshape(-1, SHAPE.topk)
    deeper = stacked.per_depth_.predict(edge_frame(table, MANIFEST, labels=False)).reshape(pool.shape)
    assert (pool.depth >= 2).any() and len(np.unique(deeper[pool.depth >= 2])) > 1  # the maps are not constant
    trees = np.stack(strategy.trees)
    rows_only = select_top(score_of(pool, "reranked", "greedy", first_factor=first), pool.depth, GREEDY.budget)
    assert (trees != rows_only).any(axis=1).sum() >= 1  # dropping the deeper factors changes the trees
    stacked_score = score_of(pool, "per_depth", "greedy", edge_factor=stacked_factors(pool, first, deeper))
    np.testing.assert_array_equal(trees, select_top(stacked_score, pool.depth, GREEDY.budget))


def test_reranker_for_another_run_is_refused_before_decoding(pair):
    target, drafter = pair
    greedy = DecodeConfig(SHAPE, budget=4, extra=0, temperature=0.0, max_new_tokens=8)
    frame = featurize_rounds(rounds_table(_run(target, drafter, make_strategy("draft"), greedy, PROMPTS[:2]),
                                          SHAPE.size, SHAPE.topk), {"temperature": 0.0, "topk": SHAPE.topk})
    iso = IsotonicFirstFactor(n_bins=4).fit(frame)
    sampling = DecodeConfig(SHAPE, budget=4, extra=0, temperature=1.0, max_new_tokens=8)
    with pytest.raises(StrategyError, match="trained on argmax labels, this run needs probability"):
        decode_prompt_online(target, drafter, PROMPTS[0], sampling, RerankedSelection(iso, "iso.pkl"))
    other = DecodeConfig(PoolShape(3, 3, 3), budget=4, extra=0, temperature=0.0, max_new_tokens=8)
    with pytest.raises(StrategyError, match="topk=4, this run has topk=3"):
        decode_prompt_online(target, drafter, PROMPTS[0], other, RerankedSelection(iso, "iso.pkl"))
    iso.features_ = ["q", "no_such_feature"]
    with pytest.raises(StrategyError, match="feature schema mismatch: unknown feature 'no_such_feature'"):
        decode_prompt_online(target, drafter, PROMPTS[0], greedy, RerankedSelection(iso, "iso.pkl"))
