import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specrank.decode.verify import ExhaustiveVerifier, VerifyTree

from decode_helpers import RedrawVerifier

V = 6
# root -> 2 (node 0), 4 (node 1); node 0 -> 1 (node 2); node 2 -> 5 (node 3)
TREE = VerifyTree(token=np.array([2, 4, 1, 5]), parent=np.array([0, 0, 1, 3]),
                  pool_index=np.array([0, 1, 10, 30]), q_edge=np.full(4, 0.5))


def _logits(seed=0):
    return torch.randn(5, V, generator=torch.Generator().manual_seed(seed)) * 1.5


def test_greedy_follows_argmax_until_no_child():
    logits = torch.zeros(5, V)
    logits[0, 2] = logits[1, 1] = logits[3, 5] = logits[4, 0] = 1.0
    accepted, cont = ExhaustiveVerifier(0.0).verify(TREE, logits, torch.Generator())
    assert list(accepted) == [0, 10, 30] and cont == 0
    logits[0, 2], logits[0, 3] = 0.0, 2.0  # root argmax labels no child
    accepted, cont = ExhaustiveVerifier(0.0).verify(TREE, logits, torch.Generator())
    assert list(accepted) == [] and cont == 3


def _first_two_exact(logits, temperature):
    p = torch.softmax(logits / temperature, -1).double().numpy()
    law = {}
    for x1 in range(V):
        node = TREE.child(0, x1)
        if node < 0:
            law[(x1, -1)] = p[0, x1]  # the round ends with x1 as continuation
        else:
            for x2 in range(V):
                law[(x1, x2)] = p[0, x1] * p[node + 1, x2]
    return law


def _pvalue(verifier, temperature, n=2000):
    logits = _logits()
    law = _first_two_exact(logits, temperature)
    keys = list(law)
    counts = dict.fromkeys(keys, 0)
    outside = 0  # events the exact law gives probability 0 (a wrong verifier may produce them)
    gen = torch.Generator().manual_seed(123)
    for _ in range(n):
        accepted, cont = verifier.verify(TREE, logits, gen)
        emitted = [int(TREE.token[np.flatnonzero(TREE.pool_index == a)[0]]) for a in accepted] + [cont]
        key = (emitted[0], emitted[1] if len(emitted) > 1 else -1)
        if key in counts:
            counts[key] += 1
        else:
            outside += 1
    expected = np.array([law[k] for k in keys]) * n
    observed = np.array([counts[k] for k in keys])
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum() + outside)
    exp = np.append(expected[keep], expected[~keep].sum())
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_law_matches_target_and_wrong_verifier_fails(temperature):
    assert _pvalue(ExhaustiveVerifier(temperature), temperature) > 1e-3
    assert _pvalue(RedrawVerifier(temperature), temperature) < 1e-6


def test_same_generator_seed_same_result_and_negative_temperature():
    a = ExhaustiveVerifier(1.0).verify(TREE, _logits(), torch.Generator().manual_seed(5))
    b = ExhaustiveVerifier(1.0).verify(TREE, _logits(), torch.Generator().manual_seed(5))
    assert list(a[0]) == list(b[0]) and a[1] == b[1]
    with pytest.raises(ValueError, match="temperature"):
        ExhaustiveVerifier(-1.0)
