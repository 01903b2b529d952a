"""The output law's check: the exact two-token law of a tiny target, decodes drawn from it pass, decodes drawn
from a wrong law fail (the negative control)."""

import numpy as np
import torch

from decode_helpers import tiny_target
from specrank.decode.output_law import two_token_law

PROMPT = [2, 5, 7, 16, 25]


def draws(target, prompt, temperature, n, seed, wrong=False):
    """n (x1, x2) drawn from the target's rows (``wrong``: x2 drawn from the first row again)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        p1 = torch.softmax(target.model(torch.tensor([prompt])).logits[0, -1] / temperature, -1)
        x1 = torch.multinomial(p1, n, replacement=True, generator=gen)
        rows = target.model(torch.tensor([prompt + [int(t)] for t in x1])).logits[:, -1]
        p2 = p1.expand(n, -1) if wrong else torch.softmax(rows / temperature, -1)
        x2 = torch.multinomial(p2, 1, generator=gen)[:, 0]
    return list(zip(x1.tolist(), x2.tolist()))


def test_draws_from_the_exact_law_pass_and_draws_from_a_wrong_one_fail():
    target = tiny_target(64, num_layers=1, initializer_range=0.15)
    law = two_token_law(target.model, PROMPT, 1.0, threshold=0.02)
    assert 0 < law.rest < 1 and len(law.first) >= 3
    np.testing.assert_allclose(law.cells.sum() + law.rest, 1.0, atol=1e-9)
    assert law.pvalue(draws(target, PROMPT, 1.0, 3000, seed=0)) > 1e-3
    assert law.pvalue(draws(target, PROMPT, 1.0, 3000, seed=0, wrong=True)) < 1e-6
