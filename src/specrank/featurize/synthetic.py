"""Synthetic recorded rounds with the schema's columns, for tests and benchmarks.

Pools grow in EAGLE-3's shape with ``selection.synthetic.grow_pool`` (docs/design.md, pool growth): ``topk``
first-level candidates, all expanded, then the ``expand`` best new nodes by cumulative draft log-probability at
each further depth. At every
expanded node the drafter's top-``topk`` probabilities come from a Dirichlet draw (one extra
entry for the mass outside the pool); the target's probabilities are the drafter's tilted by
log-normal noise of scale ``target_noise`` and renormalized. The retained rows (cache,
same-token, preceding; available in 70%, 30%, 100% of rounds, noise scales 0.3, 0.6, 1.0 times
``row_noise``) are noisy copies of the drafter's first-level log-probabilities, except that with
``signal="rows"`` the cache row copies the target's (so it carries what the drafter misses; with
``row_noise=0`` it is exact, and a perfect reranker recovers the root gain of the cached rounds).
Verification walks the target's argmax path through the whole pool.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from specrank import schema
from specrank.selection.synthetic import grow_pool

SIGNALS = ("rows", "none")
_ROW_NOISE = {"cache": 0.3, "same_token": 0.6, "preceding": 1.0}
_ROW_AVAILABLE = {"cache": 0.7, "same_token": 0.3, "preceding": 1.0}


def _dirichlet_children(topk, vocab, target_noise):
    """``grow_pool``'s children: the drafter's top-``topk`` of a Dirichlet draw (one extra entry for the mass
    outside the pool), the target's probabilities the drafter's tilted by log-normal noise, distinct sibling
    tokens (``vocab`` is prime)."""

    def children(rng, shape):
        g = rng.gamma(0.6, size=shape + (topk + 1,))
        q_full = g / g.sum(-1, keepdims=True)
        q = -np.sort(-q_full[..., :topk], axis=-1)  # the drafter's top-k, descending
        q_all = np.concatenate([q, q_full[..., topk:]], axis=-1)
        w = q_all * np.exp(target_noise * rng.normal(size=q_all.shape))
        p = w / w.sum(-1, keepdims=True)
        start = rng.integers(vocab, size=shape + (1,))
        stride = rng.integers(1, vocab, size=shape + (1,))
        tokens = (start + stride * np.arange(topk)) % vocab
        return tokens, q, p[..., :topk], np.arange(topk) == p.argmax(-1)[..., None]

    return children


def _argmax_path(cols, depth):
    """Accepted pool indices along the target's argmax path from the root, (N, depth) with -1 padding."""
    n, m = cols["parent"].shape
    best_child = np.full((n, m + 1), -1, dtype=np.int64)  # column m stands for the root
    rows, nodes = np.nonzero(cols["p_argmax_child"])
    parents = cols["parent"][rows, nodes].astype(np.int64)
    best_child[rows, np.where(parents < 0, m, parents)] = nodes
    path = np.full((n, depth), -1, dtype=np.int64)
    cur = best_child[:, m]
    for d in range(depth):
        path[:, d] = cur
        cur = np.where(cur >= 0, best_child[np.arange(n), np.maximum(cur, 0)], -1)
    return path


def _retained_rows(rng, p1: np.ndarray, q1: np.ndarray, signal: str, row_noise: float) -> dict:
    """Each retained row's log-probabilities of the first-level candidates (N, k): noisy around the target's (the
    cache's, with the ``rows`` signal) or the drafter's, absent (NaN) in a share of the rounds."""
    rows = {}
    for source, noise in _ROW_NOISE.items():
        centre = np.log(p1) if signal == "rows" and source == "cache" else np.log(q1)
        lp = np.minimum(centre + row_noise * noise * rng.normal(size=p1.shape), 0.0)  # log-probabilities
        lp[rng.random(len(p1)) >= _ROW_AVAILABLE[source]] = np.nan
        rows[f"{source}_logp"] = lp.astype(np.float32)
    return rows


