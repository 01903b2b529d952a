"""A chain's first token chosen by specrank: vLLM's EAGLE-3 chains (``num_speculative_tokens`` k) whose first
token is picked among the drafter's top K first tokens, scored exactly on recorded rounds (docs/tree-config.md,
"Choosing a chain's first token").

A chain engine drafts the argmax of the head's row at each of k steps and verifies that one chain. Its only
free choice before verification is the first token: once x1 is fixed, the rest is the head's greedy chain below
it. Replacing the first argmax by another rule stays lossless: under greedy verification the target's argmax
decides, and under sampling vLLM's rejection sampler accepts a drafted token x with probability p(x) (its draft
law a point mass), the same rule whichever token was drafted.

The recording is a fan (``PoolShape(K, k, K, children=1)``): the drafter's top K first tokens, each continued by
its greedy chain to depth k, every edge scored by the target, each round verifying the drafter's own chain (a
static chain tree), so its rounds start where vLLM's do. Each rule picks a first-level column per round; its value
is the exact expected accepted draft tokens of the chain below it, the sum of the chain's path probabilities:

- ``draft``: the drafter's top first token (vLLM's own chain);
- ``root``: the first token of highest target probability among the K (exact root selection at the chain's
  choice; a target pass before drafting would be needed, so it is the ceiling, not a rule to serve);
- ``reranked``: the argmax of a reranker's first factor r(x1);
- ``best_chain``: the chains of the reranker's top m first tokens drafted in one batched pass, the one of highest
  estimated expected accepted tokens r(x1) (1 + q2 + q2 q3 + ...) kept (m = 1 is ``reranked``);
- ``ranking``: the argmax of a reranker trained for the choice itself, LambdaRank grouped by round with the
  chain's exact expected accepted tokens through x1 as relevance.

Features are those known at the chain engine's first draft step: the first level, the context and the retained
rows, without the subtree below each candidate (``FIRST_STEP``), as the engine sees them (no prompt rows, task
unknown: ``featurize.engine.engine_visible``), the feature set ``first_step``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specrank.engines.tree_settings import TreeConfigError
from specrank.experiments.tree_config.setting_scores import accepted_variance
from specrank.experiments.tree_config.setting_table import prompt_bootstrap
from specrank.selection.pool import PoolBatch
from specrank.selection.static_tree import StaticTree, static_columns

CHOICE_RULES = ("draft", "root", "reranked", "best_chain", "ranking")


@dataclass(frozen=True, order=True)
class ChainChoice:
    """vLLM chains of ``num_speculative_tokens`` k whose first token is chosen among the drafter's top
    ``first_choices`` K; ``drafted_chains`` m: chains drafted in one batched pass for ``best_chain``."""

    num_speculative_tokens: int
    first_choices: int = 10
    drafted_chains: int = 4

    def __post_init__(self):
        for name in ("num_speculative_tokens", "first_choices", "drafted_chains"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise TreeConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.first_choices < 2:
            raise TreeConfigError(f"first_choices {self.first_choices}: choosing a first token needs at least 2")
        if self.drafted_chains > self.first_choices:
            raise TreeConfigError(f"drafted_chains {self.drafted_chains} exceeds first_choices {self.first_choices}")

    @property
    def label(self) -> str:
        return f"k{self.num_speculative_tokens}-choose{self.first_choices}-m{self.drafted_chains}"

    @property
    def chain(self) -> StaticTree:
        return StaticTree((1,) * self.num_speculative_tokens)

    @property
    def recording(self) -> str:
        return f"fan-topk{self.first_choices}-depth{self.num_speculative_tokens}"

    @property
    def fan_shape(self) -> tuple[int, int, int, int]:
        """(topk, depth, expand, children) of the recorded fan."""
        k, n = self.num_speculative_tokens, self.first_choices
        return n, k, n, 1


@dataclass(frozen=True)
class DraftCost:
    """A pool the cost model times (``decode.runs.cost``) for a chain choice: ``draft_shape`` drafted, a pass
    over ``num_draft_tokens``."""

    draft_shape: tuple
    num_draft_tokens: int


def cost_settings(choice: ChainChoice) -> tuple[DraftCost, DraftCost]:
    """(vLLM's one chain, the m chains ``best_chain`` drafts in one batched pass) as the cost model times them."""
    k, m = choice.num_speculative_tokens, choice.drafted_chains
    one = DraftCost((1, k, 1), k + 1)  # chains of one token are the root's step alone, however many are kept
    return one, DraftCost((m, k, m, 1), k + 1) if m > 1 and k > 1 else one


def chain_columns(pool: PoolBatch, k: int) -> np.ndarray:
    """(N, k, K) pool column of the node at depth d of the chain below each first-level candidate of a fan."""
    n_first = pool.n_first
    fan = StaticTree((n_first,) + (1,) * (k - 1))
    columns, contained = static_columns(fan, pool.parent)
    if not contained.all():
        raise TreeConfigError(f"rounds: {int((~contained).sum())} rounds hold no chain of depth {k} below every"
                              " first token (record a fan: topk K, depth k, children 1)")
    return columns.reshape(len(columns), k, n_first)


def chain_values(pool: PoolBatch, law: str, k: int, cols: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(values (N, K) the exact expected accepted draft tokens of the chain below each first token, path
    probabilities (N, k, K) of each chain's nodes); ``cols``: the pool's ``chain_columns``, when known."""
    cols = chain_columns(pool, k) if cols is None else cols
    n = len(cols)
    path = np.take_along_axis(pool.path_prob(law), cols.reshape(n, -1), axis=1).reshape(cols.shape)
    return path.sum(axis=1), path


def estimated_values(pool: PoolBatch, first: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(N, K) expected accepted draft tokens of each chain (``cols``: the pool's ``chain_columns``) estimated with
    first factor ``first`` (N, K) and the drafter's deeper factors: r(x1) (1 + q2 + q2 q3 + ...)."""
    n = len(cols)
    q = np.take_along_axis(pool.q_edge.astype(np.float64), cols.reshape(n, -1), axis=1).reshape(cols.shape)
    q[:, 0] = first
    return np.cumprod(q, axis=1).sum(axis=1)


def choose(choice: ChainChoice, pool: PoolBatch, law: str, first: np.ndarray | None, ranking: np.ndarray | None,
           cols: np.ndarray) -> dict[str, np.ndarray]:
    """{rule: (N,) chosen first-level column} for every rule whose input is given (ties: the drafter's order);
    ``cols``: the pool's ``chain_columns``."""
    n, m = pool.n_rounds, choice.drafted_chains
    picks = {"draft": np.zeros(n, dtype=np.int64),
             "root": np.argmax(pool.first_draw_prob(law), axis=1)}
    if first is not None:
        first = np.asarray(first, dtype=np.float64)
        picks["reranked"] = np.argmax(first, axis=1)
        drafted = np.argsort(-first, axis=1, kind="stable")[:, :m]  # the m chains drafted
        estimate = np.take_along_axis(estimated_values(pool, first, cols), drafted, axis=1)
        picks["best_chain"] = np.take_along_axis(drafted, np.argmax(estimate, axis=1)[:, None], axis=1)[:, 0]
    if ranking is not None:
        picks["ranking"] = np.argmax(np.asarray(ranking, dtype=np.float64), axis=1)
    return picks


@dataclass
class ChoiceScore:
    """A chain choice's exact per-round values: for each rule, the accepted draft tokens (R,), their variance
    within a round (R,) and the chosen first token's acceptance (R,)."""

    choice: ChainChoice
    prompt_id: np.ndarray
    accepted: dict
    variance: dict
    first: dict


def score_choice(choice: ChainChoice, pool: PoolBatch, law: str, first: np.ndarray | None = None,
                 ranking: np.ndarray | None = None) -> ChoiceScore:
    """Every rule's exact values on a fan's rounds (``first``: a reranker's first factors (N, K), ``ranking``: a
    ranking reranker's scores (N, K))."""
    k = choice.num_speculative_tokens
    if pool.n_first < choice.first_choices:
        raise TreeConfigError(f"chain choice {choice.label}: the recording has {pool.n_first} first tokens")
    cols = chain_columns(pool, k)
    _, path = chain_values(pool, law, k, cols)
    depth = np.arange(1, k + 1)
    accepted, variance, first_acceptance = {}, {}, {}
    for rule, pick in choose(choice, pool, law, first, ranking, cols).items():
        on_chain = np.take_along_axis(path, pick[:, None, None].repeat(k, axis=1), axis=2)[:, :, 0]  # (N, k)
        accepted[rule] = on_chain.sum(axis=1)
        variance[rule] = accepted_variance(on_chain, depth)
        first_acceptance[rule] = on_chain[:, 0]
    prompt_id = np.asarray(pool.prompt_id if pool.prompt_id is not None else np.zeros(pool.n_rounds, str))
    return ChoiceScore(choice, prompt_id, accepted, variance, first_acceptance)


def choice_table(scores: list[ChoiceScore], seconds: dict | None = None, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> pd.DataFrame:
    """One row per (chain choice, rule): acceptance length (1 + expected accepted draft tokens a round) with its
    paired prompt-bootstrap interval, the gain over the drafter's chain, the share of root selection's gain at
    the chain's choice (%), the chosen first token's acceptance, and predicted tokens/s from ``seconds``
    ({(label, rule): seconds a round}; root at the drafter's cost, a ceiling)."""
    prompts, boot = prompt_bootstrap([s.prompt_id for s in scores], n_boot, seed, level)
    columns = {}
    for s in scores:
        idx = np.searchsorted(prompts, s.prompt_id.astype(str))
        columns[f"{s.choice.label}|n"] = np.bincount(idx, minlength=len(prompts)).astype(float)
        for rule in s.accepted:
            columns[f"{s.choice.label}|{rule}"] = np.bincount(idx, 1.0 + s.accepted[rule], len(prompts))
            columns[f"{s.choice.label}|{rule}|first"] = np.bincount(idx, s.first[rule], len(prompts))
    tot = boot.totals(columns)
    rows = []
    for s in scores:
        lab, c = s.choice.label, s.choice
        for rule in CHOICE_RULES:
            if rule not in s.accepted:
                continue
            length = tot.ratio([(f"{lab}|{rule}", 1)], [(f"{lab}|n", 1)])
            first = tot.ratio([(f"{lab}|{rule}|first", 1)], [(f"{lab}|n", 1)])
            gain = tot.ratio([(f"{lab}|{rule}", 1), (f"{lab}|draft", -1)], [(f"{lab}|n", 1)])
            share = tot.share(f"{lab}|{rule}", f"{lab}|draft", f"{lab}|root")
            row = {"choice": lab, "num_speculative_tokens": c.num_speculative_tokens,
                   "first_choices": c.first_choices, "drafted_chains": c.drafted_chains, "rule": rule,
                   "rounds": len(s.prompt_id), "length": length.point, "length_low": length.low,
                   "length_high": length.high, "gain": gain.point, "gain_low": gain.low, "gain_high": gain.high,
                   "share_pct": share.point, "share_low": share.low, "share_high": share.high,
                   "first_acceptance": first.point, "first_acceptance_low": first.low,
                   "first_acceptance_high": first.high}
            cost = (seconds or {}).get((lab, rule))
            if cost is not None:
                row.update({"round_seconds": cost, "tokens_per_s": length.point / cost,
                            "tokens_per_s_low": length.low / cost, "tokens_per_s_high": length.high / cost})
            rows.append(row)
    table = pd.DataFrame(rows)
    if "tokens_per_s" in table:
        base = table[table["rule"] == "draft"].set_index("choice")["tokens_per_s"]
        table["speed_over_draft"] = table["tokens_per_s"] / table["choice"].map(base)
    return table


def choice_seconds(choice: ChainChoice, draft_seconds: dict, verify_seconds: float, plugin_seconds: float
                   ) -> dict:
    """{(label, rule): seconds a round}: the drafter's chain and its verify pass, plus the plugin's cost a step
    for a reranker's rule and, for ``best_chain``, the m chains' pool instead of one (``draft_seconds``: seconds
    of each ``DraftCost.draft_shape``; root at the drafter's cost)."""
    one, many = cost_settings(choice)
    plain = draft_seconds[one.draft_shape] + verify_seconds
    wide = draft_seconds[many.draft_shape] + verify_seconds
    return {(choice.label, "draft"): plain, (choice.label, "root"): plain,
            (choice.label, "reranked"): plain + plugin_seconds, (choice.label, "ranking"): plain + plugin_seconds,
            (choice.label, "best_chain"): wide + plugin_seconds}
