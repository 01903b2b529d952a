"""The bottom of decode: the pool shape, the pool, the Drafter interface, masks and device parsing.

Draft pool growth (docs/design.md, pool growth).

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


class ModelLoadError(ValueError):
    """A target or drafter cannot be loaded as asked."""


class PoolShapeError(ValueError):
    """A pool shape parameter is out of range."""


@dataclass(frozen=True)
class PoolShape:
    """Pool growth parameters (EAGLE-3 shape by default): ``topk`` first-level candidates, each expanded node's
    ``children`` best children below them (0: ``topk``), the ``expand`` best new candidates of each later level
    expanded, ``depth`` levels. ``PoolShape(k, d, k, children=1)`` is a fan of chains: the drafter's top k first
    tokens, each continued by the drafter's greedy chain, as an engine drafts k chains in one batched pass."""

    topk: int = 10
    depth: int = 8
    expand: int = 10
    children: int = 0

    def __post_init__(self):
        for name in ("topk", "depth", "expand", "children"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (name != "children"):
                kind = "a non-negative" if name == "children" else "a positive"
                raise PoolShapeError(f"pool {name} must be {kind} integer, got {value!r}")

    @property
    def branching(self) -> int:
        """Children drafted below each expanded node."""
        return self.children or self.topk

    def level_sizes(self) -> tuple[list[int], list[int]]:
        """Candidates per depth and expanded nodes per depth (index 0 = depth 1)."""
        added, expanded = [self.topk], []
        for d in range(1, self.depth):
            expanded.append(added[-1] if d == 1 else min(self.expand, added[-1]))
            added.append(expanded[-1] * self.branching)
        return added, expanded + [0]

    def as_manifest(self) -> dict:
        """The shape as a run's manifest records it (``children`` only where it differs from topk's default)."""
        fields = {"topk": int(self.topk), "depth": int(self.depth), "expand": int(self.expand)}
        return fields | ({"children": int(self.children)} if self.children else {})

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
    first_ancestor: np.ndarray | None = None  # int64, pool index of each candidate's depth-1 ancestor (from growth)

    def __len__(self) -> int:
        return len(self.token)


@dataclass
class RootStep:
    """What a drafter's root forward leaves for tree growth."""

    logp: torch.Tensor  # (Vd,) float32 log-probabilities over the draft vocabulary
    feed: torch.Tensor | None  # (F,) per-node input the root's children receive (EAGLE-3 hidden)
    visible: int  # cache length after the root: positions every tree node attends to
    position: int  # position id of the root


def parse_device(device) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a ``torch.device``; anything else is refused."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"unknown device {device!r} (use cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"unknown device {device!r} (use cpu, cuda or cuda:N)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    return dev


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` (on the host) on ``device`` without the host waiting for the device: a CUDA copy goes through
    page-locked memory and does not block (PyTorch's caching host allocator keeps the staging buffer until the
    copy has run), where a plain ``.to(device)`` from pageable memory waits for every queued kernel first."""
    device = torch.device(device)
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def host_arrays(*tensors: torch.Tensor) -> list[np.ndarray]:
    """``tensors`` as host numpy arrays in one device-to-host copy (a CUDA copy waits for the device once; each
    ``.cpu()`` would wait again). Host tensors are viewed, not copied."""
    if all(t.device.type == "cpu" for t in tensors):
        return [t.numpy() for t in tensors]
    flat = [t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    host = torch.cat(flat).cpu().numpy()
    out, start = [], 0
    for t, f in zip(tensors, flat):
        out.append(host[start : start + f.numel()].view(torch_numpy_dtype(t.dtype)).reshape(tuple(t.shape)))
        start += f.numel()
    return out


def torch_numpy_dtype(dtype: torch.dtype):
    """The numpy dtype of a torch dtype (bool, integers, float16/32/64)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def causal_mask(n: int, past: int) -> torch.Tensor:
    """(n, past + n) additive mask: n new tokens after ``past`` cached ones, causal among themselves."""
    return torch.full((n, past + n), float("-inf")).triu_(past + 1)


def additive_mask(mask, dtype) -> torch.Tensor:
    """An additive float mask in ``dtype`` (-inf becomes the dtype's minimum; booleans are refused)."""
    if mask.dtype == torch.bool:
        raise ValueError("mask must be additive float (0 attend, -inf masked), not boolean")
    return mask.to(dtype).clamp_min(torch.finfo(dtype).min)


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
    _graphs: bool | None = None

    @property
    def graphs(self) -> bool:
        """Whether the drafter's small passes run as captured CUDA graphs (``decode.graphs``): by default on a
        CUDA device; True on the CPU runs the same fixed-shape passes eagerly (tests only)."""
        device = getattr(self, "device", None)
        return (device is not None and device.type == "cuda") if self._graphs is None else self._graphs

    @graphs.setter
    def graphs(self, value: bool | None) -> None:
        self._graphs = None if value is None else bool(value)

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
        target works (``decode.pipeline``); an in-process drafter grows it in ``receive_pool``."""
        self._requested = (int(root_token), shape)

    def receive_pool(self) -> DraftPool:
        """The pool asked for by ``request_pool``; ``draft_window`` is when it was drafted (``perf_counter``)."""
        root, shape = self._requested
        start = time.perf_counter()
        pool = self.grow_pool(root, shape)
        self.draft_window = (start, time.perf_counter())
        return pool

    def grow_pool(self, root_token, shape: PoolShape = PoolShape()) -> DraftPool:
        """Grow one pool (docs/design.md, pool growth) below ``root_token``; the drafter's cache is left at the
        committed context."""
        root = self._draft_root(int(root_token))
        try:
            return self._grow(root, shape)
        finally:
            self._rewind()

    def _to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.draft_to_target is None else self.draft_to_target[draft_ids]

    def _root_row(self, logp: torch.Tensor) -> torch.Tensor:
        q = torch.zeros(self.vocab_size, dtype=torch.float32, device=logp.device)
        ids = torch.arange(len(logp), device=logp.device) if self.draft_to_target is None else self.draft_to_target
        return q.index_put_((ids,), logp.exp())

    def _grow(self, root: RootStep, shape: PoolShape) -> DraftPool:
        # Growth stays on the drafter's device and every level's size and depth are known from the shape,
        # so the host never waits on the device before the finished pool is copied back (one sync a round).
        k, c, m = shape.topk, shape.branching, shape.size
        if max(k, c) > len(root.logp):
            raise PoolShapeError(f"pool topk {max(k, c)} exceeds the draft vocabulary ({len(root.logp)})")
        dev = root.logp.device
        token, parent = torch.zeros(m, dtype=torch.long, device=dev), torch.full((m,), -1, device=dev)
        edge, cum = (torch.zeros(m, dtype=torch.float32, device=dev) for _ in range(2))
        ancestors = torch.zeros(m, shape.n_expanded, dtype=torch.bool, device=dev)  # tree slots on the path
        feeds = None if root.feed is None else root.feed.new_empty(m, root.feed.shape[-1])
        first = torch.arange(m, device=dev)  # depth-1 ancestors, carried down as the pool grows (scores read them)

        lp, ids = root.logp.topk(k)  # (k,), sorted descending
        token[:k], edge[:k], cum[:k] = self._to_target(ids), lp, lp
        if feeds is not None:
            feeds[:k] = root.feed
        frontier, n, used = torch.arange(k, device=dev), k, 0  # used: tree slots already in the cache
        for d in range(1, shape.depth):  # the frontier is at depth d; adds depth d + 1
            f = len(frontier)
            sees = ancestors[frontier, : used + f]  # (f, used + f), a copy
            sees[:, used:] = torch.eye(f, dtype=torch.bool, device=dev)  # each node sees itself
            positions = torch.full((f,), root.position + d, device=dev)
            step_feed = None if feeds is None else feeds[frontier]
            logp, child_feed = self._draft_step(token[frontier], positions, self._tree_mask(sees, root.visible),
                                                step_feed)
            used += f
            lp, ids = logp.topk(c, dim=-1)  # (f, c)
            new = slice(n, n + f * c)
            token[new], edge[new] = self._to_target(ids.reshape(-1)), lp.reshape(-1)
            parent[new] = frontier.repeat_interleave(c)
            cum[new] = cum[parent[new]] + edge[new]
            first[new] = first[parent[new]]
            if feeds is not None:
                feeds[new] = child_feed.repeat_interleave(c, 0)
            if d < shape.depth - 1:  # ties: pool index (a stable sort)
                ancestors[new, :used] = sees.repeat_interleave(c, 0)
                frontier = n + cum[new].sort(descending=True, stable=True).indices[: shape.expand]
            n += f * c
        # the round's one copy to the host (8-byte integers first: every array stays aligned in the packed copy)
        token, parent, first, edge, cum, q_root = host_arrays(token, parent, first, edge, cum,
                                                              self._root_row(root.logp))
        depth = np.repeat(np.arange(1, shape.depth + 1), shape.level_sizes()[0])
        expanded = np.zeros(m, bool)
        expanded[parent[parent >= 0]] = True
        return DraftPool(token, parent, depth, np.exp(edge), cum, expanded, q_root, first)

    @staticmethod
    def _tree_mask(sees: torch.Tensor, visible: int) -> torch.Tensor:
        """(f, visible + s) additive mask from ``sees`` (f, s), the tree slots each node attends to
        (its ancestors and itself); every node sees the committed context and the root."""
        mask = torch.zeros(sees.shape[0], visible + sees.shape[1], dtype=torch.float32, device=sees.device)
        mask[:, visible:].masked_fill_(~sees, float("-inf"))
        return mask
