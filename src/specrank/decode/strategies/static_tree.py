"""vLLM's static tree as an online strategy: every round verifies the same shape (``selection.static_tree``)."""

from __future__ import annotations

import numpy as np

from specrank.decode.strategies.base import SelectionStrategy, StrategyError, draft_scores
from specrank.selection.static_tree import StaticTree, static_columns


class StaticTreeSelection(SelectionStrategy):
    """The static tree ``tree``: the top c_1 first tokens, then the top c_l children of each node of the level
    above, all verified. The pool must expand every node down to the tree's depth (``StaticTree.full_pool``)
    and the budget must be the tree's size, so the tree is found in every round."""

    name = "static_tree"

    def __init__(self, tree: StaticTree):
        self.tree = tree

    def check(self, config, *, law: bool = True) -> None:
        shape, tree = config.shape, self.tree
        added, expanded = shape.level_sizes()
        full = shape.topk >= tree.branching[0] and shape.branching >= max(tree.branching[1:], default=1) and (
            shape.depth >= tree.depth and all(expanded[i] == added[i] for i in range(tree.depth - 1)))
        if not full:
            topk, depth, expand = tree.full_pool()
            raise StrategyError(f"static tree {tree.label}: the pool (topk {shape.topk}, depth {shape.depth},"
                                f" expand {shape.expand}) does not expand every node to depth {tree.depth};"
                                f" use topk {topk}, depth {depth}, expand {expand}")
        if config.budget != tree.size:
            raise StrategyError(f"static tree {tree.label}: budget {config.budget} is not the tree's size"
                                f" {tree.size} (a static tree verifies all its nodes)")

    def select(self, pool, ctx):
        columns, contained = static_columns(self.tree, pool.parent[None])
        if not contained[0]:
            raise StrategyError(f"static tree {self.tree.label}: a node of the tree was not expanded this round")
        tree = np.zeros(len(pool), bool)
        tree[columns[0]] = True
        return tree, draft_scores(pool)