def synthetic_rounds(n_prompts=20, rounds_per_prompt=20, *, topk=4, depth=3, expand=None, signal="rows",
                     temperature=1.0, target_noise=1.0, row_noise=1.0, vocab=1009, tasks=("qa", "code"), seed=0):
    """(Arrow table with ``schema.ROUNDS_COLUMNS``, manifest dict) of synthetic rounds."""
    if signal not in SIGNALS:
        raise ValueError(f"unknown signal {signal!r} (choose from {', '.join(SIGNALS)})")
    expand = topk if expand is None else expand
    rng = np.random.default_rng(seed)
    n = n_prompts * rounds_per_prompt
    cols = grow_pool(rng, n, topk, depth, expand, _dirichlet_children(topk, vocab, target_noise))
    path = _argmax_path(cols, depth)
    accepted = (path >= 0).sum(1)
    pid = np.repeat(np.arange(n_prompts), rounds_per_prompt)
    rnd = np.tile(np.arange(rounds_per_prompt), n_prompts)
    root = np.where(rng.random(n) < 0.2, cols["token"][np.arange(n), rng.integers(topk, size=n)], rng.integers(vocab, size=n))
    p1, q1 = cols["p_edge"][:, :topk].astype(np.float64), cols["q_edge"][:, :topk].astype(np.float64)
    rows = _retained_rows(rng, p1, q1, signal, row_noise)
    rows["preceding_logp"][cols["token"][:, :topk] == root[:, None]] = np.nan  # the continuation entry
    prompt_len = rng.integers(20, 400, size=n_prompts)
    emitted = (accepted + 1).reshape(n_prompts, rounds_per_prompt)  # tokens per round
    data = {
        "prompt_id": np.array([f"p{i:04d}" for i in pid]),
        "task": np.array(tasks)[pid % len(tasks)],
        "round": rnd.astype(np.int32),
        "position": (np.cumsum(emitted, 1) - emitted).reshape(-1).astype(np.int32),
        "prompt_len": np.repeat(prompt_len, rounds_per_prompt).astype(np.int32),
        "root_token": root.astype(np.int32),
        **cols,
        "root_entropy": -(p1 * np.log(p1)).sum(1).astype(np.float32),
        "root_argmax": np.where(path[:, 0] >= 0, cols["token"][np.arange(n), np.maximum(path[:, 0], 0)], vocab),
        "root_argmax_prob": p1.max(1).astype(np.float32),
        "accepted": accepted.astype(np.int16),
        "accepted_nodes": path,
        "continuation": rng.integers(vocab, size=n).astype(np.int32),
        "emitted_rank": np.full(n, -1, dtype=np.int32),
        "covered": np.zeros(n, dtype=bool),
        "n_scored": np.full(n, cols["token"].shape[1] + 1, dtype=np.int16),
        **rows,
        "cache_age": np.where(np.isnan(rows["cache_logp"][:, 0]), -1, rng.integers(1, 30, size=n)).astype(np.int32),
        "prev_tree_root_token_count": np.where(rnd == 0, -1, rng.integers(0, 4, size=n)).astype(np.int32),
        **{k: np.full(n, np.nan, dtype=np.float32) for k in schema.DIAGNOSTIC_COLUMNS},
    }
    manifest = {  # the layout of specrank.decode's manifests
        "temperature": float(temperature),
        "pool_shape": {"topk": topk, "depth": depth, "expand": expand},
        "pool_size": int(cols["token"].shape[1]),
        "budget": 59,
        "synthetic": {"signal": signal, "seed": seed, "target_noise": target_noise, "row_noise": row_noise},
    }
    return to_arrow(data), manifest


def to_arrow(data: dict) -> pa.Table:
    """Arrow table from (N,) and (N, L) numpy arrays; ``accepted_nodes`` (N, D) drops its -1 padding."""
    arrays = {}
    for name, v in data.items():
        if name == "accepted_nodes":
            keep = v >= 0
            offsets = np.concatenate([[0], np.cumsum(keep.sum(1))]).astype(np.int32)
            arrays[name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(v[keep].astype(np.int16)))
        elif v.ndim == 2:
            arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
        else:
            arrays[name] = pa.array(v)
    return pa.table(arrays)


def write_synthetic_run(run_dir, *, shards: int = 2, **kwargs) -> dict:
    """Write ``synthetic_rounds(**kwargs)`` as a run directory (manifest + ``shards`` Parquet files)."""
    table, manifest = synthetic_rounds(**kwargs)
    out = Path(run_dir, "rounds")
    out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
    for i in range(shards):
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), out / f"shard-{i:05d}.parquet")
    Path(run_dir, "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest
