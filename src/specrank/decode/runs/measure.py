"""Measurement inside the decoding loop: records, and the strategies compared at the acting strategy's contexts.

``Measure`` is the round engine's observer (``specrank.decode.engine.round``). For measurement only,
a tree pass may also score the union of other strategies' trees at the strategy's own context: the
verifier never sees these prefixes, and the tree mask keeps the verified tree's rows unchanged.
The recorded target probabilities then give, per round, the expected acceptance of every compared
strategy with the offline value functions of ``specrank.selection`` (the same code the offline
evaluation runs). ``Measure(record=True)`` is the recorder: it also scores the expanded nodes and
the top-M candidates, so the rounds hold every pool edge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrank.decode.runs.records import round_record
from specrank.decode.strategies.base import draft_rank, round_batch
from specrank.law import Law
from specrank.schema import DIAGNOSTIC_COLUMNS, ROW_COLUMNS, ROW_SCALARS
from specrank.selection import DraftGroups, PoolBatch, cumulate, draw_values, fixed_values, score_of
from specrank.selection.select import select_top

COMPARABLE = ("draft", "root", "root_draw", "pearl", "reranked")


class CompareError(ValueError):
    """A ``--compare`` list names a strategy that cannot be measured."""


@dataclass
class Measure:
    """What a round records beyond decoding: the strategies in ``compare`` measured at the strategy's contexts
    (``reranker``: the RerankedSelection whose reranker ``reranked`` means), and with ``record`` every pool edge."""

    compare: tuple = ()
    record: bool = False
    reranker: object = None

    def __post_init__(self):
        self._reranked = None  # this round's reranked score (1, M), between scored_nodes and observe

    @property
    def wants_rows(self) -> bool:
        """The row caches are read: the recorder stores them, a compared Rows reranker predicts from them."""
        compares_rows = self.reranker is not None and "reranked" in self.compare and self.reranker.needs_rows
        return self.record or bool(compares_rows)

    def scored_nodes(self, pool, state, config, ctx, root_known: bool):
        """(pool indices scored for measurement only, whether the expanded nodes are scored too)."""
        self._reranked = None
        extra = np.zeros(0, np.int64)
        if self.compare:
            batch = round_batch(pool, state.root_logits, config.temperature)
            if self.reranker is not None:
                self._reranked = self.reranker.score(batch, ctx.law, self.reranker.first_factor(pool, ctx)[None])
            extra = np.flatnonzero(measured_nodes(batch, self.compare, config.budget, ctx.law, root_known,
                                                  self._reranked))
        recorded = draft_rank(pool)[: config.extra] if self.record else np.zeros(0, np.int64)
        return np.concatenate([extra, recorded]).astype(np.int64), self.record

    def observe(self, view) -> dict:
        """The round's record: the ``rounds`` columns, then what the online strategy realized and expected."""
        state, pool = view.state, view.pool
        topk = view.config.shape.topk
        rows = (state.caches.read(state.rounds, state.root, pool.token[:topk], view.logp_rows([0])[0])
                if state.caches is not None else absent_rows(topk))
        record = round_record(state, pool, view.logp_rows, view.scored, view.accepted, view.continuation, view.emitted,
                              draft_rank(pool), rows)
        acting, law = view.acting, view.ctx.law
        record.update(prompt_id=state.prompt_id, task=state.task, strategy=view.strategy.name, score=acting.name,
                      drawn=view.drawn, passes=view.passes,
                      realized=len(view.accepted) + int(view.skipped and acting.counts_draw),
                      expected=np.nan if view.strategy.carries_leaf_row else own_expected(
                          record, view.tree, acting, view.ctx.drawn_node, law))
        if self.compare:
            values = expected_values(record_batch(record), self.compare, view.config.budget, law, self._reranked)
            record.update({f"expected_{k}": v for k, v in values.items()})
        return record


def absent_rows(topk: int) -> dict:
    """The retained-row columns of a round whose strategy keeps no row caches (all absent)."""
    rows = {k: np.full(topk, np.nan, np.float32) for k in ROW_COLUMNS}
    return rows | {k: -1 for k in ROW_SCALARS} | {k: np.nan for k in DIAGNOSTIC_COLUMNS}


def parse_strategies(text: str | None, allowed=COMPARABLE, what: str = "--compare") -> list[str]:
    """``"root,draft"`` -> ["root", "draft"]; one-line error naming ``what`` for an unknown or repeated name."""
    if not text:
        return []
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in allowed]
    if bad:
        raise CompareError(f"{what}: unknown strategy {bad[0]!r}; choose from {', '.join(allowed)}")
    if len(set(names)) != len(names):
        raise CompareError(f"{what}: {text!r} repeats a strategy")
    return names


def branch_union(batch: PoolBatch, budget: int) -> np.ndarray:
    """(M,) bool: every first-level candidate and its ``budget - 1`` best draft-ranked descendants.

    Holds every strategy's tree that replaces only first factors (root, reranked, draft) and
    root-draw's tree for every draw, so their values need nothing outside it.
    """
    within = DraftGroups.of(batch).within[0]
    return (batch.depth[0] == 1) | ((within >= 0) & (within < budget - 1))


def measured_nodes(batch: PoolBatch, strategies, budget: int, law: str, root_known: bool,
                   reranked=None) -> np.ndarray:
    """(M,) bool, ancestor-closed: prefixes to score so that every one of ``strategies`` has a value (``reranked``:
    the reranked strategy's score (1, M) of the round, ``RerankedSelection.score``)."""
    depth = batch.depth
    nodes = np.zeros(batch.shape[1], bool)
    for name in strategies:
        if name in ("draft", "pearl"):
            nodes |= select_top(batch.draft_logp, depth, budget)[0]
        elif name == "reranked":
            nodes |= select_top(reranked, depth, budget)[0]
        elif name == "root" and root_known:
            nodes |= select_top(score_of(batch, "root", law), depth, budget)[0]
        else:  # root before the root row is known, root-draw for every draw
            nodes |= branch_union(batch, budget)
    return nodes


def expected_values(batch: PoolBatch, strategies, budget: int, law: str, reranked=None) -> dict[str, float]:
    """{name: expected acceptance of its tree} on one scored round (root_draw, PEARL count the draw; ``reranked``:
    the reranked strategy's score (1, M) of the round)."""
    out = {}
    draws = None
    for name in strategies:
        if name in ("root_draw", "pearl"):
            draws = draws or draw_values(batch, [budget], law)
            out[name] = float(draws[name][0][0, 0])
            continue
        score = reranked if name == "reranked" else score_of(batch, name, law)
        out[name] = float(fixed_values(batch, score, [budget], law)[0][0, 0])
    return out


def own_expected(record: dict, tree: np.ndarray, acting, node: int, law: str) -> float:
    """Expected acceptance of the selected tree given the round's draw (its mean is the strategy's value)."""
    edge = record[Law.of(law).label_column]
    path = cumulate(record["parent"][None], record["depth"][None], np.asarray(edge, np.float64)[None])[0]
    if not acting.draws_first:
        return float(path[tree].sum())
    if node < 0:
        return float(acting.counts_draw)
    branch = record_batch(record).first_ancestor[0] == node
    return float(path[tree & branch].sum() / path[node]) if path[node] > 0 else float(acting.counts_draw)


_POOL = ("token", "parent", "depth", "q_edge", "draft_logp", "p_edge", "p_argmax_child")


def record_batch(record: dict) -> PoolBatch:
    """A one-round PoolBatch of a round record (target probabilities as scored by its passes)."""
    return PoolBatch(**{k: np.asarray(record[k])[None] for k in _POOL})
