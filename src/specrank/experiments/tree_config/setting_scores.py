"""A tree setting scored exactly on recorded rounds: per round, the expected accepted draft tokens of draft
selection, root selection, a reranker and SGLang's tree rescored by specrank's plugin (a sum of path
probabilities over the verified tree), and their variance about it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specrank.engines.sglang.beam import beam_subpool
from specrank.engines.sglang.score import DeeperFactors, plugin_score
from specrank.engines.tree_settings import StaticTreeSetting, TreeConfigError, TreeSetting
from specrank.selection.pool import PoolBatch
from specrank.selection.scores import score_of
from specrank.selection.select import select_top
from specrank.selection.static_tree import static_columns

# draft selection (the engines'), exact root selection, a reranker, and SGLang's tree with the reranker as its plugin
# (``specrank.engines.sglang``) rescores it
SETTING_SCORES = ("draft", "root", "reranked", "plugin")


@dataclass
class SettingScore:
    """A setting's exact per-round values on the rounds that hold its tree."""

    setting: TreeSetting
    prompt_id: np.ndarray  # (R,) of the rounds scored
    accepted: dict[str, np.ndarray]  # score -> (R,) expected accepted draft tokens
    positions: np.ndarray  # (R, num_steps) probability that draft selection accepts position d (>= d tokens)
    rounds: int  # rounds of the recording
    outside: int  # rounds whose tree lies outside the recorded pool (never scored)
    recording: str = ""
    extra: dict = field(default_factory=dict)
    # score -> (R,) variance of the accepted draft tokens a round, about their expectation: the spread of what one
    # engine run counts (zero under greedy verification, whose acceptance is certain given the round)
    variance: dict[str, np.ndarray] = field(default_factory=dict)


def accepted_variance(on_tree: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """(R,) variance of a round's accepted draft tokens A from its tree's path probabilities ``on_tree`` (R, m)
    and their depths (m,) or (R, m): at most one node a depth is accepted, so P(A >= d) is the sum of the path
    probabilities at depth d, E[A] their sum and E[A^2] the sum of (2d - 1) P(A >= d)."""
    weights = 2.0 * np.broadcast_to(depth, on_tree.shape) - 1.0
    mean = on_tree.sum(axis=1)
    return np.maximum((weights * on_tree).sum(axis=1) - mean ** 2, 0.0)


@dataclass(frozen=True)
class PluginFactors:
    """What SGLang's plugin multiplies into the path scores SGLang ranks: the reranker's first factors (N, recorded
    topk) of the recorded rounds, predicted from the features the plugin computes (``featurize.engine``), and for a
    stacked reranker its per-depth map ``deeper(depth, q) -> g_d(q)`` of every deeper draft factor (None: the draft
    factors stay)."""

    first: np.ndarray
    deeper: DeeperFactors | None = None


def setting_score(sub: PoolBatch, law: str, name: str, topk: int, contained: np.ndarray, first_factor,
                  plugin: PluginFactors | None) -> np.ndarray | None:
    """(R, m) score ``name`` of a setting's beam ``sub``, or None when its input is not given."""
    if name == "reranked":
        if first_factor is None:
            return None
        return score_of(sub, name, law, first_factor=np.asarray(first_factor)[contained][:, :topk])
    if name == "plugin":
        return None if plugin is None else plugin_score(sub, law, plugin.first[contained][:, :topk], plugin.deeper)
    return score_of(sub, name, law)


def score_setting(pool: PoolBatch, law: str, setting, first_factor: np.ndarray | None = None,
                  recording: str = "", plugin: PluginFactors | None = None) -> SettingScore:
    """Exact expected accepted draft tokens per round for draft selection, root selection, (given
    ``first_factor`` (N, recorded topk), a reranker's cross-fitted predictions) the reranked score and (given
    ``plugin``) SGLang's tree rescored by specrank's plugin. A static tree has no plugin score (SGLang has none)."""
    if isinstance(setting, StaticTreeSetting):
        return score_static_tree(pool, law, setting, first_factor, recording)
    sub, contained = beam_subpool(pool, setting.topk, setting.num_steps)
    prompt_id = np.asarray(pool.prompt_id if pool.prompt_id is not None else np.zeros(pool.n_rounds, str))
    if sub is None:
        empty = np.zeros(0)
        return SettingScore(setting, prompt_id[:0], {r: empty for r in SETTING_SCORES},
                            np.zeros((0, setting.num_steps)), pool.n_rounds, pool.n_rounds, recording)
    path = sub.path_prob(law)
    accepted, variance, positions = {}, {}, None
    for name in SETTING_SCORES:
        score = setting_score(sub, law, name, setting.topk, contained, first_factor, plugin)
        if score is None:
            continue
        tree = select_top(score, sub.depth, setting.budget)  # (R, m)
        on_tree = np.where(tree, path, 0.0)
        accepted[name] = on_tree.sum(axis=1)
        variance[name] = accepted_variance(on_tree, sub.depth)
        if name == "draft":
            positions = np.stack([np.where(tree & (sub.depth == d), path, 0.0).sum(axis=1)
                                  for d in range(1, setting.num_steps + 1)], axis=1)
    return SettingScore(setting, prompt_id[contained], accepted, positions, pool.n_rounds,
                        int((~contained).sum()), recording, variance=variance)


def score_static_tree(pool: PoolBatch, law: str, setting: StaticTreeSetting, first_factor: np.ndarray | None = None,
                      recording: str = "") -> SettingScore:
    """A static tree's exact values: its nodes' path probabilities summed, every node verified. Root selection
    and the reranker pick the tree's c_1 first tokens among the recorded first level by their own first factor
    (a hook before vLLM's drafting), the levels below stay the drafter's top c_l; draft selection takes the
    drafter's top c_1, as vLLM does."""
    tree, kk, dmax = setting.tree, pool.n_first, int(pool.depth.max())
    if max(tree.branching) > kk or tree.depth > dmax:
        raise TreeConfigError(f"static tree {setting.label} lies outside the recorded pool (topk {kk}, depth"
                              f" {dmax}): record that shape")
    path = pool.path_prob(law)
    prompt_id = np.asarray(pool.prompt_id if pool.prompt_id is not None else np.zeros(pool.n_rounds, str))
    columns, contained = {}, np.ones(pool.n_rounds, dtype=bool)
    for name in SETTING_SCORES:
        first = None
        if (name == "reranked" and first_factor is None) or name == "plugin":
            continue
        if name != "draft":
            inputs = {"first_factor": np.asarray(first_factor)} if name == "reranked" else {}
            top = score_of(pool, name, law, **inputs)[:, :kk]
            first = np.argsort(-top, axis=1, kind="stable")[:, : tree.branching[0]]  # ties: the drafter's order
        columns[name], inside = static_columns(tree, pool.parent, first)
        contained &= inside
    depth = np.repeat(np.arange(1, tree.depth + 1), tree.widths)  # (size,) each node's depth
    trees = {name: np.take_along_axis(path, c, axis=1)[contained] for name, c in columns.items()}
    accepted = {name: t.sum(axis=1) for name, t in trees.items()}
    variance = {name: accepted_variance(t, depth) for name, t in trees.items()}
    on_tree = trees["draft"]
    positions = np.stack([on_tree[:, depth == d].sum(axis=1) for d in range(1, tree.depth + 1)], axis=1)
    return SettingScore(setting, prompt_id[contained], accepted, positions, pool.n_rounds,
                        int((~contained).sum()), recording, variance=variance)
