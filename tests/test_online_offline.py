"""Online vs offline: realized acceptance against the offline value on the recorded rounds, and the
reranker's online features and predictions against the offline featurizer's on the same rounds."""

import numpy as np
import pytest

from specrank.decode.config import DecodeConfig
from specrank.decode.strategies import RerankedSelection, StrategyError, make_strategy
from specrank.decode.runs.measure import Measure
from decode_helpers import decode_prompt_online
from specrank.decode.core import PoolShape
from specrank.decode.runs.tables import rounds_table
from specrank.featurize import featurize_rounds
from specrank.featurize.edges import edge_frame
from specrank.rerankers import GBMReranker, IsotonicFirstFactor, PerDepthCalibration
from specrank.selection import PoolBatch, PromptBootstrap, draw_values, fixed_values, score_of, select_top
from decode_helpers import tiny_pair

SHAPE = PoolShape(4, 3, 4)  # 4 + 16 + 16 = 36 candidates
PROMPTS = [[2, 5, 7, 16, 25, 19, 3, 2, 6 + i, 30 + 3 * i] for i in range(12)]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(scale=0.05, seed=4)


def _run(target, drafter, strategy, config, prompts=PROMPTS):
    records = []
    for i, ids in enumerate(prompts):
        records += decode_prompt_online(target, drafter, ids, config, strategy, prompt_id=f"p{i:02d}", task="t",
                                        measure=Measure(record=True))[1]
    return records


@pytest.mark.parametrize("rule", ["draft", "root_draw"])
def test_realized_acceptance_agrees_with_offline_value_on_recorded_rounds(pair, rule):
    target, drafter = pair
    config = DecodeConfig(SHAPE, budget=4, extra=36, temperature=1.0, max_new_tokens=40, seed=1)
    records = _run(target, drafter, make_strategy(rule), config)
    table = rounds_table(records, SHAPE.size, SHAPE.topk).to_pandas()
    pool = PoolBatch.from_frame(table)
    if rule == "draft":
        offline = fixed_values(pool, score_of(pool, "draft"), [4])[0][:, 0]
    else:
        offline = draw_values(pool, [4])["root_draw"][0][:, 0]
    realized = np.array([r["realized"] for r in records], float)
    assert len(records) >= 150 and not np.isnan(offline).any()
    if rule == "draft":  # the fixed tree's conditional value is the offline value, round by round
        np.testing.assert_allclose([r["expected"] for r in records], offline, atol=1e-6)
    gap = PromptBootstrap(table["prompt_id"].to_numpy(), 2000, 0).totals(
        {"realized": realized, "offline": offline}).gain("realized", "offline")
    assert gap.low <= 0.0 <= gap.high, gap
    assert abs(gap.point) < 0.25 * offline.mean()
    shifted = PromptBootstrap(table["prompt_id"].to_numpy(), 2000, 0).totals(  # negative control: the check
        {"realized": realized + 0.3, "offline": offline}).gain("realized", "offline")  # has power
    assert not shifted.low <= 0.0 <= shifted.high


class CapturingReranked(RerankedSelection):
    """The real reranked strategy, keeping the features, predictions and trees it computed online."""

    def __init__(self, reranker):
        super().__init__(reranker, "test")
        self.seen, self.trees = [], []

    def first_factor(self, pool, ctx):
        factor = super().first_factor(pool, ctx)
        self.seen.append((ctx.features(self.groups), factor))  # the features it predicted from (cached)
        return factor

    def select(self, pool, ctx):
        tree, score = super().select(pool, ctx)
        self.trees.append(tree)
        return tree, score


GREEDY = DecodeConfig(SHAPE, budget=4, extra=36, temperature=0.0, max_new_tokens=40)
MANIFEST = {"temperature": 0.0, "topk": SHAPE.topk}


@pytest.fixture(scope="module")
def training_rounds(pair):
    return rounds_table(_run(*pair, make_strategy("draft"), GREEDY, PROMPTS[:6]), SHAPE.size, SHAPE.topk)


def _reranker(kind, rounds):
    if kind == "per-depth":
        return PerDepthCalibration(n_bins=8).fit(edge_frame(rounds, MANIFEST))
    train = featurize_rounds(rounds, MANIFEST)
    if kind == "isotonic":
        return IsotonicFirstFactor(n_bins=8).fit(train)
    return GBMReranker(features=kind, n_estimators=20, num_leaves=7, min_child_samples=5, n_jobs=1).fit(train)


@pytest.mark.parametrize("kind,path", [("isotonic", "array lookup"), ("per-depth", "array lookup"),
                                       ("base", "QuickScorer arrays"), ("base", "LightGBM predict"),
                                       ("rows", "QuickScorer arrays"), ("rows", "LightGBM predict")])
def test_online_features_predictions_and_trees_equal_offline_on_recorded_rounds(pair, training_rounds, kind, path,
                                                                                 monkeypatch):
    monkeypatch.setenv("SPECRANK_TREES", "lightgbm" if path == "LightGBM predict" else "quickscorer")
    reranker = _reranker(kind, training_rounds)
    strategy = CapturingReranked(reranker)
    records = _run(*pair, strategy, GREEDY, PROMPTS[6:9])
    assert reranker.inference_.startswith(path)  # prepared once, when the first decode checked it
    table = rounds_table(records, SHAPE.size, SHAPE.topk)
    offline = featurize_rounds(table, MANIFEST, labels=False)
    columns = [c for c in strategy.seen[0][0].columns if c != "task"]  # token and every numeric feature
    online = np.concatenate([np.column_stack([f[c] for c in columns]) for f, _ in strategy.seen])
    np.testing.assert_array_equal(online, offline[columns].to_numpy(float))
    assert all((f["task"] == "t").all() for f, _ in strategy.seen if "task" in f)
    assert ("task" in strategy.seen[0][0]) == (kind in ("base", "rows"))  # only what the reranker reads
    online_pred = np.concatenate([p for _, p in strategy.seen])
    offline_pred = reranker.predict_first_factor(offline)
    np.testing.assert_allclose(online_pred, offline_pred, rtol=0, atol=1e-12)
    assert len(np.unique(online_pred)) > 1  # the reranker is not a constant
    pool = PoolBatch.from_frame(table.to_pandas())
    score = score_of(pool, "reranked", "greedy", first_factor=offline_pred.reshape(-1, SHAPE.topk))
    np.testing.assert_array_equal(np.stack(strategy.trees), select_top(score, pool.depth, GREEDY.budget))


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
