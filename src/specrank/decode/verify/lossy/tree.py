"""Multi-draft tree verification as implemented in EAGLE-3 (lossy verification, arXiv 2607.26627, App. G.2-G.5).

A tree is ``token`` (n,) and ``parent`` (n,) with the row convention of
:class:`specrank.decode.verify.VerifyTree`: row 0 is the root, row ``i + 1`` is node ``i``,
``parent[i]`` is the row node ``i`` hangs from, parents precede children; ``probs``
(n + 1, V) are the target rows. Children of a row are tried in node order, each a point-mass
proposal: a child is accepted with probability ``h``, otherwise removed from the residual.

- ``SequentialLossless(None)``: lossless SD (in law, exhaustive target sampling);
- ``SequentialLossless(allowed)``: truncation sampling + SD, verified against ``p_A``;
- ``FirstAllowed(allowed)``: SpecCascade (min-p) or typical acceptance (eta): the first
  child in ``A`` is accepted; when none is, the continuation is drawn from ``p_A``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from specrank.decode.verify.lossy.diagnostics import kl_divergence, total_variation
from specrank.decode.verify.lossy.rules import Lossless, RuleError, TargetSampling, draw, normalize
from specrank.decode.verify.lossy.truncation import AllowedSet, TruncatedLossless, TruncationAcceptance, truncate


class SequentialLossless:
    """Sequential rejection of point-mass children against ``p`` or the truncated ``p_A``."""

    def __init__(self, allowed: AllowedSet | None = None):
        self.allowed = allowed
        self.name = "lossless" if allowed is None else f"truncated-lossless:{allowed.name}"

    def target(self, p: torch.Tensor) -> torch.Tensor:
        """The law this rule verifies against (..., V)."""
        return p if self.allowed is None else truncate(p, self.allowed)

    def child_accept(self, residual_at_child: torch.Tensor) -> torch.Tensor:
        """``min(1, r(c) / 1)`` for a point-mass proposal of ``c``."""
        return residual_at_child

    def node_accept(self, target, token, parent) -> torch.Tensor:
        """Closed form (G.3 Lemma 2): child ``c`` is accepted with probability ``p~(c)`` (n,)."""
        return target[parent, token]


class FirstAllowed:
    """SpecCascade / typical acceptance: accept the first child lying in the allowed set."""

    def __init__(self, allowed: AllowedSet):
        self.allowed = allowed
        self.name = f"first-allowed:{allowed.name}"

    def target(self, p: torch.Tensor) -> torch.Tensor:
        """The truncated target ``p_A``: children outside ``A`` carry no mass in it."""
        return truncate(p, self.allowed)

    def child_accept(self, residual_at_child: torch.Tensor) -> torch.Tensor:
        """1 for a child in ``A`` (positive truncated mass), else 0."""
        return (residual_at_child > 0).to(residual_at_child.dtype)

    def node_accept(self, target, token, parent) -> torch.Tensor:
        """Closed form: 1 for the first allowed child of each row, else 0 (n,)."""
        allowed = target[parent, token] > 0  # (n,)
        index = torch.arange(len(token))
        first = torch.full((target.shape[0],), len(token)).scatter_reduce(
            0, parent[allowed], index[allowed], reduce="amin"
        )
        return (allowed & (first[parent] == index)).to(target.dtype)


def tree_form(rule) -> SequentialLossless | FirstAllowed:
    """The EAGLE-3 tree form of a one-position rule (App. G.2 covers lossless and truncation rules)."""
    if isinstance(rule, (Lossless, TargetSampling)):
        return SequentialLossless()
    if isinstance(rule, TruncatedLossless):
        return SequentialLossless(rule.allowed)
    if isinstance(rule, TruncationAcceptance):
        return FirstAllowed(rule.allowed)
    raise RuleError(f"verifier {rule.name!r} has no tree form (lossless, exhaustive and truncation rules do)")


def check_tree(token, parent, probs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated (token, parent, probs) as tensors."""
    token, parent = torch.as_tensor(np.asarray(token)).long(), torch.as_tensor(np.asarray(parent)).long()
    n = len(token)
    if parent.shape != (n,) or probs.shape[0] != n + 1 or probs.dim() != 2:
        raise RuleError(f"tree needs token (n,), parent (n,), probs (n + 1, V); got n={n}, probs {tuple(probs.shape)}")
    if bool((parent < 0).any()) or bool((parent > torch.arange(n)).any()):
        raise RuleError("each parent must be the root row 0 or an earlier node's row")
    if len(set(zip(parent.tolist(), token.tolist(), strict=True))) < n:
        raise RuleError("siblings must carry distinct tokens")
    if bool((probs < 0).any()) or bool(((probs.sum(-1) - 1).abs() > 1e-4).any()):
        raise RuleError("tree rows must be probability rows summing to 1")
    return token, parent, probs


