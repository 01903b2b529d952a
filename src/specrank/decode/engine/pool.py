"""Draft pool growth (SPEC §1.1): the pool shape, the pool, and the Drafter interface.

Growth, for ``topk=k``, ``depth=D``, ``expand=e``: the root row gives the ``k``
depth-1 candidates, all expanded. Each of the ``D-1`` following steps runs one
drafter forward over the nodes expanded at the previous step (under a tree mask,
on top of the drafter's KV cache) and adds the ``k`` most probable children of
each; after each of the first ``D-2`` steps the ``e`` new candidates with the
highest cumulative draft log-probability (ties: pool index) are expanded.
Defaults give 710 candidates, 70 of them expanded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch


class PoolShapeError(ValueError):
    """A pool shape parameter is out of range."""


@dataclass(frozen=True)
class PoolShape:
    """Pool growth parameters (EAGLE-3 shape by default)."""

    topk: int = 10
    depth: int = 8
    expand: int = 10

    def __post_init__(self):
        for name in ("topk", "depth", "expand"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise PoolShapeError(f"pool {name} must be a positive integer, got {value!r}")

    def level_sizes(self) -> tuple[list[int], list[int]]:
        """Candidates per depth and expanded nodes per depth (index 0 = depth 1)."""
        added, expanded = [self.topk], []
        for d in range(1, self.depth):
            expanded.append(added[-1] if d == 1 else min(self.expand, added[-1]))
            added.append(expanded[-1] * self.topk)
        return added, expanded + [0]

    @property
    def size(self) -> int:
        """M, the number of candidates."""
        return sum(self.level_sizes()[0])

    @property
    def n_expanded(self) -> int:
        return sum(self.level_sizes()[1])


@dataclass
class DraftPool:
    """One round's candidates in pool order (depth-1 first by descending draft probability;
    parents precede children). Arrays of shape (M,); ``q_root`` is the drafter's full
    root row (V,) over the target vocabulary."""

    token: np.ndarray  # int64
    parent: np.ndarray  # int64, -1 = the root
    depth: np.ndarray  # int64, 1..D
    q_edge: np.ndarray  # float32, drafter probability at the parent
    draft_logp: np.ndarray  # float32, cumulative log-probability of the path
    expanded: np.ndarray  # bool, children are in the pool
    q_root: np.ndarray | None = None  # float32 (V,)

    def __len__(self) -> int:
        return len(self.token)


@dataclass
class RootStep:
    """What a drafter's root forward leaves for tree growth."""

    logp: torch.Tensor  # (Vd,) float32 log-probabilities over the draft vocabulary
    feed: torch.Tensor | None  # (F,) per-node input the root's children receive (EAGLE-3 hidden)
    visible: int  # cache length after the root: positions every tree node attends to
    position: int  # position id of the root


def causal_mask(n: int, past: int) -> torch.Tensor:
    """(n, past + n) additive mask: n new tokens after ``past`` cached ones, causal among themselves."""
    return torch.full((n, past + n), float("-inf")).triu_(past + 1)


def draft_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """float32 log-softmax over the last axis, clamped at 0 so cumulative scores never rise along a path."""
    return torch.log_softmax(logits.float(), dim=-1).clamp_max_(0.0)


