"""Shared helpers of the verification-rule tests: random rows and a chi-square check."""

import numpy as np
import pytest
import torch
from scipy import stats

V = 6


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one torch thread avoids spinning on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_rows(seed: int, n: int = 1, vocab: int = V, alpha: float = 0.6) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random (p, q) pairs (n, vocab), float64 Dirichlet rows."""
    rng = np.random.default_rng(seed)
    p = torch.tensor(rng.dirichlet(np.full(vocab, alpha), size=n))
    q = torch.tensor(rng.dirichlet(np.full(vocab, alpha), size=n))
    return p, q


def chi_square_pvalue(samples: torch.Tensor, law: torch.Tensor) -> float:
    """p-value of ``samples`` (flat ints) against ``law`` (flat probs); 0 when a draw has zero law."""
    counts = np.bincount(samples.reshape(-1).numpy(), minlength=law.numel()).astype(float)
    law = law.reshape(-1).double().numpy()
    if counts[law <= 0].sum() > 0:
        return 0.0
    keep = law > 0
    expected = law[keep] / law[keep].sum() * counts.sum()
    if keep.sum() < 2:
        return 1.0
    return float(stats.chisquare(counts[keep], expected).pvalue)
