"""Exhaustive target sampling over the verified tree (docs/design.md, verification), greedy and sampled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from specrank.decode.core import host_arrays
from specrank.law import Law


@dataclass
class VerifyTree:
    token: np.ndarray  # (n,) token of each tree node
    parent: np.ndarray  # (n,) parent's logits row: 0 = root, i + 1 = node i
    pool_index: np.ndarray  # (n,) pool index of each node
    q_edge: np.ndarray  # (n,) drafter probability of each node's token at its parent

    def child(self, row: int, token: int) -> int:
        """Node index of the child of ``row`` labelled ``token``, or -1."""
        hit = np.flatnonzero((self.parent == row) & (self.token == token))
        return int(hit[0]) if len(hit) else -1


class Verifier(Protocol):
    def verify(self, tree: VerifyTree, logits: torch.Tensor, generator: torch.Generator,
               first: int | None = None) -> tuple[np.ndarray, int]:
        """Accepted pool indices (path order) and the continuation token; ``first`` is the root draw when it
        was already made (from the same row, by a strategy that selects after drawing)."""
        ...


class ExhaustiveVerifier:
    """From the root, draw from the full target row (argmax when T = 0); a draw labelling
    a child is accepted and traversal moves there, otherwise it is the continuation."""

    def __init__(self, temperature: float = 0.0):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.temperature = temperature

    def draw(self, row: torch.Tensor, generator: torch.Generator) -> int:
        """One token from a (V,) logits row at this verifier's temperature (the generator lives on the host)."""
        if Law(self.temperature).greedy:
            return int(row.argmax())
        probs = torch.softmax(row.float() / self.temperature, dim=-1)
        return int(torch.multinomial(probs.cpu(), 1, generator=generator))

    def verify(self, tree: VerifyTree, logits: torch.Tensor, generator: torch.Generator,
               first: int | None = None) -> tuple[np.ndarray, int]:
        argmax = None
        if Law(self.temperature).greedy and logits.device.type != "cpu":  # one copy of every row's argmax, not a wait a row
            argmax = host_arrays(logits.argmax(-1))[0]
        path, row = [], 0
        while True:  # at most tree depth + 1 draws, each from one row: the path's rows only
            if row == 0 and first is not None:
                token = first
            else:
                token = int(argmax[row]) if argmax is not None else self.draw(logits[row], generator)
            node = tree.child(row, token)
            if node < 0:
                return tree.pool_index[path].astype(np.int64), token
            path.append(node)
            row = node + 1
