"""Synthetic pools: random trees for property tests and realistic EAGLE-3-shaped rounds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specrank.schema import POOL_COLUMNS
from specrank.selection.pool import PoolBatch
from specrank.selection.select import select_top

TIE_LEVELS = np.array([0.0, 0.125, 0.25, 0.5, 1.0])


def _normalize_children(raw: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Scale nonnegative ``raw`` edge weights so each parent's children sum to at most 1."""
    n, m = raw.shape
    slots = np.arange(n)[:, None] * (m + 1) + parent + 1  # (N, M) one slot per parent
    totals = np.bincount(slots.ravel(), weights=raw.ravel(), minlength=n * (m + 1))
    return raw / np.maximum(totals[slots], 1.0)


def random_pool(n_rounds: int, n_cands: int, n_first: int = 3, seed: int = 0, ties: bool = False,
                dtype=np.float64) -> PoolBatch:
    """A valid PoolBatch with random trees (parents uniform among earlier candidates).

    With ``ties`` the edge probabilities come from a few dyadic levels, so scores tie exactly.
    ``dtype`` is that of the probability and log-probability arrays (float32 as recorded).
    """
    if not 1 <= n_first <= n_cands:
        raise ValueError(f"n_first: expected 1..{n_cands}, got {n_first}")
    rng = np.random.default_rng(seed)
    n, m = n_rounds, n_cands
    j = np.arange(m)
    parent = np.where(j < n_first, -1, np.floor(rng.random((n, m)) * j).astype(np.int64))
    depth = np.ones((n, m), dtype=np.int64)
    for col in range(n_first, m):  # loop over candidates (small m), vectorized over rounds
        depth[:, col] = depth[np.arange(n), parent[:, col]] + 1
    if ties:
        q_raw = rng.choice(TIE_LEVELS, size=(n, m))
        p_raw = rng.choice(TIE_LEVELS, size=(n, m))
    else:
        q_raw = rng.random((n, m)) ** 3
        p_raw = rng.random((n, m)) ** 3
    q_edge = _normalize_children(q_raw, parent)
    p_edge = _normalize_children(p_raw, parent)
    argmax_child = _random_argmax_child(rng, parent, p_edge)
    with np.errstate(divide="ignore"):
        log_q = np.log(q_edge)
    draft_logp = log_q.copy()
    for col in range(n_first, m):
        draft_logp[:, col] += draft_logp[np.arange(n), parent[:, col]]
    return PoolBatch(
        token=rng.integers(0, 1000, (n, m)).astype(np.int32),
        parent=parent.astype(np.int16),
        depth=depth.astype(np.int8),
        q_edge=q_edge.astype(dtype),
        draft_logp=draft_logp.astype(dtype),
        p_edge=p_edge.astype(dtype),
        p_argmax_child=argmax_child,
        prompt_id=np.arange(n) // 3,
        task=np.array(["a", "b"])[np.arange(n) % 2],
    ).validate()


def _random_argmax_child(rng, parent: np.ndarray, p_edge: np.ndarray) -> np.ndarray:
    """int8 (N, M): per parent, flag its most probable child, or none with probability 1/3."""
    n, m = parent.shape
    slots = np.arange(n)[:, None] * (m + 1) + parent + 1
    noise = p_edge + 1e-9 * rng.random((n, m))  # break exact ties among siblings
    best = np.full(n * (m + 1), -1.0)
    np.maximum.at(best, slots.ravel(), noise.ravel())
    dropped = rng.random(n * (m + 1)) < 1 / 3  # per parent: target argmax outside the pool
    return ((noise == best[slots]) & ~dropped[slots]).astype(np.int8)


TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "humaneval")


