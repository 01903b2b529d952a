"""Fixed-tree selection scores (docs/design.md, selection scores) as functions, their registry, values and tree sizes.

Every score is a log-space, float64 (N, M) array that is non-increasing along each
path, so the top-B set under the (depth, index) tie-break is ancestor-closed.
Scores that keep draft factors take them from the recorded cumulative draft score:
score(u) = log(replaced factors up to depth k) + draft_logp(u) - draft_logp(anc_k(u)).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

import numpy as np

from specrank.selection.pool import PoolBatch, PoolError, check_law
from specrank.selection.select import budget_curve, check_budgets, cumulate, rank_order, select_top, value

MIXTURE_WEIGHTS = (0.25, 0.5, 0.75)


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(x)


def _first_factor(pool: PoolBatch, factor, name: str) -> np.ndarray:
    """(N, n_first) float64 factor checked for shape and NaN, clipped to [0, 1]."""
    f = np.asarray(factor, dtype=np.float64)
    want = (pool.n_rounds, pool.n_first)
    if f.shape != want:
        raise PoolError(f"{name}: expected shape {want} (rounds x first-level candidates), got {f.shape}")
    if np.isnan(f).any():
        raise PoolError(f"{name}: contains NaN")
    return np.clip(f, 0.0, 1.0)


def first_factor_score(pool: PoolBatch, log_first: np.ndarray) -> np.ndarray:
    """(N, M) score replacing the first factor by ``exp(log_first)`` (N, n_first), draft factors below."""
    anc = pool.first_ancestor  # (N, M)
    d = pool.draft_logp.astype(np.float64)
    with np.errstate(invalid="ignore"):  # -inf - -inf below a zero draft factor ranks last
        return np.take_along_axis(log_first, anc, axis=1) + (d - np.take_along_axis(d, anc, axis=1))


def replaced_score(pool: PoolBatch, edge_factor: np.ndarray, k: int) -> np.ndarray:
    """(N, M) score with the first ``k`` factors of every path replaced by ``edge_factor`` (N, M)."""
    if k == 1:
        return first_factor_score(pool, _log(edge_factor[:, : pool.n_first]))
    log_f = _log(np.asarray(edge_factor, dtype=np.float64))
    head = np.take_along_axis(log_f, pool.first_ancestor, axis=1)  # (N, M) sum of replaced log factors
    for j in range(2, k + 1):
        head += np.where(pool.depth >= j, np.take_along_axis(log_f, pool.ancestor_at(j), axis=1), 0.0)
    d = pool.draft_logp.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return head + (d - np.take_along_axis(d, pool.ancestor_at(k), axis=1))


def draft_score(pool: PoolBatch, law: str = "sampling") -> np.ndarray:
    """Cumulative draft log-probability (EAGLE-3's ranking)."""
    return pool.draft_logp.astype(np.float64)


def root_score(pool: PoolBatch, law: str = "sampling") -> np.ndarray:
    """p(x1|c) * prod_{i>=2} q_i."""
    return replaced_score(pool, pool.edge_prob(law), 1)


def depth2_score(pool: PoolBatch, law: str = "sampling") -> np.ndarray:
    """p(x1|c) p(x2|c x1) * prod_{i>=3} q_i."""
    return replaced_score(pool, pool.edge_prob(law), 2)


def oracle_score(pool: PoolBatch, law: str = "sampling") -> np.ndarray:
    """log p(u|c): maximizes V among ancestor-closed sets of size B."""
    return _log(pool.path_prob(law))


def reranked_score(pool: PoolBatch, law: str = "sampling", *, first_factor) -> np.ndarray:
    """r(x1) * prod_{i>=2} q_i with ``first_factor`` (N, n_first) a reranker's predictions."""
    return first_factor_score(pool, _log(_first_factor(pool, first_factor, "first_factor")))


def isotonic_score(pool: PoolBatch, law: str = "sampling", *, iso_factor) -> np.ndarray:
    """iso(q1) * prod_{i>=2} q_i with ``iso_factor`` (N, n_first) the calibrated first draft factor."""
    return first_factor_score(pool, _log(_first_factor(pool, iso_factor, "iso_factor")))


def per_depth_score(pool: PoolBatch, law: str = "sampling", *, edge_factor) -> np.ndarray:
    """prod_i iso_depth(i)(q_i) with ``edge_factor`` (N, M) the calibrated factor of every edge."""
    f = np.asarray(edge_factor, dtype=np.float64)
    if f.shape != pool.shape:
        raise PoolError(f"edge_factor: expected shape {pool.shape}, got {f.shape}")
    if np.isnan(f).any():
        raise PoolError("edge_factor: contains NaN")
    return _log(cumulate(pool.parent, pool.depth, np.clip(f, 0.0, 1.0)))


def stacked_factors(pool: PoolBatch, first_factor, edge_factor) -> np.ndarray:
    """(N, M) every edge's factor of a stacked score: ``edge_factor`` (N, M), e.g. every draft factor calibrated per
    depth, with the first level's replaced by ``first_factor`` (N, n_first), a reranker's predictions; its
    ``per_depth`` score is r(x1) * prod_{i>=2} g_i(q_i)."""
    stacked = np.array(edge_factor, dtype=np.float64)  # a copy
    if stacked.shape != pool.shape:
        raise PoolError(f"edge_factor: expected shape {pool.shape}, got {stacked.shape}")
    stacked[:, : pool.n_first] = _first_factor(pool, first_factor, "first_factor")  # the first level comes first
    return stacked


def _row_log(pool: PoolBatch, row_logp) -> tuple[np.ndarray, np.ndarray]:
    """(available (N,) bool, log s (N, n_first)); NaN entries of an available row count as zero."""
    s = np.asarray(row_logp, dtype=np.float64)
    want = (pool.n_rounds, pool.n_first)
    if s.shape != want:
        raise PoolError(f"row_logp: expected shape {want} (rounds x first-level candidates), got {s.shape}")
    if (s > 1e-6).any():
        raise PoolError("row_logp: log-probabilities must be <= 0")
    available = ~np.isnan(s).all(axis=1)
    return available, np.minimum(np.where(np.isnan(s), -np.inf, s), 0.0)


def substitution_score(pool: PoolBatch, law: str = "sampling", *, row_logp) -> np.ndarray:
    """s(x1) * prod_{i>=2} q_i with a retained row's log-probs (N, n_first); rounds without it keep draft."""
    available, log_s = _row_log(pool, row_logp)
    return np.where(available[:, None], first_factor_score(pool, log_s), draft_score(pool))


def mixture_score(pool: PoolBatch, law: str = "sampling", *, row_logp, weight: float) -> np.ndarray:
    """q1^(1-w) s(x1)^w * prod_{i>=2} q_i; rounds without the row keep draft."""
    if not 0.0 <= float(weight) <= 1.0:
        raise PoolError(f"weight: expected a value in [0, 1], got {weight!r}")
    available, log_s = _row_log(pool, row_logp)
    log_q1 = pool.draft_logp[:, : pool.n_first].astype(np.float64)
    w = float(weight)
    # a zero exponent drops its factor entirely (0 * -inf would be NaN)
    mixed = (0.0 if w == 1.0 else (1 - w) * log_q1) + (0.0 if w == 0.0 else w * log_s)
    return np.where(available[:, None], first_factor_score(pool, mixed), draft_score(pool))


@dataclass(frozen=True)
class Score:
    """A fixed-tree selection score: ``function(pool, law, **inputs)`` with the named extra ``inputs``."""

    name: str
    function: Callable[..., np.ndarray]
    inputs: tuple[str, ...] = ()


SCORES = MappingProxyType(
    {
        "draft": Score("draft", draft_score),
        "root": Score("root", root_score),
        "depth2": Score("depth2", depth2_score),
        "oracle": Score("oracle", oracle_score),
        "reranked": Score("reranked", reranked_score, ("first_factor",)),
        "isotonic": Score("isotonic", isotonic_score, ("iso_factor",)),
        "per_depth": Score("per_depth", per_depth_score, ("edge_factor",)),
        "substitution": Score("substitution", substitution_score, ("row_logp",)),
        "mixture": Score("mixture", mixture_score, ("row_logp", "weight")),
    }
)


def score_of(pool: PoolBatch, name: str, law: str = "sampling", **inputs) -> np.ndarray:
    """(N, M) values of the registered score ``name``, with a one-line error for an unknown score or a missing
    input."""
    if name not in SCORES:
        raise PoolError(f"score: unknown score {name!r}; known: {', '.join(SCORES)}")
    spec = SCORES[name]
    missing = [k for k in spec.inputs if k not in inputs]
    if missing:
        raise PoolError(f"{missing[0]}: score {name!r} needs input {missing[0]!r}")
    return spec.function(pool, check_law(law), **{k: inputs[k] for k in spec.inputs})


def fixed_values(pool: PoolBatch, score: np.ndarray, budgets, law: str = "sampling") -> tuple[np.ndarray, np.ndarray]:
    """(values (N, nB), sizes (N, nB)) of the top-B trees of ``score`` under ``law``."""
    bs = check_budgets(budgets, pool.shape[1])
    path = pool.path_prob(law)
    if len(bs) <= 2:  # a partition per budget beats one full sort
        vals = np.stack([value(select_top(score, pool.depth, b), path) for b in bs], axis=1)
    else:
        vals = budget_curve(rank_order(score, pool.depth), path)[:, np.array(bs) - 1]
    return vals, np.tile(np.array(bs, dtype=np.float64), (len(vals), 1))


def first_token_agreement(pool: PoolBatch) -> np.ndarray:
    """bool (N,): the drafter's most probable first token is the target's argmax."""
    top = rank_order(pool.draft_logp[:, : pool.n_first], pool.depth[:, : pool.n_first])[:, :1]
    return np.take_along_axis(pool.p_argmax_child, top, axis=1)[:, 0] == 1
