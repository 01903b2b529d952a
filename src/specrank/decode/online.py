"""Online selection strategies (SPEC §6; seed 000 §5.4, App. D.3, D.10): one class per decoder.

A strategy picks the verified tree of a round from the pool, and says whether it needs the
root row first (a root pass whose KV the tree pass reuses), whether it draws the first token
from that row before selecting (root-draw, PEARL-style, root), and whether realized
acceptance counts that drawn token. Scores come from ``specrank.selection`` on a one-round
``PoolBatch``, so an online tree is exactly the tree the offline rule selects on the same pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from specrank.decode.pool import DraftPool
from specrank.selection import DraftGroups, PoolBatch, rank_order, rule_score, select_top


class StrategyError(ValueError):
    """An online strategy cannot run with these inputs (unknown name, incompatible reranker)."""


@dataclass
class RoundContext:
    """What a strategy may read when it selects: all of it known before verification."""

    budget: int
    temperature: float
    root_logits: torch.Tensor | None  # (V,) the root row's logits, None before any target pass
    drawn_node: int  # pool index of the drawn first token on the first level, -1 when off it or no draw
    features: Callable[[], object]  # () -> features DataFrame of this round's first-level candidates

    @property
    def law(self) -> str:
        return "greedy" if self.temperature == 0 else "sampling"


def round_batch(pool: DraftPool, root_logits: torch.Tensor | None, temperature: float) -> PoolBatch:
    """A one-round PoolBatch of ``pool``; first-level target probabilities from the root row when known."""
    m = len(pool)
    p_edge, p_argmax = np.full(m, np.nan, np.float32), np.zeros(m, np.int8)
    if root_logits is not None:
        first = torch.from_numpy(pool.token[pool.parent < 0])
        probs = torch.softmax(root_logits.float() / (temperature or 1.0), -1)
        p_edge[pool.parent < 0] = probs[first].numpy()
        p_argmax[pool.parent < 0] = (first == root_logits.argmax()).numpy()
    arrays = dict(token=pool.token, parent=pool.parent, depth=pool.depth, q_edge=pool.q_edge,
                  draft_logp=pool.draft_logp, p_edge=p_edge, p_argmax_child=p_argmax)
    return PoolBatch(**{k: v[None] for k, v in arrays.items()})


def top_tree(score: np.ndarray, depth: np.ndarray, budget: int) -> np.ndarray:
    """(M,) bool: the top-``budget`` candidates under ``score`` (SPEC §1 tie-break)."""
    return select_top(score[None], depth[None], budget)[0]


def branch_tree(pool: DraftPool, node: int, budget: int) -> np.ndarray:
    """(M,) bool: first-level ``node`` and its ``budget - 1`` best descendants in draft order."""
    tree = np.zeros(len(pool), bool)
    if node < 0:
        return tree
    batch = round_batch(pool, None, 1.0)
    within = DraftGroups.of(batch).within[0]  # rank among the branch's descendants, -1 at depth 1
    tree[(batch.first_ancestor[0] == node) & (within >= 0) & (within < budget - 1)] = True
    tree[node] = True
    return tree


class SelectionStrategy:
    """Base strategy: draft selection (EAGLE-3's tree, one pass over root + tree)."""

    name = "draft"
    needs_root_pass = False  # score the root alone first when its row is not known yet
    draws_first = False  # draw the first token from the root row before selecting the tree
    counts_draw = False  # realized acceptance counts the drawn token (root-draw, PEARL-style)
    carries_leaf_row = False  # covering: a draw labelling a leaf is emitted, its row seeds the next round
    lossless = True

    def plan(self, root_known: bool) -> "SelectionStrategy":
        """The strategy acting in a round (the covering decoder switches on a carried root row)."""
        return self

    def check(self, config) -> None:
        """Raise a one-line error before decoding when this strategy cannot run under ``config``."""

    def draw(self, root_logits: torch.Tensor, pool: DraftPool, verifier, generator) -> int:
        """The first token, drawn from the target root row exactly as the verifier would."""
        return verifier.draw(root_logits, generator)

    def select(self, pool: DraftPool, ctx: RoundContext) -> tuple[np.ndarray, np.ndarray]:
        """(tree (M,) bool, ranking score (M,)) of this round."""
        score = pool.draft_logp.astype(np.float64)
        return top_tree(score, pool.depth, ctx.budget), score


class DraftSelection(SelectionStrategy):
    """Draft selection: top-B by cumulative draft probability."""


class ScoreSelection(SelectionStrategy):
    """Top-B under any score function ``pool -> (M,)`` (the recorder's ``select`` parameter)."""

    def __init__(self, score_fn, name: str = "draft"):
        self.score_fn, self.name = score_fn, name

    def select(self, pool, ctx):
        score = np.asarray(self.score_fn(pool), dtype=np.float64)
        return top_tree(score, pool.depth, ctx.budget), score


class RootSelection(SelectionStrategy):
    """Root selection: p(x1|c) prod q, with the root row from a root pass; draws its first token first
    and skips the tree pass when the draw is not on the tree (App. D.14)."""

    name = "root"
    needs_root_pass = True
    draws_first = True

    def select(self, pool, ctx):
        score = rule_score(round_batch(pool, ctx.root_logits, ctx.temperature), "root", ctx.law)[0]
        return top_tree(score, pool.depth, ctx.budget), score


class RootDrawSelection(SelectionStrategy):
    """Root-draw selection: the drawn token and its B-1 best draft-ranked descendants."""

    name = "root-draw"
    needs_root_pass = True
    draws_first = True
    counts_draw = True

    def select(self, pool, ctx):
        return branch_tree(pool, ctx.drawn_node, ctx.budget), pool.draft_logp.astype(np.float64)


class PearlSelection(SelectionStrategy):
    """PEARL-style: draft selection's B-node tree pruned to the drawn token's subtree (or the token alone)."""

    name = "pearl"
    needs_root_pass = True
    draws_first = True
    counts_draw = True

    def select(self, pool, ctx):
        score = pool.draft_logp.astype(np.float64)
        tree = np.zeros(len(pool), bool)
        if ctx.drawn_node >= 0:
            below = round_batch(pool, None, 1.0).first_ancestor[0] == ctx.drawn_node
            tree = top_tree(score, pool.depth, ctx.budget) & below
            tree[ctx.drawn_node] = True
        return tree, score


class RerankedSelection(SelectionStrategy):
    """Reranked: r(x1) prod_{i>=2} q_i, r a reranker's prediction from features known before verification."""

    name = "reranked"

    def __init__(self, reranker, source: str = ""):
        self.reranker, self.source = reranker, source

    def check(self, config) -> None:
        check_reranker(self.reranker, config, self.source)

    def first_factor(self, pool, ctx) -> np.ndarray:
        """(topk,) predicted first factors of this round's first-level candidates."""
        return np.asarray(self.reranker.predict_first_factor(ctx.features()), dtype=np.float64)

    def select(self, pool, ctx):
        factor = self.first_factor(pool, ctx)[None]
        score = rule_score(round_batch(pool, None, 1.0), "reranked", ctx.law, first_factor=factor)[0]
        return top_tree(score, pool.depth, ctx.budget), score


class CoveringDecoder(SelectionStrategy):
    """Covering decoder (App. D.10): draft selection, except that a draw labelling a leaf is emitted as
    the continuation and the leaf's row seeds the next round, which selects by root-draw selection."""

    name = "covering"
    carries_leaf_row = True

    def __init__(self):
        self.draft, self.root_draw = DraftSelection(), RootDrawSelection()

    def plan(self, root_known):
        return self.root_draw if root_known else self.draft


def check_reranker(reranker, config, source: str = "") -> None:
    """One-line StrategyError unless the reranker fits this run's label kind, pool topk and features."""
    from specrank.featurize.sets import resolve_features

    where = f"reranker {source}".strip()
    missing = [a for a in ("features_", "label_kind_", "topk_", "predict_first_factor") if not hasattr(reranker, a)]
    if missing:
        raise StrategyError(f"{where}: not a fitted specrank reranker (no {missing[0]})")
    kind = "argmax" if config.temperature == 0 else "probability"
    if reranker.label_kind_ != kind:
        raise StrategyError(f"{where}: trained on {reranker.label_kind_} labels, this run needs {kind}"
                            f" (temperature {config.temperature})")
    if int(reranker.topk_) != config.shape.topk:
        raise StrategyError(f"{where}: trained for pools with topk={reranker.topk_}, this run has topk="
                            f"{config.shape.topk}")
    try:
        resolve_features(list(reranker.features_))
    except ValueError as exc:
        raise StrategyError(f"{where}: feature schema mismatch: {exc}") from None


STRATEGIES = {
    "draft": DraftSelection,
    "root": RootSelection,
    "root-draw": RootDrawSelection,
    "pearl": PearlSelection,
    "covering": CoveringDecoder,
}
RULE_NAMES = tuple(STRATEGIES) + ("reranked",)


def make_strategy(name: str, reranker=None, source: str = "") -> SelectionStrategy:
    """The strategy called ``name``; ``reranked`` needs a loaded reranker."""
    if name == "reranked":
        if reranker is None:
            raise StrategyError("rule reranked needs a reranker (--reranker PATH or MLflow model URI)")
        return RerankedSelection(reranker, source)
    if name not in STRATEGIES:
        raise StrategyError(f"unknown online rule {name!r}; known: {', '.join(RULE_NAMES)}")
    return STRATEGIES[name]()


def draft_rank(pool: DraftPool) -> np.ndarray:
    """(M,) pool indices in draft order (SPEC §1 ranking)."""
    return rank_order(pool.draft_logp[None], pool.depth[None])[0]


def drawn_node(pool: DraftPool, token: int, topk: int) -> int:
    """Pool index of ``token`` on the first level, -1 when it is not there."""
    hit = np.flatnonzero(pool.token[:topk] == token)
    return int(hit[0]) if len(hit) else -1


def skips_tree_pass(rule: SelectionStrategy, tree: np.ndarray, node: int) -> bool:
    """A drawn first token with nothing of the tree to verify below it is the continuation itself."""
    if not rule.draws_first:
        return False
    if node < 0 or not tree[node]:
        return True
    return rule.counts_draw and int(tree.sum()) == 1


def forced_first_draw(logits: torch.Tensor, token: int) -> torch.Tensor:
    """``logits`` (n, V) with row 0 a point mass on ``token``: the verifier's first draw is the one made."""
    out = logits.clone()
    out[0] = float("-inf")
    out[0, token] = 0.0
    return out


def leaf_demotion(accepted: np.ndarray, tree: np.ndarray, parent: np.ndarray) -> bool:
    """True when the last accepted node is a leaf of the verified tree (covering decoder)."""
    return len(accepted) > 0 and not (tree & (parent == accepted[-1])).any()
