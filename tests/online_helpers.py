"""Online reranking against the offline featurizer, shared by the CPU and CUDA tests: a capturing reranked strategy,
small fitted rerankers of each class, and the check that a decode's online features, predictions and trees equal
the offline ones on its own recorded rounds."""

import numpy as np

from specrank.decode.runs.measure import Measure
from specrank.decode.runs.tables import rounds_table
from specrank.decode.strategies import RerankedSelection
from specrank.featurize import featurize_rounds
from specrank.featurize.edges import edge_frame
from specrank.rerankers import GBMReranker, IsotonicFirstFactor, PerDepthCalibration, StackedReranker
from specrank.selection import PoolBatch, score_of, select_top, stacked_factors
from decode_helpers import decode_prompt_online


class CapturingReranked(RerankedSelection):
    """The real reranked strategy, keeping the features, predictions, trees and scores it computed online."""

    def __init__(self, reranker):
        super().__init__(reranker, "test")
        self.seen, self.trees, self.scores = [], [], []

    def first_factor(self, pool, ctx):
        factor = super().first_factor(pool, ctx)
        self.seen.append((ctx.features(self.groups), factor))  # the features it predicted from (cached)
        return factor

    def select(self, pool, ctx):
        tree, score = super().select(pool, ctx)
        self.trees.append(tree)
        self.scores.append(score)
        return tree, score


def recorded(target, drafter, strategy, config, prompts):
    """The measured records of decoding each of ``prompts`` (prompt ids p00, p01, ...; task "t")."""
    records = []
    for i, ids in enumerate(prompts):
        records += decode_prompt_online(target, drafter, ids, config, strategy, prompt_id=f"p{i:02d}", task="t",
                                        measure=Measure(record=True))[1]
    return records


def fitted_reranker(kind, rounds, manifest):
    """A small reranker of ``kind`` (rows, base, isotonic, per-depth, stacked: rows + per-depth) fitted on recorded
    ``rounds``."""
    if kind == "per-depth":
        return PerDepthCalibration(n_bins=8).fit(edge_frame(rounds, manifest))
    train = featurize_rounds(rounds, manifest)
    if kind == "stacked":
        return StackedReranker(fitted_reranker("rows", rounds, manifest), PerDepthCalibration(n_bins=8)).fit(
            train, edge_frame(rounds, manifest))
    if kind == "isotonic":
        return IsotonicFirstFactor(n_bins=8).fit(train)
    return GBMReranker(features=kind, n_estimators=20, num_leaves=7, min_child_samples=5, n_jobs=1).fit(train)


def offline_score(reranker, table, pool: PoolBatch, first_factor: np.ndarray, manifest, law: str) -> np.ndarray:
    """(N, M) the offline score of ``reranker`` on recorded rounds: ``reranked`` (r(x1) prod q_i), or for a stacked
    reranker the study's "Rows + per-depth" (``experiments.study.study_tables.study_values``): the ``per_depth`` score of every
    edge's factor calibrated per depth, the first level's replaced by the first factor."""
    if not hasattr(reranker, "per_depth_"):
        return score_of(pool, "reranked", law, first_factor=first_factor)
    edges = reranker.per_depth_.predict(edge_frame(table, manifest, labels=False)).reshape(pool.shape)
    return score_of(pool, "per_depth", law, edge_factor=stacked_factors(pool, first_factor, edges))


def assert_online_equals_offline(strategy: CapturingReranked, records, config, manifest) -> np.ndarray:
    """The strategy's online features equal the offline featurizer's on its recorded rounds bit for bit, its
    predictions and scores within 1e-12, and its trees the offline selection's; returns the online predictions."""
    shape = config.shape
    table = rounds_table(records, shape.size, shape.topk)
    offline = featurize_rounds(table, manifest, labels=False)
    columns = [c for c in strategy.seen[0][0].columns if c != "task"]  # token and every numeric feature
    online = np.concatenate([np.column_stack([f[c] for c in columns]) for f, _ in strategy.seen])
    np.testing.assert_array_equal(online, offline[columns].to_numpy(float))
    assert all((f["task"] == "t").all() for f, _ in strategy.seen if "task" in f)
    online_pred = np.concatenate([p for _, p in strategy.seen])
    offline_pred = strategy.reranker.predict_first_factor(offline)
    np.testing.assert_allclose(online_pred, offline_pred, rtol=0, atol=1e-12)
    pool = PoolBatch.from_frame(table.to_pandas())
    score = offline_score(strategy.reranker, table, pool, offline_pred.reshape(-1, shape.topk), manifest, config.law)
    np.testing.assert_allclose(np.stack(strategy.scores), score, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.stack(strategy.trees), select_top(score, pool.depth, config.budget))
    return online_pred
