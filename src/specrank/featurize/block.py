"""Every numeric candidate feature of docs/design.md (draft, subtree, context, rows) in one numba kernel
(``featurize.kernel``), for one round online or for a chunk of rounds offline: the same code computes both, so
recorded and online features agree bit for bit, and a round's features cost one call (an online round cannot
afford dozens of small array operations; inside a decoding loop each one starts from cold caches).

The definitions are in ``featurize.draft``, ``featurize.subtree``, ``featurize.context`` and ``featurize.rows``;
the column order in ``featurize.columns``. Sums run in candidate (pool) order in float64. numba is imported on
the first call, not with this module.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specrank.featurize.absent import NO_ANCESTOR, NO_ANCESTORS, NO_ROWS


def candidate_block(token, parent, depth, q_edge, draft_logp, topk: int, root_token, prompt_len, position,
                    prev_accepted, cache_logp=None, same_token_logp=None, preceding_logp=None, cache_age=None,
                    prev_tree_root_token_count=None, first_ancestor=None) -> np.ndarray:
    """(N, topk, len(BLOCK_FEATURES)) float64 features of N rounds' first-level candidates.

    Pool columns (N, M); round scalars (N,); the retained rows' log-probabilities at the first level
    (N, topk) per source of ``featurize.rows.ROW_SOURCES`` (NaN absent) and the two row scalars (N,), or
    None: the row features are NaN. ``first_ancestor`` (N, M), when the pool's growth carried it, spares
    deriving it.
    """
    from specrank.featurize.kernel import kernels  # numba

    n = len(root_token)
    # Writable as well as contiguous: numba compiles a kernel once per argument type, and an array read from
    # Parquet (Arrow's buffers) is read-only, another type; one signature means one compile in a fresh process.
    f64 = lambda v: np.require(v, np.float64, ("C", "W")).reshape(n)  # noqa: E731
    i64 = lambda v: np.require(v, np.int64, ("C", "W"))  # noqa: E731
    f32 = lambda v: np.require(v, np.float32, ("C", "W"))  # noqa: E731
    rows = cache_logp is not None
    row = lambda v: f32(v) if rows else NO_ROWS  # noqa: E731
    return kernels().block(i64(token), i64(parent), i64(depth), f32(q_edge), f32(draft_logp), int(topk),
                           i64(root_token).reshape(n), f64(prompt_len), f64(position), f64(prev_accepted),
                           row(cache_logp), row(same_token_logp), row(preceding_logp), rows,
                           f64(cache_age) if rows else np.full(n, -1.0),
                           f64(prev_tree_root_token_count) if rows else np.full(n, -1.0),
                           NO_ANCESTORS if first_ancestor is None else i64(first_ancestor))


class RoundInputs(NamedTuple):
    """The features kernel's arguments for one online round, as the decoder holds them (no conversions: an
    online round builds this once and a compiled reranker passes it on to its own kernel unchanged).

    Pool arrays (M,) as a ``DraftPool`` holds them (int64 indices, float32 probabilities). ``rows`` holds the
    retained rows' log-probabilities per source of ``featurize.rows.ROW_SOURCES`` (3, R) float32, read at the
    first topk entries of ``row_index`` int64: the whole (3, V) block on the host (a GPU block's page-locked host
    copy) read at the pool's tokens (its first-level candidates lead), or only the candidates' (3, topk) entries
    (``row_index`` 0..topk-1; the block absent: NaN). ``has_rows`` False:
    the row features are NaN (``rows`` is not read).
    """

    token: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    q_edge: np.ndarray
    draft_logp: np.ndarray
    topk: int
    root_token: int
    prompt_len: float
    position: float
    prev_accepted: float
    rows: np.ndarray
    row_index: np.ndarray
    has_rows: bool
    cache_age: float  # rounds since the root's token-keyed row was stored, -1 when none (or no rows)
    prev_count: float  # the previous tree's count of the root token, -1 when unknown (or no rows)
    first_ancestor: np.ndarray  # (M,) when the pool's growth carried it, else (0,)


def round_inputs(token, parent, depth, q_edge, draft_logp, topk: int, root_token: int, prompt_len: float,
                 position: float, prev_accepted: float, rows=None, row_index=None, cache_age: float = -1.0,
                 prev_tree_root_token_count: float = -1.0, first_ancestor=None) -> RoundInputs:
    """``RoundInputs`` of one round (``rows`` None: no retained rows; ``row_index`` None: ``rows`` is already
    (3, topk))."""
    has_rows = rows is not None
    if has_rows and row_index is None:
        row_index = np.arange(topk, dtype=np.int64)
    return RoundInputs(token, parent, depth, q_edge, draft_logp, int(topk), int(root_token), float(prompt_len),
                       float(position), float(prev_accepted), rows if has_rows else NO_ROWS,
                       row_index if has_rows else NO_ANCESTOR, has_rows, float(cache_age),
                       float(prev_tree_root_token_count), NO_ANCESTOR if first_ancestor is None else first_ancestor)


def round_block(inputs: RoundInputs) -> np.ndarray:
    """(topk, len(BLOCK_FEATURES)) features of one round, by the same per-round code as ``candidate_block``."""
    from specrank.featurize.kernel import kernels  # numba

    return kernels().round(*inputs)
