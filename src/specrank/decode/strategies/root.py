"""Decoders that read the root row from a separate root pass: root selection, root-draw selection and the
PEARL-style strategy (target-row reuse, arXiv 2610.29210, §5.4, App. D.14)."""

from __future__ import annotations

import numpy as np

from specrank.decode.strategies.base import (
    SelectionStrategy, branch_tree, draft_scores, round_batch, top_tree,
)
from specrank.selection import score_of


class RootSelection(SelectionStrategy):
    """Root selection: p(x1|c) prod q, with the root row from a root pass; draws its first token first
    and skips the tree pass when the draw is not on the tree (App. D.14)."""

    name = "root"
    needs_root_pass = True
    draws_first = True

    def select(self, pool, ctx):
        score = score_of(round_batch(pool, ctx.root_logits, ctx.temperature), "root", ctx.law)[0]
        return top_tree(score, pool.depth, ctx.budget), score


class RootDrawSelection(SelectionStrategy):
    """Root-draw selection: the drawn token and its B-1 best draft-ranked descendants."""

    name = "root_draw"
    needs_root_pass = True
    draws_first = True
    counts_draw = True

    def select(self, pool, ctx):
        return branch_tree(pool, ctx.drawn_node, ctx.budget), draft_scores(pool)


class PearlSelection(SelectionStrategy):
    """PEARL-style: draft selection's B-node tree pruned to the drawn token's subtree (or the token alone)."""

    name = "pearl"
    needs_root_pass = True
    draws_first = True
    counts_draw = True

    def select(self, pool, ctx):
        score = draft_scores(pool)
        tree = np.zeros(len(pool), bool)
        if ctx.drawn_node >= 0:
            below = round_batch(pool, None, 1.0).first_ancestor[0] == ctx.drawn_node
            tree = top_tree(score, pool.depth, ctx.budget) & below
            tree[ctx.drawn_node] = True
        return tree, score
