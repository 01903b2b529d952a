"""Exact trie theory (docs/design.md, expected accepted tokens; target-row reuse, arXiv 2610.29210, §4.1, App. A.2-A.3,
App. B.1).

A trie ``T`` is a prefix-closed set of token tuples with the root ``()``; the scored
set ``Q`` contains ``T``; ``rows[u]`` is the target's next-token row at prefix ``u``
(a mapping token -> probability, or a sequence indexed by token id). Rows given as
``fractions.Fraction`` make every value below exact; floats give floats.

A stopping rule walks from the root: at node ``u`` it draws ``x`` from ``rows[u]``,
accepts and moves to ``ux`` when ``ux`` is in ``T`` and the rule continues there,
otherwise emits ``x`` as the continuation; the round is *covered* when the emitted
address ``ux`` is scored (``ux`` in ``Q``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

Prefix = tuple


class TrieError(ValueError):
    """A trie, scored set, row or stopping rule is malformed."""


@dataclass(frozen=True)
class StopRule:
    """How a traversal stops: ``exhaustive``, ``cap`` (after ``k`` accepted) or ``sampled_leaf``."""

    kind: str = "exhaustive"
    k: int = 0

    def __post_init__(self):
        if self.kind not in ("exhaustive", "cap", "sampled_leaf"):
            raise TrieError(f"unknown stopping rule {self.kind!r} (exhaustive, cap, sampled_leaf)")
        if self.kind == "cap" and (not isinstance(self.k, int) or self.k < 0):
            raise TrieError(f"cap needs a whole number k >= 0, got {self.k!r}")

    def continues(self, v: Prefix, has_child: bool) -> bool:
        """Whether the draw labelling trie node ``v`` is accepted (``has_child``: v is no leaf)."""
        if self.kind == "cap":
            return len(v) <= self.k
        if self.kind == "sampled_leaf":
            return has_child
        return True


def parse_stop(text: str) -> StopRule:
    """``"exhaustive"``, ``"cap:2"`` or ``"sampled_leaf"`` -> StopRule."""
    name, _, arg = text.partition(":")
    if name == "cap":
        if not arg.isdigit():
            raise TrieError(f"cap needs a whole number, as in 'cap:2', got {text!r}")
        return StopRule("cap", int(arg))
    if arg:
        raise TrieError(f"stopping rule {name!r} takes no parameter, got {text!r}")
    return StopRule(name)


@dataclass(frozen=True)
class StopOutcome:
    """Exact law of one stopping rule on one trie."""

    expected_acceptance: object  # E[A]
    coverage: object  # Pr(C)
    shortfall: object  # tau*(T) - E[A] = E[(L_T - A) 1_C]
    covered: dict  # covered continuation address -> probability
    unused: dict  # covered address -> E[L_T - A | that address]


def as_trie(prefixes) -> frozenset:
    """Validated prefix-closed trie (the root ``()`` is added when missing)."""
    trie = frozenset(tuple(u) for u in prefixes) | {()}
    for u in trie:
        if u and u[:-1] not in trie:
            raise TrieError(f"trie is not prefix-closed: {u!r} lacks its parent {u[:-1]!r}")
    return trie


def _as_row(row, where) -> dict:
    items = row.items() if isinstance(row, Mapping) else enumerate(np.asarray(row).tolist())
    out = {x: (Fraction(v) if isinstance(v, (int, Fraction)) else float(v)) for x, v in items}
    total = sum(out.values())
    if any(v < 0 for v in out.values()):
        raise TrieError(f"row at {where!r} has a negative probability")
    exact = all(isinstance(v, Fraction) for v in out.values())
    if (total != 1) if exact else abs(total - 1) > 1e-6:
        raise TrieError(f"row at {where!r} sums to {total}, not 1")
    return out


def _rows_on(trie, rows) -> dict:
    missing = [u for u in trie if u not in rows]
    if missing:
        raise TrieError(f"no target row at trie node {min(missing, key=len)!r}")
    return {u: _as_row(rows[u], u) for u in trie}


def iid_rows(prefixes, row) -> dict:
    """The same row at every prefix (an IID target)."""
    return {tuple(u): row for u in as_trie(prefixes)}


def path_prob(u: Prefix, rows) -> object:
    """``p(u|c)``: product of the target transitions along ``u``."""
    prob = 1
    for d in range(len(u)):
        if u[:d] not in rows:
            raise TrieError(f"no target row at {u[:d]!r} on the path to {u!r}")
        row = _as_row(rows[u[:d]], u[:d])
        prob = prob * row.get(u[d], 0)
    return prob


def tau_star(trie, rows) -> object:
    """``tau*(T) = sum of p(u|c) over non-root u in T`` (expected exhaustive acceptance)."""
    trie = as_trie(trie)
    return sum((path_prob(u, rows) for u in trie if u), 0)


def frontier(trie, scored) -> frozenset:
    """Scored prefixes outside ``T`` whose parent is in ``T``."""
    trie = as_trie(trie)
    return frozenset(tuple(u) for u in scored if u and tuple(u) not in trie and tuple(u)[:-1] in trie)


def frontier_coverage(trie, scored, rows) -> object:
    """``Pr(C) = sum_{u in F} p(u|c)`` for exhaustive traversal with scored set ``Q``."""
    return sum((path_prob(u, rows) for u in frontier(trie, scored)), 0)


def _scored_set(trie, scored) -> frozenset:
    scored = trie if scored is None else frozenset(tuple(u) for u in scored) | {()}
    if not trie <= scored:
        raise TrieError(f"scored set lacks trie node {min(trie - scored, key=len)!r}")
    return scored


def _children(nodes, within) -> dict:
    kids = {u: [] for u in within}
    for v in nodes:
        if v and v[:-1] in kids:
            kids[v[:-1]].append(v)
    return kids


def _subtree_depth(trie, rows, kids) -> dict:
    """``sub[u] = E[L_T - |u| | X_{1:|u|} = u]`` for every trie node (deepest first)."""
    sub = {}
    for u in sorted(trie, key=len, reverse=True):
        sub[u] = sum((rows[u].get(v[-1], 0) * (1 + sub[v]) for v in kids[u]), 0)
    return sub


def stopping(trie, rows, rule: StopRule | str = "exhaustive", scored=None) -> StopOutcome:
    """Exact E[A], coverage and shortfall of a stopping rule on trie ``T`` with scored set ``Q``."""
    rule = parse_stop(rule) if isinstance(rule, str) else rule
    trie = as_trie(trie)
    scored = _scored_set(trie, scored)
    rows = _rows_on(trie, rows)
    trie_kids = _children(trie, trie)
    scored_kids = _children(scored, trie)
    sub = _subtree_depth(trie, rows, trie_kids)
    accepted, covered, stack = 0, {}, [((), 1)]
    while stack:
        u, reach = stack.pop()
        for v in scored_kids[u]:
            prob = reach * rows[u].get(v[-1], 0)
            if v in trie and rule.continues(v, bool(trie_kids[v])):
                accepted = accepted + prob
                stack.append((v, prob))
            elif prob:
                covered[v] = covered.get(v, 0) + prob
    unused = {v: (1 + sub[v] if v in trie else 0) for v in covered}
    return StopOutcome(
        expected_acceptance=accepted,
        coverage=sum(covered.values(), 0),
        shortfall=sub[()] - accepted,
        covered=covered,
        unused=unused,
    )


def _index(trie, scored, rows, rule):
    """Array form of a trie for simulation: (probs, child, in_scored, continues)."""
    nodes = sorted(trie, key=lambda u: (len(u), repr(u)))
    where = {u: i for i, u in enumerate(nodes)}
    tokens = list(dict.fromkeys(x for u in nodes for x in rows[u]))
    tok = {x: j for j, x in enumerate(tokens)}
    probs = np.zeros((len(nodes), len(tokens)))  # (n_nodes, V)
    child = np.full((len(nodes), len(tokens)), -1)  # trie index of u x, -1 outside T
    in_scored = np.zeros((len(nodes), len(tokens)), dtype=bool)
    kids = _children(trie, trie)
    cont = np.array([bool(u) and rule.continues(u, bool(kids[u])) for u in nodes])
    for u, i in where.items():
        for x, pr in rows[u].items():
            probs[i, tok[x]] = float(pr)
            child[i, tok[x]] = where.get(u + (x,), -1)
            in_scored[i, tok[x]] = u + (x,) in scored
    return probs, child, in_scored, cont


def simulate(trie, rows, rule: StopRule | str = "exhaustive", scored=None, n=100_000, seed=0):
    """Monte-Carlo draws of a stopping rule: (accepted (n,) int, covered (n,) bool)."""
    rule = parse_stop(rule) if isinstance(rule, str) else rule
    trie = as_trie(trie)
    scored = _scored_set(trie, scored)
    probs, child, in_scored, cont = _index(trie, scored, _rows_on(trie, rows), rule)
    cdf = np.cumsum(probs, axis=1)  # (n_nodes, V)
    rng = np.random.default_rng(seed)
    node = np.zeros(n, dtype=int)
    accepted = np.zeros(n, dtype=int)
    covered = np.zeros(n, dtype=bool)
    active = np.ones(n, dtype=bool)
    for _ in range(max(len(u) for u in trie) + 1):
        draw = rng.random(n)
        token = np.minimum((draw[:, None] >= cdf[node]).sum(1), probs.shape[1] - 1)  # (n,)
        nxt = child[node, token]
        go = active & (nxt >= 0) & cont[np.maximum(nxt, 0)]
        stop = active & ~go
        covered[stop] = in_scored[node[stop], token[stop]]
        accepted += go
        node = np.where(go, nxt, node)
        active = go
    return accepted, covered
