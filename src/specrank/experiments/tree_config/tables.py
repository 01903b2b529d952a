"""Serving-engine tree settings scored exactly on recorded rounds (docs/tree-config.md).

SGLang's EAGLE tree (``--speculative-eagle-topk`` k, ``--speculative-num-steps`` s,
``--speculative-num-draft-tokens`` n) is a beam pool: the root row gives k candidates, each of the
s - 1 further steps expands the k best candidates of the previous level by cumulative draft
probability and adds their k best children; the verified tree is the n - 1 candidates of highest
cumulative draft probability, beside the root. EAGLE's ``top_k``, ``depth``, ``total_token`` name the
same tree with depth = s - 1 and total_token = n; a vLLM chain of ``num_speculative_tokens`` t is
k = 1, s = t, n = t + 1. specrank's pool with ``topk = expand = k`` and ``depth = s`` grows exactly
that beam, so a recording holds every candidate with its target probability, and the expected
number of accepted draft tokens of any tree inside it is a sum of path probabilities.

A smaller beam is read out of a larger recording by replaying the growth on the recorded
candidates (``beam_subpool``); a round whose replayed beam needs a node the recording did not
expand is *outside the recorded pool* and is never scored: it is counted and the setting flagged.

vLLM's static tree (``speculative_token_tree``, ``selection.static_tree``) verifies the same shape every round:
the top c_1 first tokens, then the top c_l children of every node above. A beam need not expand those nodes,
so a static tree is scored on its own recording, a pool that expands every node to the tree's depth, with
one child per node more than the tree's widest branching, where it lies in every round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import pandas as pd

from specrank.engines.sglang.score import DeeperFactors, plugin_score
from specrank.evaluation.figures import new_figure
from specrank.selection.pool import PoolBatch
from specrank.selection.scores import score_of
from specrank.selection.select import select_top
from specrank.selection.static_tree import StaticTree, StaticTreeError, first_child, static_columns
from specrank.selection.stats import PromptBootstrap

MAX_RECORDED_POOL = 1024  # candidates of one recorded pool: every one is in the target's pass
# draft selection (the engines'), exact root selection, a reranker, and SGLang's tree with the reranker as its plugin
# (``specrank.engines.sglang``) rescores it
SETTING_SCORES = ("draft", "root", "reranked", "plugin")


class TreeConfigError(ValueError):
    """A tree setting is impossible or lies outside the recorded pool; the message names the input."""


@dataclass(frozen=True, order=True)
class TreeSetting:
    """One engine tree, in SGLang's terms: topk k, num_steps s (tree depth), num_draft_tokens n (root included)."""

    topk: int
    num_steps: int
    num_draft_tokens: int

    def __post_init__(self):
        for name in ("topk", "num_steps", "num_draft_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise TreeConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.num_draft_tokens < 2:
            raise TreeConfigError(f"num_draft_tokens {self.num_draft_tokens}: the root and at least one draft token")
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise TreeConfigError(f"num_draft_tokens {self.num_draft_tokens} with topk 1: a chain of num_steps"
                                  f" {self.num_steps} verifies num_steps + 1 = {self.num_steps + 1} tokens"
                                  " (SGLang resets it to that)")
        if self.budget > self.candidates:
            raise TreeConfigError(f"num_draft_tokens {self.num_draft_tokens}: topk {self.topk} and num_steps"
                                  f" {self.num_steps} draft only {self.candidates} candidates (at most"
                                  f" {self.candidates + 1} tokens with the root)")

    @property
    def budget(self) -> int:
        """Draft tokens verified beside the root (specrank's budget B)."""
        return self.num_draft_tokens - 1

    @property
    def candidates(self) -> int:
        """Candidates the beam drafts: k at depth 1, k * k at each later depth."""
        return self.topk + (self.num_steps - 1) * self.topk ** 2

    @property
    def label(self) -> str:
        return f"k{self.topk}-s{self.num_steps}-n{self.num_draft_tokens}"

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    @property
    def draft_shape(self) -> tuple[int, int, int]:
        """(topk, depth, expand) of the pool the drafter grows for this setting (the cost model times it)."""
        return self.topk, self.num_steps, self.topk

    def sglang_flags(self, head: str = "HEAD") -> str:
        return (f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {head} --speculative-num-steps "
                f"{self.num_steps} --speculative-eagle-topk {self.topk} --speculative-num-draft-tokens "
                f"{self.num_draft_tokens}")

    def eagle_arguments(self) -> str:
        return f"top_k={self.topk}, depth={self.num_steps - 1}, total_token={self.num_draft_tokens}"

    def vllm_config(self, head: str = "HEAD") -> str | None:
        """vLLM's ``--speculative-config`` JSON for a chain; None for a dynamic tree (vLLM has none)."""
        if not self.is_chain:
            return None
        return json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": self.num_steps})


@dataclass(frozen=True, order=True)
class StaticTreeSetting:
    """vLLM's static tree: ``num_speculative_tokens`` = the tree's size, every node verified each round."""

    tree: StaticTree

    def __post_init__(self):
        topk, depth = self.recording_topk, self.tree.depth
        size = sum(topk ** d for d in range(1, depth + 1))
        if size > MAX_RECORDED_POOL:
            raise TreeConfigError(f"static tree {self.label}: scoring it exactly needs a pool that expands every"
                                  f" node (topk {topk}, depth {depth}: {size} candidates, more than"
                                  f" {MAX_RECORDED_POOL})")

    @property
    def recording_topk(self) -> int:
        """The recorded pool's children per node: one more than the widest branching, so that root selection
        and a reranker have a first token beyond the drafter's top c_1 to choose."""
        return max(self.tree.branching) + 1

    @property
    def topk(self) -> int:
        return self.tree.branching[0]

    @property
    def num_steps(self) -> int:
        return self.tree.depth

    @property
    def num_draft_tokens(self) -> int:
        return self.tree.size + 1

    @property
    def budget(self) -> int:
        return self.tree.size

    @property
    def label(self) -> str:
        return self.tree.label

    @property
    def is_chain(self) -> bool:
        return False

    @property
    def draft_shape(self) -> tuple[int, int, int]:
        """vLLM drafts each level from all nodes of the level above: the pool of the widest branching that
        expands the widest level."""
        return max(self.tree.branching), self.tree.depth, max(self.tree.widths[:-1], default=1)

    def sglang_flags(self, head: str = "HEAD") -> None:
        return None  # SGLang has no static tree

    def eagle_arguments(self) -> None:
        return None

    def vllm_config(self, head: str = "HEAD") -> str:
        return json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": self.tree.size,
                           "speculative_token_tree": str(self.tree.choices)})


