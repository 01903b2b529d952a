"""One-position rules as tree verifiers: the EAGLE-3 tree form of a rule (lossy verification, arXiv 2607.26627,
App. G.2) behind the ``verify(tree, logits, generator)`` interface of tree speculation, recording each round's exact
per-position diagnostics along the emitted path (App. G.3-G.4).

Only lossless, exhaustive and truncation rules have a tree form; any other rule is refused here
with a one-line error (use chain speculation for them).
"""

from __future__ import annotations

import numpy as np
import torch

from specrank.decode.verify.lossy.emission import emission_diagnostics, target_probs
from specrank.decode.verify.exhaustive import VerifyTree
from specrank.decode.verify.lossy.rules import RuleError
from specrank.decode.verify.lossy.tree import sample_tree, tree_form, tree_law


def path_rows(parent: np.ndarray, end: int) -> np.ndarray:
    """Rows from the root (0) to ``end`` along ``parent`` (node i's parent row), in path order."""
    rows = [end]
    while rows[-1] != 0:  # at most the tree depth
        rows.append(int(parent[rows[-1] - 1]))
    return np.array(rows[::-1], dtype=np.int64)


class TreeRuleVerifier:
    """Verify each round's tree with ``rule``'s tree form at ``temperature`` (0 = greedy point masses).

    ``rounds`` collects one dict of per-position diagnostics per verified round, in round order;
    ``take()`` hands them over and clears them.
    """

    def __init__(self, rule, temperature: float = 0.0):
        if temperature < 0:
            raise RuleError(f"temperature must be >= 0, got {temperature}")
        try:
            self.form = tree_form(rule)
        except RuleError as err:
            raise RuleError(f"{err}; use --speculation chain") from None
        self.rule, self.temperature = rule, temperature
        self.rounds: list[dict] = []

    def verify(self, tree: VerifyTree, logits: torch.Tensor, generator: torch.Generator,
               first: int | None = None) -> tuple[np.ndarray, int]:
        probs = target_probs(logits.cpu(), self.temperature)  # (t + 1, V)
        if first is not None:  # the root draw was made before selection: row 0 is its point mass
            probs[0] = 0.0
            probs[0, first] = 1.0
        if len(tree.token) == 0:
            end, token = 0, int(torch.multinomial(self.form.target(probs[:1])[0], 1, generator=generator))
        else:
            ends, conts, _ = sample_tree(self.form, tree.token, tree.parent, probs, 1, generator)
            end, token = int(ends[0]), int(conts[0])
        rows = path_rows(tree.parent, end)
        self.rounds.append(self.diagnose(tree, probs, rows, token))
        return tree.pool_index[rows[1:] - 1].astype(np.int64), token

    def diagnose(self, tree: VerifyTree, probs: torch.Tensor, rows: np.ndarray, token: int) -> dict:
        """Exact emission law at every row of the emitted path vs the target and ``p_A``."""
        if len(tree.token):
            law = tree_law(self.form, tree.token, tree.parent, probs)
            emission, acceptance, expected = law.emission[rows], law.position_acceptance[rows], law.block_efficiency
        else:
            emission = self.form.target(probs[:1])
            acceptance, expected = torch.zeros(1, dtype=probs.dtype), torch.tensor(0.0)
        p = probs[rows]  # (k, V)
        truncated = None if self.form.allowed is None else self.form.target(p)
        emitted = np.append(tree.token[rows[1:] - 1], token)
        return {
            "token": emitted,
            "accepted": np.arange(len(rows)) < len(rows) - 1,
            "acceptance": acceptance.numpy(),
            "expected_accepted": float(expected),
            **emission_diagnostics(emission, p, truncated),
        }

    def take(self) -> list[dict]:
        """The recorded rounds since the last call, oldest first."""
        rounds, self.rounds = self.rounds, []
        return rounds