def _child_distributions(rng, shape, topk, local_vocab, sharpness, noise):
    """Draft/target probabilities of the drafter's top-``topk`` children of ``shape`` nodes.

    Returns (q, p, argmax, top, target_logits): q, p (*shape, topk) with q sorted desc,
    argmax (*shape, topk) flags the target argmax, top (*shape, topk) the children's ids
    in a local vocabulary, target_logits (*shape, local_vocab) for root-row summaries.
    """
    scale = rng.uniform(*sharpness, size=shape + (1,))  # per-node draft confidence
    draft_logits = scale * rng.standard_normal(shape + (local_vocab,))
    target_logits = draft_logits + noise * rng.standard_normal(shape + (local_vocab,))
    top = np.argsort(-draft_logits, axis=-1)[..., :topk]  # (*shape, topk) local token ids
    q_all = _softmax(draft_logits)
    p_all = _softmax(target_logits)
    q = np.take_along_axis(q_all, top, axis=-1)
    p = np.take_along_axis(p_all, top, axis=-1)
    argmax = top == np.argmax(target_logits, axis=-1)[..., None]
    return q, p, argmax, top, target_logits


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def grow_pool(rng, n: int, topk: int, depth: int, expand: int, children) -> dict:
    """Pool arrays (N, M), M = topk + topk^2 + (depth - 2) * expand * topk, grown like EAGLE-3: the root's
    ``topk`` children, all expanded, then at each further depth the ``expand`` best new candidates by
    cumulative draft log-probability. ``children(rng, shape)`` draws the ``topk`` children of ``shape``
    nodes: (token, q, p, argmax) arrays of shape (*shape, topk), q descending, argmax flagging the
    target's argmax child. Draft log-probabilities accumulate in float64; ``POOL_COLUMNS`` gives the
    stored dtypes. The one pool grower of the synthetic data (``featurize.synthetic`` draws its
    rounds with it too)."""
    token, q, p, argmax = children(rng, (n,))
    cols = {"token": [token], "parent": [np.full((n, topk), -1)], "depth": [np.ones((n, topk), dtype=np.int64)],
            "q_edge": [q], "p_edge": [p], "p_argmax_child": [argmax], "draft_logp": [np.log(q)]}
    expanded = np.broadcast_to(np.arange(topk), (n, topk))  # every first-level candidate expands
    start = topk
    for step in range(1, depth):
        e = expanded.shape[1]
        token, q, p, argmax = children(rng, (n, e))  # (N, E, topk)
        parent_logp = np.take_along_axis(np.concatenate(cols["draft_logp"], axis=1), expanded, axis=1)
        logp = (parent_logp[:, :, None] + np.log(q)).reshape(n, e * topk)
        cols["token"].append(token.reshape(n, e * topk))
        cols["parent"].append(np.repeat(expanded, topk, axis=1))
        cols["depth"].append(np.full((n, e * topk), step + 1))
        cols["q_edge"].append(q.reshape(n, -1))
        cols["p_edge"].append(p.reshape(n, -1))
        cols["p_argmax_child"].append(argmax.reshape(n, -1))
        cols["draft_logp"].append(logp)
        if step <= depth - 2:  # expand the best new candidates by cumulative draft score
            expanded = start + np.argsort(-logp, axis=1, kind="stable")[:, :expand]
        start += e * topk
    return {k: np.concatenate(v, axis=1).astype(POOL_COLUMNS[k]) for k, v in cols.items()}


def _gaussian_children(topk, local_vocab, sharpness, noise, vocab, first: list):
    """``grow_pool``'s children: Gaussian draft logits over a local vocabulary (``_child_distributions``),
    placed at a random offset of the vocabulary; the first level's root logits and local ids go to ``first``."""

    def children(rng, shape):
        q, p, argmax, local, target_logits = _child_distributions(rng, shape, topk, local_vocab, sharpness, noise)
        base = rng.integers(0, vocab, size=shape + (1,))
        if not first:
            first.extend([target_logits, local])
        return (base + local) % vocab, q, p, argmax

    return children


def realized_acceptance(rng, pool: PoolBatch, budget: int = 59) -> np.ndarray:
    """int (N,) accepted draft tokens of one exhaustive target-sampling traversal of draft selection's tree."""
    tree = select_top(pool.draft_logp, pool.depth, budget)
    node = np.full(pool.n_rounds, -1)  # current node, -1 = root
    accepted = np.zeros(pool.n_rounds, dtype=np.int64)
    alive = np.ones(pool.n_rounds, dtype=bool)
    p = np.nan_to_num(pool.p_edge.astype(np.float64))
    for d in range(1, int(pool.depth.max()) + 1):
        children = (pool.parent == node[:, None]) & (pool.depth == d)  # (N, M)
        cum = np.cumsum(np.where(children, p, 0.0), axis=1)
        u = rng.random((pool.n_rounds, 1))
        hit = children & (cum > u)  # first child whose cumulative mass passes u is the draw
        pick = np.argmax(hit, axis=1)
        alive &= hit.any(axis=1) & tree[np.arange(pool.n_rounds), pick]
        accepted += alive
        node = np.where(alive, pick, -2)  # -2: stopped, matches no parent
    return accepted


