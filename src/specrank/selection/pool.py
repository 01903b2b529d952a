"""Batched candidate pools: N rounds x M candidates, validated, with path probabilities."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from specrank.law import LAW_NAMES, Law, LawError
from specrank.schema import POOL_COLUMNS, require_columns
from specrank.selection.select import SelectionError, ancestors, cumulate


class PoolError(SelectionError):
    """A pool array is malformed; the message names the field."""


def check_law(law: Law | str) -> str:
    """The name of ``law`` (a ``Law`` or its name), or a one-line error naming the known laws."""
    try:
        return Law.of(law).name
    except LawError:
        raise PoolError(f"law: expected one of {', '.join(LAW_NAMES)}, got {law!r}") from None


def _first_bad(mask: np.ndarray) -> str:
    """Describe the first True cell of an (N, M) mask as 'round r, candidate j'."""
    r, j = np.argwhere(mask)[0]
    return f"round {r}, candidate {j}"


@dataclass(eq=False)
class PoolBatch:
    """N recorded rounds of M pool candidates each, in pool order (parents precede children).

    Every pool array has shape (N, M). ``p_edge`` is the target probability of the
    edge at the parent's row (NaN where unscored); ``p_argmax_child`` is 1 where the
    token is the target argmax at its parent (the greedy law's point mass).
    ``prompt_id`` and ``task`` are optional per-round labels of shape (N,).
    """

    token: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    q_edge: np.ndarray
    draft_logp: np.ndarray
    p_edge: np.ndarray
    p_argmax_child: np.ndarray
    prompt_id: np.ndarray | None = None
    task: np.ndarray | None = None
    # derived arrays (ancestors, path probabilities); the pool arrays are treated as read-only
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        for name in POOL_COLUMNS:
            setattr(self, name, np.asarray(getattr(self, name)))
        for name in ("prompt_id", "task"):
            if getattr(self, name) is not None:
                setattr(self, name, np.asarray(getattr(self, name)))

    @property
    def shape(self) -> tuple[int, int]:
        return self.token.shape

    @property
    def n_rounds(self) -> int:
        return self.token.shape[0]

    @property
    def n_first(self) -> int:
        """Number of first-level candidates (they occupy columns 0..n_first-1)."""
        return int((self.depth[0] == 1).sum()) if self.n_rounds else 0

    def validate(self) -> "PoolBatch":
        """Check shapes, tree structure and probability ranges; raise PoolError naming the field."""
        shape = self.token.shape
        if self.token.ndim != 2 or shape[1] == 0:
            raise PoolError(f"token: expected a non-empty (N, M) array, got shape {shape}")
        for name in POOL_COLUMNS:
            arr = getattr(self, name)
            if arr.shape != shape:
                raise PoolError(f"{name}: shape {arr.shape} differs from token's {shape}")
        for name in ("token", "parent", "depth", "p_argmax_child"):
            if getattr(self, name).dtype.kind not in "iub":
                raise PoolError(f"{name}: expected integers, got dtype {getattr(self, name).dtype}")
        for name in ("prompt_id", "task"):
            arr = getattr(self, name)
            if arr is not None and arr.shape != shape[:1]:
                raise PoolError(f"{name}: shape {arr.shape} differs from the {shape[0]} rounds")
        self._validate_tree()
        self._validate_probabilities()
        return self

    def _validate_tree(self) -> None:
        n, m = self.token.shape
        parent = self.parent.astype(np.int64)
        bad = (parent < -1) | (parent >= np.arange(m))
        if bad.any():
            raise PoolError(f"parent: must be -1 or an earlier pool index ({_first_bad(bad)})")
        depth = self.depth.astype(np.int64)
        parent_depth = np.take_along_axis(depth, np.maximum(parent, 0), axis=1)
        expected = np.where(parent < 0, 1, parent_depth + 1)
        bad = depth != expected
        if bad.any():
            raise PoolError(f"depth: inconsistent with parent depth + 1 ({_first_bad(bad)})")
        n_first = (depth[0] == 1).sum()
        bad = (depth == 1) != (np.arange(m) < n_first)
        if bad.any():
            raise PoolError(f"depth: first-level candidates must fill columns 0..{n_first - 1} ({_first_bad(bad)})")

    def _validate_probabilities(self) -> None:
        q = self.q_edge
        bad = ~((q >= 0) & (q <= 1))
        if bad.any():
            raise PoolError(f"q_edge: probabilities must lie in [0, 1] ({_first_bad(bad)})")
        p = self.p_edge
        bad = ~((p >= 0) & (p <= 1)) & ~np.isnan(p)
        if bad.any():
            raise PoolError(f"p_edge: probabilities must lie in [0, 1] or be NaN ({_first_bad(bad)})")
        bad = (self.p_argmax_child != 0) & (self.p_argmax_child != 1)
        if bad.any():
            raise PoolError(f"p_argmax_child: must be 0 or 1 ({_first_bad(bad)})")
        n, m = self.shape
        slots = (np.arange(n)[:, None] * (m + 1) + self.parent.astype(np.int64) + 1).ravel()
        per_parent = np.bincount(slots, weights=self.p_argmax_child.ravel().astype(np.float64), minlength=n * (m + 1))
        if (per_parent > 1).any():
            r = int(np.argmax(per_parent > 1)) // (m + 1)
            raise PoolError(f"p_argmax_child: more than one argmax child under one parent (round {r})")
        logp = self.draft_logp
        bad = ~(logp <= 0)
        if bad.any():
            raise PoolError(f"draft_logp: must be a log-probability <= 0 ({_first_bad(bad)})")
        parent_logp = np.take_along_axis(logp, np.maximum(self.parent.astype(np.int64), 0), axis=1)
        bad = (self.parent >= 0) & (logp > parent_logp)
        if bad.any():
            raise PoolError(f"draft_logp: a child's cumulative log-prob exceeds its parent's ({_first_bad(bad)})")

    @property
    def first_ancestor(self) -> np.ndarray:
        """(N, M) pool index of each candidate's depth-1 ancestor (itself at depth 1)."""
        return self.ancestor_at(1)

    def with_first_ancestor(self, first: np.ndarray) -> "PoolBatch":
        """This batch told each candidate's depth-1 ancestor (N, M) by what grew the pools, so that scores read
        it instead of recomputing it (online, a round's pool carries it from growth). Returns self."""
        first = np.asarray(first, dtype=np.intp)
        if first.shape != self.shape:
            raise PoolError(f"first_ancestor: expected shape {self.shape}, got {first.shape}")
        self._cache[("ancestor", 1)] = first
        return self

    def ancestor_at(self, k: int) -> np.ndarray:
        """(N, M) pool index of each candidate's depth-k ancestor (itself when depth <= k)."""
        key = ("ancestor", k)
        if key not in self._cache:
            self._cache[key] = ancestors(self.parent, self.depth, k)
        return self._cache[key]

    def edge_prob(self, law: str) -> np.ndarray:
        """(N, M) float64 target probability of each edge under ``law`` (greedy: point mass)."""
        return getattr(self, Law.named(check_law(law)).label_column).astype(np.float64)

    def path_prob(self, law: str) -> np.ndarray:
        """(N, M) float64 target probability p(u|c) of each candidate's path under ``law`` (cached)."""
        key = ("path", check_law(law))
        if key not in self._cache:
            self._cache[key] = cumulate(self.parent, self.depth, self.edge_prob(law))
        return self._cache[key]

    def first_draw_prob(self, law: str) -> np.ndarray:
        """(N, n_first) probability that the first draw from the root row is each first-level token."""
        return self.edge_prob(law)[:, : self.n_first]

    def take(self, rows) -> "PoolBatch":
        """A new PoolBatch holding the selected rounds (index array, slice or boolean mask)."""
        kept = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return PoolBatch(**{k: (None if v is None else v[rows]) for k, v in kept.items()})

    @classmethod
    def from_frame(cls, df) -> "PoolBatch":
        """Build and validate a PoolBatch from a ``rounds`` DataFrame (list columns of length M)."""
        require_columns(df.columns, list(POOL_COLUMNS), "rounds")
        arrays = {name: _stack_lists(df[name], name, dtype) for name, dtype in POOL_COLUMNS.items()}
        extra = {k: df[k].to_numpy() for k in ("prompt_id", "task") if k in df.columns}
        return cls(**arrays, **extra).validate()


def _stack_lists(column, name: str, dtype: str) -> np.ndarray:
    """(N, M) array from a column of equal-length lists, or a PoolError naming the column."""
    cells = column.to_numpy()
    if len(cells) == 0:
        raise PoolError(f"{name}: the rounds table is empty")
    lengths = {len(c) for c in cells}
    if len(lengths) != 1:
        raise PoolError(f"{name}: list lengths differ across rounds ({sorted(lengths)[:4]})")
    return np.stack([np.asarray(c) for c in cells]).astype(dtype, copy=False)
