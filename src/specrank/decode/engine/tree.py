"""The scored set of one verification pass: rows, positions and the tree attention mask.

Pass rows come in a fixed order: the root, the verified tree, the remaining expanded
nodes, then the remaining top-M candidates by draft rank; within each group, pool order
(parents precede children). Every prefix attends to the committed context and to its own
ancestors only, so extra prefixes leave the tree's rows unchanged up to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specrank.decode.core import to_device


class TreeError(ValueError):
    """A scored set that is not ancestor-closed or has inconsistent inputs."""


@dataclass
class ScoredSet:
    pool_index: np.ndarray  # (n,) pool index of each pass row, -1 for the root (row 0)
    row_of: np.ndarray  # (M,) pass row of each pool candidate, -1 where unscored
    parent_row: np.ndarray  # (n,) pass row of each row's parent, -1 for the root
    n_tree: int  # rows 1..n_tree hold the verified tree
    input_ids: torch.Tensor  # (n,)
    position_ids: torch.Tensor  # (n,) context length + depth
    ancestors: torch.Tensor  # (n, n) bool, [i, j]: row j is row i or one of its ancestors

    @property
    def n(self) -> int:
        return len(self.pool_index)


def scored_set(
    root_token: int,
    token: np.ndarray,
    parent: np.ndarray,
    depth: np.ndarray,
    expanded: np.ndarray,
    tree: np.ndarray,
    draft_rank: np.ndarray,
    extra: int,
    context_len: int,
) -> ScoredSet:
    """Assemble root + ``tree`` (M,) bool + expanded + top-``extra`` of ``draft_rank`` (pool indices, best first)."""
    m = len(token)
    top = np.zeros(m, dtype=bool)
    top[draft_rank[:extra]] = True
    in_exp = expanded.astype(bool) & ~tree
    in_extra = top & ~tree & ~in_exp
    pool_index = np.concatenate([[-1], np.flatnonzero(tree), np.flatnonzero(in_exp), np.flatnonzero(in_extra)])
    n = len(pool_index)
    row_of = np.full(m, -1, dtype=np.int64)
    row_of[pool_index[1:]] = np.arange(1, n)
    par = parent[pool_index[1:]]
    parent_row = np.concatenate([[-1], np.where(par < 0, 0, row_of[np.maximum(par, 0)])])
    if (parent_row[1:] < 0).any():
        bad = pool_index[1:][parent_row[1:] < 0][0]
        raise TreeError(f"scored set is not ancestor-closed: parent of pool candidate {bad} is not scored")
    row_depth = np.concatenate([[0], depth[pool_index[1:]]]).astype(np.int64)
    ids = np.concatenate([[root_token], token[pool_index[1:]]]).astype(np.int64)
    return ScoredSet(
        pool_index=pool_index,
        row_of=row_of,
        parent_row=parent_row,
        n_tree=int(tree.sum()),
        input_ids=torch.from_numpy(ids),
        position_ids=torch.from_numpy(context_len + row_depth),
        ancestors=ancestor_matrix(parent_row, int(row_depth.max())),
    )


def ancestor_matrix(parent_row: np.ndarray, max_depth: int) -> torch.Tensor:
    """(n, n) bool: row i sees row j iff j is i or an ancestor of i (``parent_row[0] = -1``)."""
    n = len(parent_row)
    step = np.where(parent_row < 0, 0, parent_row)  # the root is its own parent
    anc = np.eye(n, dtype=bool)
    cur = np.arange(n)
    for _ in range(max_depth):  # loop over depth (<= 8), not over nodes
        cur = step[cur]
        anc[np.arange(n), cur] = True
    return torch.from_numpy(anc)


def attention_mask(ancestors: torch.Tensor, context_len: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """(n, context_len + n) additive float mask on ``device`` (default: the host): 0 where visible, -inf elsewhere.

    Built where the target runs: on a GPU machine a host mask of a long context and a large tree is a fresh
    allocation past the C allocator's mmap threshold (128 KB) each round, whose page faults cost milliseconds."""
    n = ancestors.shape[0]
    mask = torch.zeros(n, context_len + n, dtype=dtype, device=device)
    # the context is visible: only the tree is filled
    mask[:, context_len:].masked_fill_(~to_device(ancestors, mask.device), float("-inf"))
    return mask
