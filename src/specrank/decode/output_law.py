"""A sampled decode's output law checked against the target's exact one: the law of the next two tokens after a
prefix, computed from the target's rows, and a chi-square of observed decodes against it. Lossless speculative
decoding emits exactly the target's law whatever the drafter proposes, so a decoder, or an engine with a plugin
changing its drafts, passes; a wrong rejection rule fails (each check runs such a rule as its negative control).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import chisquare


@dataclass(frozen=True)
class TwoTokenLaw:
    """P(x1, x2 | prefix) at a temperature, for the likeliest first tokens: ``first`` (m,) the first tokens whose
    probability reaches the threshold, ``cells`` (m, V) their joint probabilities with each second token;
    ``rest`` = 1 - cells.sum(), the mass of every other first token."""

    first: np.ndarray
    cells: np.ndarray

    @property
    def rest(self) -> float:
        return max(0.0, 1.0 - float(self.cells.sum()))

    def counts(self, pairs) -> tuple[np.ndarray, int]:
        """Observed (x1, x2) ``pairs`` as (m, V) counts in the law's cells and the count of the rest."""
        row = {int(t): i for i, t in enumerate(self.first)}
        observed, rest = np.zeros(self.cells.shape), 0
        for a, b in pairs:
            if int(a) in row:
                observed[row[int(a)], int(b)] += 1
            else:
                rest += 1
        return observed, rest

    def pvalue(self, pairs) -> float:
        """Chi-square p-value of ``pairs`` (n decodes' first two tokens) against the law (``pooled_chisquare``,
        the rest as one more cell)."""
        observed, rest = self.counts(pairs)
        n = observed.sum() + rest
        expected = np.vstack([self.cells, np.eye(1, self.cells.shape[1])[0] * self.rest]) * n
        return pooled_chisquare(np.vstack([observed, np.eye(1, self.cells.shape[1])[0] * rest]), expected)


@torch.no_grad()
def two_token_law(model, prefix: list[int], temperature: float, threshold: float) -> TwoTokenLaw:
    """The exact law of the two tokens after ``prefix`` under a Hugging Face causal LM at ``temperature``
    (softmax of the rows / T in float64), for first tokens of probability >= ``threshold`` (one batched forward
    over them)."""
    p1 = torch.softmax(model(torch.tensor([prefix])).logits[0, -1].double() / temperature, -1)
    first = torch.nonzero(p1 >= threshold)[:, 0]
    rows = model(torch.tensor([prefix + [int(t)] for t in first])).logits[:, -1].double()
    p2 = torch.softmax(rows / temperature, -1)
    return TwoTokenLaw(first.numpy(), (p1[first, None] * p2).numpy())


def pooled_chisquare(observed: np.ndarray, expected: np.ndarray) -> float:
    """Chi-square p-value over (x1, x2) cells (rows x1): cells expecting fewer than 5 are pooled per row, rows
    whose pool expects fewer than 5 into one last bin."""
    keep = expected >= 5
    row_obs, row_exp = np.where(keep, 0, observed).sum(1), np.where(keep, 0, expected).sum(1)
    row_keep = row_exp >= 5
    obs = np.concatenate([observed[keep], row_obs[row_keep], [row_obs[~row_keep].sum()]])
    exp = np.concatenate([expected[keep], row_exp[row_keep], [max(row_exp[~row_keep].sum(), 1e-9)]])
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