class Drafter:
    """Grows a pool from the committed context.

    A round asks for its pool with ``request_pool`` and takes it with ``receive_pool``: whatever the
    target does in between (the root pass) overlaps drafting when the drafter runs elsewhere.
    Subclasses implement ``start``, ``commit`` and three hooks: ``_draft_root`` (forward
    whatever committed tokens are pending plus the root), ``_draft_step`` (one batched
    forward over tree nodes) and ``_rewind`` (drop tree positions from the KV cache).
    """

    hidden_layers: tuple[int, ...] | None = None
    spec: str = ""  # how it was loaded, for the run manifest
    vocab_size: int  # the target's vocabulary size
    draft_to_target: torch.Tensor | None = None  # (Vd,) target id of each draft id, None = identity
    draft_window: tuple[float, float] = (0.0, 0.0)  # perf_counter span of the last pool's drafting

    def start(self, prompt_ids, target_hidden=None) -> None:
        """Reset to the committed prompt ``prompt_ids`` (n,) (target hidden states (n, k*H) if needed)."""
        raise NotImplementedError

    def commit(self, tokens, target_hidden=None) -> None:
        """Append committed tokens (the root + accepted path) and, if needed, their target hidden states."""
        raise NotImplementedError

    def _draft_root(self, root_token: int) -> RootStep:
        raise NotImplementedError

    def _draft_step(self, tokens, positions, mask, feed):
        """tokens, positions (n,); mask (n, past + n) additive; feed (n, F) or None
        -> (logp (n, Vd) float32, feed for the children (n, F) or None)."""
        raise NotImplementedError

    def _rewind(self) -> None:
        raise NotImplementedError

    def request_pool(self, root_token, shape: PoolShape = PoolShape()) -> None:
        """Ask for the pool below ``root_token``: a drafter in its own process starts drafting now, while the
        target works (``engine.pipeline``); an in-process drafter grows it in ``receive_pool``."""
        self._requested = (int(root_token), shape)

    def receive_pool(self) -> DraftPool:
        """The pool asked for by ``request_pool``; ``draft_window`` is when it was drafted (``perf_counter``)."""
        root, shape = self._requested
        start = time.perf_counter()
        pool = self.grow_pool(root, shape)
        self.draft_window = (start, time.perf_counter())
        return pool

    def grow_pool(self, root_token, shape: PoolShape = PoolShape()) -> DraftPool:
        """Grow one pool (SPEC §1.1) below ``root_token``; the drafter's cache is left at the committed context."""
        root = self._draft_root(int(root_token))
        try:
            return self._grow(root, shape)
        finally:
            self._rewind()

    def _to_target(self, draft_ids: torch.Tensor) -> np.ndarray:
        ids = draft_ids if self.draft_to_target is None else self.draft_to_target[draft_ids]
        return ids.cpu().numpy()

    def _root_row(self, logp: torch.Tensor) -> np.ndarray:
        q = torch.zeros(self.vocab_size, dtype=torch.float32, device=logp.device)
        ids = torch.arange(len(logp), device=logp.device) if self.draft_to_target is None else self.draft_to_target
        q[ids] = logp.exp()
        return q.cpu().numpy()

    def _grow(self, root: RootStep, shape: PoolShape) -> DraftPool:
        k, m = shape.topk, shape.size
        if k > len(root.logp):
            raise PoolShapeError(f"pool topk {k} exceeds the draft vocabulary ({len(root.logp)})")
        token, parent, depth = np.zeros(m, np.int64), np.full(m, -1, np.int64), np.ones(m, np.int64)
        edge, cum = np.zeros(m, np.float32), np.zeros(m, np.float32)
        expanded, slot = np.zeros(m, bool), np.full(m, -1, np.int64)
        feeds = None if root.feed is None else root.feed.new_empty(m, root.feed.shape[-1])

        lp, ids = root.logp.topk(k)  # (k,), sorted descending
        token[:k], edge[:k], cum[:k] = self._to_target(ids), lp.cpu().numpy(), lp.cpu().numpy()
        if feeds is not None:
            feeds[:k] = root.feed
        frontier, n, past = np.arange(k), k, root.visible
        for d in range(1, shape.depth):  # adds depth d + 1
            expanded[frontier] = True
            f = len(frontier)
            mask = self._tree_mask(frontier, parent, slot, root.visible, past)
            slot[frontier] = past + np.arange(f)
            step_feed = None if feeds is None else feeds[torch.from_numpy(frontier).to(feeds.device)]
            positions = torch.from_numpy(root.position + depth[frontier])
            logp, child_feed = self._draft_step(torch.from_numpy(token[frontier]), positions, mask, step_feed)
            past += f
            lp, ids = logp.topk(k, dim=-1)  # (f, k)
            new = n + np.arange(f * k)
            token[new], parent[new], depth[new] = self._to_target(ids.reshape(-1)), np.repeat(frontier, k), d + 1
            edge[new] = lp.reshape(-1).cpu().numpy()
            cum[new] = cum[parent[new]] + edge[new]
            if feeds is not None:
                feeds[n : n + f * k] = child_feed.repeat_interleave(k, 0)
            n += f * k
            if d < shape.depth - 1:
                frontier = new[np.argsort(-cum[new], kind="stable")[: shape.expand]]
        return DraftPool(token, parent, depth, np.exp(edge), cum, expanded, self._root_row(root.logp))

    @staticmethod
    def _tree_mask(frontier, parent, slot, visible: int, past: int) -> torch.Tensor:
        """(f, past + f) additive mask: the committed context and root, the node's ancestors, itself."""
        f = len(frontier)
        allowed = np.zeros((f, past + f), bool)
        allowed[:, :visible] = True
        allowed[np.arange(f), past + np.arange(f)] = True
        rows, cur = np.arange(f), parent[frontier]
        while (cur >= 0).any():  # at most depth - 1 times
            on = cur >= 0
            allowed[rows[on], slot[cur[on]]] = True
            cur = np.where(on, parent[np.maximum(cur, 0)], -1)
        mask = torch.zeros(allowed.shape, dtype=torch.float32)
        return mask.masked_fill_(torch.from_numpy(~allowed), float("-inf"))
