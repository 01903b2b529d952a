"""The selection-strategy interface (docs/design.md, online decoders; target-row reuse, arXiv 2610.29210,
§5.4, App. D.3, D.10) and the helpers strategies share.

A strategy picks the verified tree of a round from the pool, and says whether it needs the
root row first (a root pass whose KV the tree pass reuses), whether it draws the first token
from that row before selecting (root_draw, PEARL-style, root), and whether realized
acceptance counts that drawn token. Scores come from ``specrank.selection`` on a one-round
``PoolBatch``, so an online tree is exactly the tree the offline score selects on the same pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from specrank.decode.core import DraftPool
from specrank.selection import DraftGroups, PoolBatch, rank_order, select_top


class StrategyError(ValueError):
    """An online strategy cannot run with these inputs (unknown name, incompatible reranker)."""


@dataclass
class RoundContext:
    """What a strategy may read when it selects: all of it known before verification."""

    budget: int
    law: str  # "greedy" or "sampling" (DecodeConfig.law)
    temperature: float
    root_logits: torch.Tensor | None  # (V,) the root row's logits, None before any target pass
    drawn_node: int  # pool index of the drawn first token on the first level, -1 when off it or no draw
    features: Callable[..., object]  # (groups) -> features of this round's first-level candidates (computed once)
    first_factor: np.ndarray | None = None  # (topk,) a reranking strategy's predictions, set by the round (timed)
    inputs: Callable[..., object] | None = None  # (rows) -> the features kernel's inputs (featurize.RoundInputs)
    task: str = ""  # the prompt's task (a feature of the context group)


def round_batch(pool: DraftPool, root_logits: torch.Tensor | None, temperature: float) -> PoolBatch:
    """A one-round PoolBatch of ``pool``; first-level target probabilities from the root row when known."""
    m = len(pool)
    p_edge, p_argmax = np.full(m, np.nan, np.float32), np.zeros(m, np.int8)
    if root_logits is not None:
        first = torch.from_numpy(pool.token[pool.parent < 0]).to(root_logits.device)
        probs = torch.softmax(root_logits.float() / (temperature or 1.0), -1)
        p_edge[pool.parent < 0] = probs[first].cpu().numpy()
        p_argmax[pool.parent < 0] = (first == root_logits.argmax()).cpu().numpy()
    arrays = dict(token=pool.token, parent=pool.parent, depth=pool.depth, q_edge=pool.q_edge,
                  draft_logp=pool.draft_logp, p_edge=p_edge, p_argmax_child=p_argmax)
    batch = PoolBatch(**{k: v[None] for k, v in arrays.items()})
    return batch if pool.first_ancestor is None else batch.with_first_ancestor(pool.first_ancestor[None])


def top_tree(score: np.ndarray, depth: np.ndarray, budget: int) -> np.ndarray:
    """(M,) bool: the top-``budget`` candidates under ``score`` (docs/design.md, ranking and ties)."""
    return select_top(score[None], depth[None], budget)[0]


def draft_scores(pool: DraftPool) -> np.ndarray:
    """(M,) float64 cumulative draft log-probabilities: draft selection's ranking score."""
    return pool.draft_logp.astype(np.float64)


def draft_rank(pool: DraftPool) -> np.ndarray:
    """(M,) pool indices in draft order (docs/design.md, ranking and ties)."""
    return rank_order(pool.draft_logp[None], pool.depth[None])[0]


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
    counts_draw = False  # realized acceptance counts the drawn token (root_draw, PEARL-style)
    carries_leaf_row = False  # covering: a draw labelling a leaf is emitted, its row seeds the next round
    reranks = False  # selection runs a reranker (timed as reranker inference)
    needs_rows = False  # selection reads retained target rows (the row caches are kept)

    def plan(self, root_known: bool) -> "SelectionStrategy":
        """The strategy acting in a round (the covering strategy switches on a carried root row)."""
        return self

    def check(self, config, *, law: bool = True) -> None:
        """Raise a one-line error before decoding when this strategy cannot run under ``config``; ``law=False``
        leaves out what depends on the decoding law (its temperature is not known yet)."""

    def draw(self, root_logits: torch.Tensor, pool: DraftPool, verifier, generator) -> int:
        """The first token, drawn from the target root row exactly as the verifier would."""
        return verifier.draw(root_logits, generator)

    def first_factor(self, pool: DraftPool, ctx: RoundContext) -> np.ndarray | None:
        """(topk,) the first-level candidates' predicted first factors (features plus inference, the round's
        ``rerank`` time) of a strategy that ``reranks``; None for the others."""
        return None

    def select(self, pool: DraftPool, ctx: RoundContext) -> tuple[np.ndarray, np.ndarray]:
        """(tree (M,) bool, ranking score (M,)) of this round."""
        score = draft_scores(pool)
        return top_tree(score, pool.depth, ctx.budget), score


def drawn_node(pool: DraftPool, token: int, topk: int) -> int:
    """Pool index of ``token`` on the first level, -1 when it is not there."""
    hit = np.flatnonzero(pool.token[:topk] == token)
    return int(hit[0]) if len(hit) else -1


def skips_tree_pass(acting: SelectionStrategy, tree: np.ndarray, node: int) -> bool:
    """A drawn first token with nothing of the tree to verify below it is the continuation itself."""
    if not acting.draws_first:
        return False
    if node < 0 or not tree[node]:
        return True
    return acting.counts_draw and int(tree.sum()) == 1


def leaf_demotion(accepted: np.ndarray, tree: np.ndarray, parent: np.ndarray) -> bool:
    """True when the last accepted node is a leaf of the verified tree (covering strategy)."""
    return len(accepted) > 0 and not (tree & (parent == accepted[-1])).any()