@dataclass(eq=False)
class SyntheticRounds:
    """Synthetic recorded rounds: a PoolBatch plus per-round summaries and retained rows.

    ``rounds`` holds per-round arrays (N,): round, root_token, root_entropy, root_argmax,
    root_argmax_prob, accepted (one sampled traversal of draft selection's 59-node tree);
    ``rows`` holds retained-row log-probs (N, topk) named like the schema (cache_logp, same_token_logp, preceding_logp), NaN where absent.
    """

    pool: PoolBatch
    rounds: dict
    rows: dict

    def to_frame(self):
        """A ``rounds``-schema DataFrame (keys, pool lists, root summaries, retained rows)."""
        pool = self.pool
        frame = {"prompt_id": pool.prompt_id, "task": pool.task, **self.rounds}
        for name, dtype in POOL_COLUMNS.items():
            frame[name] = list(getattr(pool, name).astype(dtype))
        for name, arr in self.rows.items():
            frame[name] = list(arr.astype(np.float32))
        return pd.DataFrame(frame)


def synthetic_pools(
    n_rounds: int,
    topk: int = 10,
    depth: int = 8,
    expand: int = 10,
    seed: int = 0,
    n_prompts: int | None = None,
    tasks=TASKS,
    local_vocab: int = 48,
    sharpness=(1.5, 5.0),
    noise: float = 0.7,
    vocab: int = 49152,
) -> SyntheticRounds:
    """Realistic synthetic rounds of EAGLE-3's pool shape (710 candidates, 70 expanded by default).

    Draft logits per node are Gaussian with a random sharpness; the target's are the
    draft's plus Gaussian ``noise``, so draft and target agree imperfectly. Rounds are
    spread over ``n_prompts`` prompts (default: about 40 rounds each), tasks cycling.
    """
    if n_rounds < 1 or topk < 1 or depth < 1 or not 1 <= expand <= topk * topk:
        raise ValueError("n_rounds, topk, depth must be >= 1 and expand in 1..topk**2")
    rng = np.random.default_rng(seed)
    first = []  # the root row's logits and the first level's local ids, for the round summaries and rows
    arrays = grow_pool(rng, n_rounds, topk, depth, expand,
                       _gaussian_children(topk, local_vocab, sharpness, noise, vocab, first))
    root_logits, first_local = first
    n_prompts = n_prompts or max(1, n_rounds // 40)
    prompt_id = np.sort(rng.integers(0, n_prompts, size=n_rounds))
    prompt_id[:n_prompts] = np.arange(min(n_prompts, n_rounds))  # every prompt has a round
    prompt_id = np.sort(prompt_id)
    pool = PoolBatch(**arrays, prompt_id=prompt_id, task=np.asarray(tasks)[prompt_id % len(tasks)])
    rounds = _round_summaries(root_logits, prompt_id, pool.token[:, :topk], first_local)
    rounds["root_token"] = rng.integers(0, vocab, size=n_rounds).astype(np.int32)
    rounds["accepted"] = realized_acceptance(rng, pool).astype(np.int16)
    return SyntheticRounds(pool, rounds, _retained_rows(rng, root_logits, first_local))


def _round_summaries(root_logits, prompt_id, first_tokens, first_local) -> dict:
    """Per-round keys and root-row summaries; the root argmax token is -1 outside the first level."""
    p = _softmax(root_logits)
    first = np.r_[True, prompt_id[1:] != prompt_id[:-1]]
    starts = np.maximum.accumulate(np.where(first, np.arange(len(prompt_id)), 0))
    entropy = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=1)
    hit = first_local == np.argmax(p, axis=1)[:, None]  # (N, topk)
    argmax_token = np.where(hit.any(axis=1), (first_tokens * hit).sum(axis=1), -1)
    return {
        "round": np.arange(len(prompt_id)) - starts,
        "root_entropy": entropy.astype(np.float32),
        "root_argmax": argmax_token.astype(np.int32),
        "root_argmax_prob": p.max(axis=1).astype(np.float32),
    }


def _retained_rows(rng, root_logits: np.ndarray, first_local: np.ndarray) -> dict:
    """Noisy copies of the root row read at the first-level tokens, absent at realistic rates."""
    n = root_logits.shape[0]
    rows = {}
    sources = (("cache_logp", 1.5, 0.7), ("same_token_logp", 1.0, 0.3), ("preceding_logp", 2.5, 1.0))
    for name, noise, available in sources:  # (row, logit noise, share of rounds holding it)
        logits = root_logits + noise * rng.standard_normal(root_logits.shape)
        logp = np.log(_softmax(logits))
        read = np.take_along_axis(logp, first_local, axis=1)  # (N, topk)
        rows[name] = np.where(rng.random((n, 1)) < available, read, np.nan)
    return rows
