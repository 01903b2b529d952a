"""Compile and cache the numba kernels once, for a test run that starts in a fresh clone.

numba caches a compiled kernel beside its source (``cache=True``); until the cache exists, every process that
calls a kernel compiles it itself (some 10 s of CPU for all of them). A fresh clone's test run starts two
pytest-xdist workers, whose first tests start further processes (a study's CLI, Ray workers), all compiling the
same kernels at once. ``tests/conftest.py`` runs this script beside the workers while they collect, so most of
them find the cache written.

Each kernel is called with the argument types the library passes it (a kernel compiled for other types would be
compiled again): the batch features kernel, the one-round features kernel, and QuickScorer's margins and round
kernels on a small LightGBM model.
"""

from __future__ import annotations

import numpy as np


def a_round(rng, topk: int = 4, m: int = 16, vocab: int = 40):
    """One round's ``RoundInputs``, as the decoder builds them: a random pool and retained rows."""
    from specrank.featurize import round_inputs

    parent = np.full(m, -1, np.int64)
    depth = np.ones(m, np.int64)
    for i in range(topk, m):
        parent[i] = rng.integers(0, i)
        depth[i] = depth[parent[i]] + 1
    token = rng.choice(vocab, m, replace=False).astype(np.int64)
    q_edge = rng.random(m).astype(np.float32)
    rows = np.log(rng.dirichlet(np.ones(vocab), 3)).astype(np.float32)
    return round_inputs(token, parent, depth, q_edge, np.log(q_edge), topk, int(token[0]), 20.0, 5.0, 1.0, rows,
                        token[:topk], 2.0, 1.0)


def warm() -> None:
    import lightgbm as lgb

    from specrank.featurize.block import candidate_block, round_block
    from specrank.rerankers.quickscorer import QuickScorer

    rng = np.random.default_rng(0)
    r = a_round(rng)
    round_block(r)
    n = 3
    pool = lambda v: np.tile(v, (n, 1))  # noqa: E731
    rows = lambda: np.log(rng.random((n, r.topk))).astype(np.float32)  # noqa: E731
    every = lambda v: np.full(n, v)  # noqa: E731
    candidate_block(pool(r.token), pool(r.parent), pool(r.depth), pool(r.q_edge), pool(r.draft_logp), r.topk,
                    every(r.root_token), every(20.0), every(5.0), every(1.0), rows(), rows(), rows(), every(2.0),
                    every(1.0))
    X = rng.normal(size=(400, 3))
    y = (X[:, 0] + rng.normal(size=400) > 0).astype(float)
    booster = lgb.train({"objective": "binary", "num_leaves": 4, "verbose": -1, "num_threads": 1}, lgb.Dataset(X, y),
                        3)
    QuickScorer(booster)  # compiles (or loads) its margins and round kernels

if __name__ == "__main__":
    warm()