class TreeLaw(NamedTuple):
    """Exact law of one tree verification (closed form)."""

    accept: torch.Tensor  # (n,) Pr(node accepted | its parent reached)
    reach: torch.Tensor  # (n + 1,) Pr(row reached); reach[0] = 1
    emission: torch.Tensor  # (n + 1, V) law of the next token at a reached row
    outcome: torch.Tensor  # (n + 1, V) Pr(traversal ends at row r emitting continuation y)
    position_acceptance: torch.Tensor  # (n + 1,) a(C): Pr(some child accepted | reached)
    block_efficiency: torch.Tensor  # () E[accepted draft tokens]


def tree_law(rule, token, parent, probs) -> TreeLaw:
    """Closed-form per-position and whole-tree law of ``rule`` on an explicit tree."""
    token, parent, probs = check_tree(token, parent, probs)
    target = rule.target(probs)  # (n + 1, V)
    accept = rule.node_accept(target, token, parent)  # (n,)
    kids = torch.zeros_like(target, dtype=torch.bool).index_put_((parent, token), torch.tensor(True))
    taken = torch.zeros_like(target).index_put_((parent, token), accept, accumulate=True)  # (n + 1, V)
    position = taken.sum(-1)
    # Rejecting every child leaves the target off the children (G.3): the continuation law.
    stop = (1 - position).unsqueeze(-1) * normalize(target * ~kids, target)  # (n + 1, V)
    reach = torch.ones(len(token) + 1, dtype=probs.dtype)
    depth = node_depth(parent)
    for d in range(1, int(depth.max()) + 1 if len(depth) else 1):
        level = torch.nonzero(depth == d).squeeze(-1)
        reach[level + 1] = reach[parent[level]] * accept[level]
    return TreeLaw(
        accept=accept,
        reach=reach,
        emission=stop + taken,
        outcome=reach.unsqueeze(-1) * stop,
        position_acceptance=position,
        block_efficiency=reach[1:].sum(),
    )


def node_depth(parent: torch.Tensor) -> torch.Tensor:
    """Depth of each node (n,), 1 for children of the root (parents precede children)."""
    depth = torch.zeros(len(parent) + 1, dtype=torch.long)
    for i, row in enumerate(parent.tolist()):  # one pass: a parent's depth is final before its children
        depth[i + 1] = depth[row] + 1
    return depth[1:]


def position_divergence(rule, token, parent, probs) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL, TV) of each row's emission law from the rule's target ``p~`` (each (n + 1,)), G.4."""
    law = tree_law(rule, token, parent, probs)
    target = rule.target(check_tree(token, parent, probs)[2])
    return kl_divergence(law.emission, target), total_variation(law.emission, target)


def sample_tree(rule, token, parent, probs, n: int, generator: torch.Generator | None = None):
    """``n`` independent traversals: (end row (n,), continuation (n,), accepted count (n,))."""
    token, parent, probs = check_tree(token, parent, probs)
    target = rule.target(probs)
    rows, width = target.shape
    order = torch.argsort(parent, stable=True)
    slot = torch.arange(len(token)) - torch.searchsorted(parent[order], parent[order])
    kids = torch.full((rows, int(slot.max()) + 1 if len(token) else 1), -1, dtype=torch.long)
    kids[parent[order], slot] = order  # (rows, K) child node indices in node order, -1 padded
    draws = torch.arange(n)
    row = torch.zeros(n, dtype=torch.long)
    residual = target[row].clone()  # (n, V)
    accepted = torch.zeros(n, dtype=torch.long)
    active = torch.ones(n, dtype=torch.bool)
    continuation = torch.full((n,), -1, dtype=torch.long)
    for _ in range(int(node_depth(parent).max()) + 1 if len(token) else 1):
        moved = torch.zeros(n, dtype=torch.bool)
        for k in range(kids.shape[1]):
            child = kids[row, k]
            trying = active & ~moved & (child >= 0)
            c = token[child.clamp_min(0)]
            u = torch.rand(n, generator=generator, dtype=probs.dtype)
            hit = trying & (u < rule.child_accept(residual[draws, c]))
            miss = (trying & ~hit).unsqueeze(-1)
            zeroed = residual.scatter(-1, c.unsqueeze(-1), 0.0)
            residual = torch.where(miss, normalize(zeroed, residual), residual)
            moved |= hit
            row = torch.where(hit, child + 1, row)
        stopping = active & ~moved
        if bool(stopping.any()):
            continuation[stopping] = draw(residual[stopping], generator)
        accepted += moved
        residual[moved] = target[row[moved]]
        active = moved
    return row, continuation, accepted
