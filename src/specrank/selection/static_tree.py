"""vLLM's static draft tree (``speculative_token_tree``) and where its nodes lie in a recorded pool.

vLLM (vllm-project/vllm) reads the tree as a list of paths, e.g. ``[(0,), (1,), (0, 0), (1, 0)]``, sorted
breadth-first. It drafts level by level (``vllm/v1/spec_decode/eagle.py`` at 008603a39fff, ``propose_tree``):
the top c_1 tokens of the root's draft logits, then the top c_l tokens of every node of level l - 1, where
``child_drafts_per_level`` c_l = (paths of length l) // (paths of length l - 1). The attention mask links each
path to its listed ancestors (``vllm/v1/attention/backends/tree_attn.py`` at 00c457b61cf7,
``_prepare_tree_attn_bias``: an unlisted ancestor fails). A tree whose nodes of one level have different
numbers of children is drafted as if they had the same and masked by its labels, which then name other
tokens; a later version of the tree-attention code refuses such a tree
(``_assert_fixed_branching_factor_per_level``), and so does specrank.
The last index of a path only labels a slot: the drafter's top-c order fills it. So the drafted and verified
tree is fixed by the branching factors (c_1, ..., c_d) alone, and every node of it is verified (no budget
selection).

In a specrank pool the children of a node are one block of the pool's topk, best first, so the tree's nodes
are found by following first-child indices (``static_columns``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np


class StaticTreeError(ValueError):
    """A static tree vLLM would refuse; the message says why."""


@dataclass(frozen=True, order=True)
class StaticTree:
    """A vLLM static tree by its branching factors: every node of depth l - 1 has ``branching[l - 1]`` children."""

    branching: tuple[int, ...]

    def __post_init__(self):
        if not self.branching or any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1
                                     for c in self.branching):
            raise StaticTreeError(f"branching factors must be positive integers, got {self.branching!r}")

    @classmethod
    def from_choices(cls, choices) -> "StaticTree":
        """The tree vLLM drafts for ``speculative_token_tree`` (a string as vLLM's config holds it, or paths)."""
        if isinstance(choices, str):
            try:
                choices = ast.literal_eval(choices)
            except (ValueError, SyntaxError):
                raise StaticTreeError(f"not a list of paths: {choices!r}") from None
        try:
            paths = sorted({tuple(int(i) for i in p) for p in choices}, key=lambda t: (len(t), t))
        except (TypeError, ValueError):
            raise StaticTreeError(f"not a list of paths of integers: {choices!r}") from None
        if not paths or not paths[0] or len(paths) != len(list(choices)):
            raise StaticTreeError("a non-empty list of distinct, non-empty paths is needed")
        if min(min(p) for p in paths) < 0:
            raise StaticTreeError("path indices must be >= 0")
        listed = set(paths)
        for p in paths:
            if len(p) > 1 and p[:-1] not in listed:
                raise StaticTreeError(f"path {p} has no parent {p[:-1]} in the tree (vLLM requires every ancestor)")
        counts = {}
        for p in paths:
            counts[p[:-1]] = counts.get(p[:-1], 0) + 1
        branching = []
        for level in range(len(paths[-1])):
            parents = [(), ] if level == 0 else [p for p in paths if len(p) == level]
            sizes = {counts.get(p, 0) for p in parents}
            if len(sizes) != 1:
                raise StaticTreeError(f"variable branching at depth {level} (children per node: {sorted(sizes)});"
                                      " vLLM requires the same number of children for every node of a level")
            branching.append(sizes.pop())
        return cls(tuple(branching))

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def widths(self) -> tuple[int, ...]:
        """Nodes per depth (index 0 = depth 1)."""
        return tuple(int(np.prod(self.branching[: i + 1])) for i in range(self.depth))

    @property
    def size(self) -> int:
        """Draft tokens verified beside the root (vLLM's ``num_speculative_tokens``)."""
        return sum(self.widths)

    @property
    def choices(self) -> list[tuple[int, ...]]:
        """The paths in vLLM's breadth-first order, each child labelled by its rank among its siblings."""
        out, level = [], [()]
        for c in self.branching:
            level = [p + (i,) for p in level for i in range(c)]
            out += level
        return out

    @property
    def parents(self) -> np.ndarray:
        """(size,) each node's parent as a position in ``choices`` order, -1 at depth 1."""
        out, start = [-1] * self.branching[0], 0
        for d in range(1, self.depth):
            width = self.widths[d - 1]
            out += [start + i for i in range(width) for _ in range(self.branching[d])]
            start += width
        return np.array(out, dtype=np.int64)

    @property
    def label(self) -> str:
        return "vllm-tree-" + "x".join(str(c) for c in self.branching)

    def full_pool(self) -> tuple[int, int, int]:
        """(topk, depth, expand) of the smallest specrank pool that holds this tree in every round: every node
        of a level expanded, each with the tree's widest branching."""
        topk = max(self.branching)
        return topk, self.depth, topk ** (self.depth - 1)


def first_child(parent: np.ndarray) -> np.ndarray:
    """(N, M) the lowest pool index of each node's children, -1 for a node that was not expanded."""
    n, m = parent.shape
    out = np.full(n * m, m, dtype=np.int64)
    rows, cols = np.nonzero(parent >= 0)
    np.minimum.at(out, rows * m + parent[rows, cols].astype(np.int64), cols)
    out = out.reshape(n, m)
    out[out == m] = -1
    return out


def static_columns(tree: StaticTree, parent: np.ndarray, first: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(columns (N, size) of the tree's nodes in ``choices`` order, contained (N,) bool) in pools whose
    children come as blocks, best first. ``first`` (N, branching[0]): the first-level columns to use (default:
    the drafter's top ones, columns 0..c_1 - 1); a reranked engine would pick them by another score. A round
    whose pool did not expand a node of the tree, or gave it fewer children than the tree asks, does not
    contain it (its columns there are meaningless)."""
    n, m = parent.shape
    starts = first_child(parent)
    level = np.tile(np.arange(tree.branching[0]), (n, 1)) if first is None else np.asarray(first, dtype=np.int64)
    levels, contained = [level], np.ones(n, dtype=bool)
    for c in tree.branching[1:]:
        start = np.take_along_axis(starts, level, axis=1)  # (N, width)
        contained &= (start >= 0).all(axis=1)
        child = (np.maximum(start, 0)[:, :, None] + np.arange(c)).reshape(n, -1)
        inside = child < m
        child = np.minimum(child, m - 1)
        contained &= inside.all(axis=1) & (np.take_along_axis(parent, child, axis=1)
                                           == np.repeat(level, c, axis=1)).all(axis=1)
        levels.append(child)
        level = child
    return np.concatenate(levels, axis=1), contained