def setting_order(setting) -> tuple:
    """Sort key over both kinds of setting: the beams first, then the static trees."""
    return (isinstance(setting, StaticTreeSetting), setting.topk, setting.num_steps, setting.num_draft_tokens,
            setting.label)


def vllm_tree(choices) -> TreeSetting | StaticTreeSetting:
    """vLLM's ``speculative_token_tree`` as a setting; a tree of single children is the chain it drafts."""
    try:
        tree = StaticTree.from_choices(choices)
    except StaticTreeError as exc:
        raise TreeConfigError(str(exc)) from None
    if max(tree.branching) == 1:
        return vllm_chain(tree.depth)
    return StaticTreeSetting(tree)


def sglang_setting(topk: int, num_steps: int, num_draft_tokens: int) -> TreeSetting:
    return TreeSetting(topk, num_steps, num_draft_tokens)


def eagle_setting(top_k: int, depth: int, total_token: int) -> TreeSetting:
    """EAGLE's ``top_k``/``depth``/``total_token``: ``depth`` draft steps after the root's, so depth + 1 levels,
    and ``total_token`` tokens verified with the root."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
        raise TreeConfigError(f"depth must be an integer >= 0, got {depth!r}")
    return TreeSetting(top_k, depth + 1, total_token)


def vllm_chain(num_speculative_tokens: int) -> TreeSetting:
    return TreeSetting(1, num_speculative_tokens, num_speculative_tokens + 1)


def tree_grid(topks, num_steps, num_draft_tokens) -> list[TreeSetting]:
    """Every valid SGLang setting of the grid (topk 1 is a chain: n = s + 1 only), sorted."""
    out = set()
    for k in topks:
        for s in num_steps:
            if k == 1:
                out.add(TreeSetting(1, s, s + 1))
                continue
            for n in num_draft_tokens:
                if 2 <= n <= k + (s - 1) * k * k + 1:
                    out.add(TreeSetting(k, s, n))
    if not out:
        raise TreeConfigError("grid: no valid setting (num_draft_tokens too large for every topk / num_steps)")
    return sorted(out)


@dataclass(frozen=True)
class PlannedRecording:
    """One recording the grid needs: its pool (topk, depth, expand), the budget it decodes with, its settings."""

    topk: int
    depth: int
    expand: int
    budget: int
    settings: tuple

    @property
    def name(self) -> str:
        full = isinstance(self.settings[0], StaticTreeSetting)
        return f"{'full-' if full else ''}topk{self.topk}-depth{self.depth}"


def recording_plan(settings) -> dict[str, PlannedRecording]:
    """The recordings a grid needs, by name. Chains (topk 1): one per num_steps. Beams: one per topk, at its deepest
    setting (a beam's first s levels do not depend on later ones, so each shallower setting of that topk is the
    recording truncated; its rounds start where the deepest setting's do).
    Static trees: one pool per recording topk (``StaticTreeSetting.recording_topk``) that expands every node
    to the deepest such tree."""
    groups: dict[tuple, list] = {}
    for st in settings:
        full = isinstance(st, StaticTreeSetting)
        # a decode's rounds start where its own rounds left off: read from a deeper chain's recording, a chain's
        # rounds would start only where the deeper one's do (fewer starts in easy text), so each chain (cheap to
        # record) gets its own; beams of one topk still share one recording
        own = st.num_steps if not full and st.topk == 1 else 0
        groups.setdefault((full, st.recording_topk if full else st.topk, own), []).append(st)
    plan = {}
    for (full, k, _), group in sorted(groups.items()):
        depth = max(st.num_steps for st in group)
        rec = PlannedRecording(k, depth, k ** (depth - 1) if full else k, max(st.budget for st in group),
                               tuple(sorted(group, key=setting_order)))
        plan[rec.name] = rec
    return plan


def beam_subpool(pool: PoolBatch, topk: int, depth: int) -> tuple[PoolBatch | None, np.ndarray]:
    """The pool SGLang's beam (topk, num_steps = depth) grows, replayed on a recorded pool, and which rounds hold it.

    Returns (sub-pool of the rounds that hold it, in the beam's own pool order, or None; contained (N,) bool).
    The recording must be a specrank pool (children of a node: a block of the recorded topk, best first).
    """
    n, m = pool.shape
    kk, dmax = pool.n_first, int(pool.depth.max())
    if topk > kk or depth > dmax:
        raise TreeConfigError(f"tree topk {topk}, num_steps {depth} lies outside the recorded pool (topk {kk},"
                              f" depth {dmax}): record that shape")
    if not (pool.depth == pool.depth[:1]).all():
        raise TreeConfigError("rounds: pools of different shapes in one recording")
    child_start = first_child(pool.parent)  # first child's pool index, -1: not expanded
    logp = pool.draft_logp
    levels = [np.tile(np.arange(topk), (n, 1))]  # recorded columns of each level, in the beam's order
    parents = [np.full((n, topk), -1, dtype=np.int64)]  # parents as positions in the sub-pool
    contained, offset = np.ones(n, dtype=bool), 0
    for d in range(2, depth + 1):
        prev = levels[-1]
        if d == 2:
            pos = np.tile(np.arange(topk), (n, 1))  # every depth-1 candidate is expanded
        else:  # the k best by cumulative draft log-probability; ties: earlier in the beam's order
            pos = np.argsort(-np.take_along_axis(logp, prev, axis=1), axis=1, kind="stable")[:, :topk]
        frontier = np.take_along_axis(prev, pos, axis=1)  # (N, f)
        start = np.take_along_axis(child_start, frontier, axis=1)
        contained &= (start >= 0).all(axis=1)
        levels.append((np.maximum(start, 0)[:, :, None] + np.arange(topk)).reshape(n, -1))
        parents.append(np.repeat(offset + pos, topk, axis=1))
        offset += prev.shape[1]
    cols, parent = np.concatenate(levels, axis=1), np.concatenate(parents, axis=1)
    if not contained.any():
        return None, contained
    keep = np.flatnonzero(contained)
    cols, parent = cols[keep], parent[keep]

    def take(a):
        return np.take_along_axis(a[keep], cols, axis=1)

    sub = PoolBatch(token=take(pool.token), parent=parent, depth=take(pool.depth), q_edge=take(pool.q_edge),
                    draft_logp=take(pool.draft_logp), p_edge=take(pool.p_edge),
                    p_argmax_child=take(pool.p_argmax_child),
                    prompt_id=None if pool.prompt_id is None else pool.prompt_id[keep],
                    task=None if pool.task is None else pool.task[keep])
    return sub.validate(), contained


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


def engine_rounds(rounds) -> PoolBatch:
    """The pool of the recorded rounds an engine drafts (``rounds``: ``evaluation.data.Rounds``): all but each
    prompt's first. specrank's first round drafts the first output token from the prompt; vLLM samples that token
    from the prefill and drafts from the second token on, so the first round has no counterpart in its counters
    (docs/tree-config.md, "Checked against vLLM")."""
    keep = np.flatnonzero(np.asarray(rounds.round) > 0)
    pool = rounds.pool.take(keep)
    pool.prompt_id = np.asarray(rounds.prompt_id)[keep]
    return pool


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


def run_interval(prefix: str, interval, variances, level: float) -> dict:
    """Where one engine run's measured value should fall (``{prefix}_low``, ``{prefix}_high``): each side of the
    prompt bootstrap's interval for the expected value (``interval``) widened, in quadrature, by the sampling
    spread of each independent run's accept counts (the per-round ``variances`` summed over the rounds; zero under
    greedy verification, which leaves the bootstrap's interval as it is). The spread of the continuations a sampled
    run follows is not in it. Empty when a variance is missing."""
    if any(v is None for v in variances):
        return {}
    z = NormalDist().inv_cdf(0.5 + level / 2)
    n = len(variances[0])
    spread = z ** 2 * sum(float(np.sum(v)) for v in variances) / max(n, 1) ** 2  # (z * its standard error)^2
    return {f"{prefix}_low": interval.point - np.sqrt((interval.point - interval.low) ** 2 + spread),
            f"{prefix}_high": interval.point + np.sqrt((interval.high - interval.point) ** 2 + spread)}


def prompt_bootstrap(prompt_ids: list, n_boot: int, seed: int, level: float) -> tuple[np.ndarray, PromptBootstrap]:
    """(the sorted prompts of every scored round, one set of paired prompt resamples over them)."""
    prompts = np.unique(np.concatenate(list(prompt_ids) + [np.zeros(0, str)]).astype(str))
    if prompts.size == 0:
        raise TreeConfigError("rounds: no setting holds a recorded round")
    return prompts, PromptBootstrap(prompts, n_resamples=n_boot, seed=seed, level=level)


def setting_table(scores: list[SettingScore], costs: dict | None = None, n_boot: int = 2000, seed: int = 0,
                  level: float = 0.95) -> pd.DataFrame:
    """One row per setting: acceptance length (1 + expected accepted draft tokens per round) of each score with
    paired prompt-bootstrap intervals (one set of prompt resamples for every setting and score), root's and the
    reranker's gain over draft, and predicted tokens/s from ``costs`` ({label: seconds per round}).
    Settings with rounds outside their recorded pool are flagged and not ranked."""
    prompts, boot = prompt_bootstrap([s.prompt_id for s in scores], n_boot, seed, level)
    columns = {}
    for s in scores:
        idx = np.searchsorted(prompts, s.prompt_id.astype(str))
        columns[f"{s.setting.label}|n"] = np.bincount(idx, minlength=len(prompts)).astype(float)
        for name, v in s.accepted.items():
            columns[f"{s.setting.label}|{name}"] = np.bincount(idx, weights=1.0 + v, minlength=len(prompts))
    tot = boot.totals(columns)
    rows = []
    for s in scores:
        st, lab = s.setting, s.setting.label
        row = {"setting": lab, "topk": st.topk, "num_steps": st.num_steps, "num_draft_tokens": st.num_draft_tokens,
               "budget": st.budget, "rounds": s.rounds - s.outside, "outside": s.outside,
               "status": "exact" if s.outside == 0 else f"flagged: {s.outside} of {s.rounds} rounds outside the"
                                                         f" recorded pool ({s.recording}), not scored",
               "recording": s.recording}
        for name in SETTING_SCORES:
            if name not in s.accepted or s.rounds == s.outside:
                row.update({f"{name}_length": np.nan, f"{name}_low": np.nan, f"{name}_high": np.nan})
                continue
            iv = tot.ratio([(f"{lab}|{name}", 1)], [(f"{lab}|n", 1)])
            row.update({f"{name}_length": iv.point, f"{name}_low": iv.low, f"{name}_high": iv.high})
            row.update(run_interval(f"{name}_run", iv, [s.variance.get(name)], level))
            if name != "draft":
                g = tot.ratio([(f"{lab}|{name}", 1), (f"{lab}|draft", -1)], [(f"{lab}|n", 1)])
                row.update({f"{name}_gain": g.point, f"{name}_gain_low": g.low, f"{name}_gain_high": g.high})
                row.update(run_interval(f"{name}_gain_run", g, [s.variance.get(name), s.variance.get("draft")],
                                        level))
        cost = (costs or {}).get(lab)
        if cost is not None:
            row.update({"round_seconds": cost, "tokens_per_s": row["draft_length"] / cost,
                        "tokens_per_s_low": row["draft_low"] / cost, "tokens_per_s_high": row["draft_high"] / cost})
        row.update({"sglang_flags": st.sglang_flags() or "", "eagle_arguments": st.eagle_arguments() or "",
                    "vllm_config": st.vllm_config() or "",
                    "tree": str(st.tree.choices) if isinstance(st, StaticTreeSetting) else ""})
        rows.append(row)
    table = pd.DataFrame(rows)
    key = "tokens_per_s" if "tokens_per_s" in table else "draft_length"
    table["_ok"] = table["outside"] == 0
    table = table.sort_values(["_ok", key], ascending=[False, False], kind="stable").drop(columns="_ok")
    table.insert(0, "rank", np.where(table["outside"] == 0, np.arange(1, len(table) + 1), 0))
    return table.reset_index(drop=True)


def position_table(scores: list[SettingScore]) -> pd.DataFrame:
    """Per-position acceptance rate (the metric engines log): share of rounds accepting >= d draft tokens under
    draft selection, and its ratio to position d - 1 (the conditional rate)."""
    rows = []
    for s in scores:
        if not len(s.positions):
            continue
        rate = s.positions.mean(axis=0)
        prev = np.concatenate([[1.0], rate[:-1]])
        for d, (r, p) in enumerate(zip(rate, prev), start=1):
            rows.append({"setting": s.setting.label, "position": d, "acceptance_rate": r,
                         "conditional_rate": r / p if p > 0 else np.nan})
    return pd.DataFrame(rows, columns=["setting", "position", "acceptance_rate", "conditional_rate"])


def reliability_table(pool: PoolBatch, law: str, bins: int = 10) -> pd.DataFrame:
    """Draft probability (q of each scored edge) against target acceptance of that edge given its parent is
    reached (p under sampling, the argmax indicator under greedy), in equal-width bins of q."""
    scored = ~np.isnan(pool.p_edge)
    q = pool.q_edge[scored].astype(np.float64)
    a = pool.edge_prob(law)[scored]
    which = np.minimum((q * bins).astype(np.int64), bins - 1)
    count = np.bincount(which, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame({
            "bin_low": np.arange(bins) / bins, "bin_high": np.arange(1, bins + 1) / bins, "edges": count,
            "draft_probability": np.bincount(which, q, bins) / count,
            "target_acceptance": np.bincount(which, a, bins) / count,
        })


def pooled_reliability(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """``reliability_table``s of several recordings pooled bin by bin, each bin's means weighted by its edges."""
    rel = pd.concat(parts, ignore_index=True)
    rel = rel.assign(q_sum=rel["edges"] * rel["draft_probability"].fillna(0.0),
                     a_sum=rel["edges"] * rel["target_acceptance"].fillna(0.0))
    pooled = rel.groupby(["bin_low", "bin_high"], as_index=False)[["edges", "q_sum", "a_sum"]].sum()
    edges = pooled["edges"].where(pooled["edges"] > 0)
    pooled = pooled.assign(draft_probability=pooled["q_sum"] / edges, target_acceptance=pooled["a_sum"] / edges)
    return pooled.drop(columns=["q_sum", "a_sum"])


def best_settings(table: pd.DataFrame) -> dict:
    """The best exact setting overall, the best chain and the best setting vLLM can serve (a chain or a static
    tree; None where the grid has none)."""
    exact = table[table["outside"] == 0]
    if exact.empty:
        raise TreeConfigError("grid: no setting was scored exactly")
    static = exact["tree"] != ""
    chains = exact[(exact["topk"] == 1) & ~static]
    vllm = exact[(exact["topk"] == 1) | static]
    return {"best": exact.iloc[0], "best_chain": None if chains.empty else chains.iloc[0],
            "best_vllm": None if vllm.empty else vllm.iloc[0]}


def row_setting(row) -> TreeSetting | StaticTreeSetting:
    """The setting of a table row."""
    if row.get("tree", ""):
        return StaticTreeSetting(StaticTree.from_choices(row["tree"]))
    return TreeSetting(int(row["topk"]), int(row["num_steps"]), int(row["num_draft_tokens"]))


def serving_flags(row, sglang_head: str, vllm_head: str) -> dict[str, str]:
    """The commands to paste for a table row (heads: paths of the exported heads)."""
    st = row_setting(row)
    out = {}
    if st.sglang_flags():
        out.update({"sglang": st.sglang_flags(sglang_head), "eagle": st.eagle_arguments()})
    if st.vllm_config():
        out["vllm"] = f"--speculative-config '{st.vllm_config(vllm_head)}'"
    return out


def tree_config_summary(table: pd.DataFrame, law: str, recordings: dict, heads: dict[str, str]) -> dict:
    """The best setting overall, the best chain and the best vLLM setting (a chain or a static tree), with the
    flags to paste; ``heads``: the exported heads' paths by engine ({} when the drafter has none)."""
    summary = {"law": law, "recordings": recordings}
    for name, row in best_settings(table).items():
        if row is None:
            continue
        summary[name] = {"setting": row["setting"], "acceptance_length": float(row["draft_length"]),
                         "interval": [float(row["draft_low"]), float(row["draft_high"])],
                         "tokens_per_s": float(row.get("tokens_per_s", float("nan"))),
                         "flags": serving_flags(row, heads.get("sglang", "HEAD"), heads.get("vllm", "HEAD"))}
    if not heads:
        summary["heads"] = "export the head with `specrank drafter export HEAD --format sglang|vllm --out DIR`"
    return summary


def summary_note(summary: dict) -> str:
    """The summary as a few paragraphs of text (an MLflow run's description)."""
    best = summary.get("best", {})
    lines = [f"Tree settings scored exactly on recorded rounds ({summary.get('law')}). Acceptance length = 1 +"
             " expected accepted draft tokens per round; predicted tokens/s = length / (draft + verify + host).",
             f"Best: {best.get('setting')} (length {best.get('acceptance_length', float('nan')):.3f},"
             f" {best.get('tokens_per_s', float('nan')):.1f} tokens/s)."]
    for engine, flags in best.get("flags", {}).items():
        lines.append(f"{engine}: {flags}")
    return "\n\n".join(lines)


def top_metrics(table: pd.DataFrame, n: int = 5) -> dict[str, float]:
    """Settings scored and flagged, and the lengths and speeds of the ``n`` best exact settings (``topI.COLUMN``)."""
    metrics = {"settings": len(table), "flagged": int((table["outside"] > 0).sum())}
    best = table[table["outside"] == 0].head(n)
    for i, (_, r) in enumerate(best.iterrows(), start=1):
        for col in ("draft_length", "draft_low", "draft_high", "root_length", "reranked_length", "plugin_length",
                    "tokens_per_s"):
            if col in r and r[col] == r[col]:
                metrics[f"top{i}.{col}"] = float(r[col])
    return metrics


def tree_config_figure(table: pd.DataFrame):
    """Acceptance length and predicted tokens/s against num_draft_tokens, one line per topk (at each n the
    topk's best num_steps), 95% prompt-bootstrap intervals as bands."""
    exact = table[table["outside"] == 0]
    exact = exact[exact["tree"] == ""]  # a static tree is one point, not a line over num_draft_tokens
    speed = "tokens_per_s" in exact
    fig, axes = new_figure(2 if speed else 1, (10.5 if speed else 5.4, 3.8))
    panels = [("draft", "acceptance length (tokens / round)")] + ([("tokens_per_s", "predicted tokens/s")] if speed else [])
    key = "tokens_per_s" if speed else "draft_length"
    for ax, (what, ylabel) in zip(axes[0], panels):
        for k, part in exact.groupby("topk"):
            best = part.sort_values(key, ascending=False).drop_duplicates("num_draft_tokens").sort_values(
                "num_draft_tokens")
            col, low, high = (("draft_length", "draft_low", "draft_high") if what == "draft"
                              else ("tokens_per_s", "tokens_per_s_low", "tokens_per_s_high"))
            x = best["num_draft_tokens"].to_numpy()
            line = ax.plot(x, best[col], marker="o", label=f"topk {k}")[0]
            ax.fill_between(x, best[low], best[high], color=line.get_color(), alpha=0.15)
        ax.set_xscale("log", base=2)
        ns = sorted(int(n) for n in exact["num_draft_tokens"].unique())
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("num_draft_tokens (root included)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    axes[0, 0].set_title("draft selection; each topk at its best num_steps", fontsize=9)
    fig.tight_layout()
    return fig


def reliability_figure(reliability: pd.DataFrame):
    """The head's draft probability against the target's acceptance of the same edge (diagonal: calibrated)."""
    fig, axes = new_figure(1, (4.2, 4.0))
    ax = axes[0, 0]
    r = reliability[reliability["edges"] > 0]
    ax.plot([0, 1], [0, 1], color="gray", linestyle=":", label="calibrated")
    ax.plot(r["draft_probability"], r["target_acceptance"], marker="o", label="recorded edges")
    for _, row in r.iterrows():
        ax.annotate(f"{int(row['edges'])}", (row["draft_probability"], row["target_acceptance"]), fontsize=6,
                    xytext=(2, -8), textcoords="offset points")
    ax.set_xlabel("draft probability q(x | parent)")
    ax.set_ylabel("target acceptance given the parent")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("Reliability of the head (edge counts marked)", fontsize=9)
    fig.tight_layout()
    return fig
