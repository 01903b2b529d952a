
import numpy as np
import pytest
import torch

from specrank.decode.config import DecodeConfig
from specrank.decode.engine.prompt import final_output
from specrank.decode.runs.recorder import record_prompt as decode_prompt
from specrank.decode.core import PoolShape
from specrank.decode.verify import ExhaustiveVerifier

from decode_helpers import RedrawVerifier, noisy_drafter, pooled_chisquare, tiny_target

PROMPT = [2, 5, 7, 16, 25, 19, 3, 2, 6]
torch.set_num_threads(1)
EOS = 3
SMALL = PoolShape(topk=3, depth=3, expand=3)  # 21 candidates


@pytest.mark.parametrize("cfg, shape, budget", [
    (dict(vocab=128), PoolShape(4, 4, 4), 10),
    (dict(vocab=64, hidden_size=48, num_layers=2), PoolShape(3, 5, 2), 7),
    (dict(vocab=150, num_layers=3, num_key_value_heads=4), PoolShape(5, 3, 5), 30),
])
def test_greedy_output_equals_target_greedy(cfg, shape, budget):
    target = tiny_target(**cfg)
    drafter = noisy_drafter(target.model, 0.05)
    config = DecodeConfig(shape, budget=budget, extra=12, max_new_tokens=24)
    out, records = decode_prompt(target, drafter, PROMPT, config)
    with torch.no_grad():
        ref = target.model.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False)[0, len(PROMPT):]
    assert out == ref.tolist()
    assert sum(r["accepted"] for r in records) >= 3  # accepted paths were committed


def test_recorded_p_edge_equals_plain_forward_and_rounds_reproduce_output():
    target = tiny_target()
    drafter = noisy_drafter(target.model, 0.05, seed=1)
    config = DecodeConfig(SMALL, budget=3, extra=21, temperature=1.0, max_new_tokens=12, seed=3)
    out, records = decode_prompt(target, drafter, PROMPT, config, prompt_id="p")
    full = PROMPT + sum(([int(r["token"][a]) for a in r["accepted_nodes"]] + [r["continuation"]] for r in records), [])
    assert out == final_output(full[len(PROMPT):], {3}, 12)
    worst = 0.0
    for r in records[:3]:
        ctx = full[: len(PROMPT) + r["position"]]  # committed context + root
        assert ctx[-1] == r["root_token"]
        for j in range(len(r["token"])):
            path, k = [], r["parent"][j]
            while k >= 0:
                path.insert(0, int(r["token"][k]))
                k = r["parent"][k]
            with torch.no_grad():
                row = torch.softmax(target.model(torch.tensor([ctx + path])).logits[0, -1], -1)
            worst = max(worst, abs(float(row[r["token"][j]]) - float(r["p_edge"][j])))
            assert r["p_argmax_child"][j] == int(row.argmax() == r["token"][j])
        assert r["n_scored"] == 1 + 21  # extra = pool size: root + every candidate
        assert not r["covered"] or r["emitted_rank"] >= 0  # a covered address is a pool candidate
        assert r["covered"] == (r["emitted_rank"] >= 0)  # extra = pool size: every candidate is scored
    assert worst < 1e-4
    matched = [r["matched_tv"] for r in records if not np.isnan(r["matched_tv"])]
    assert matched and max(matched) < 1e-4  # the row at a covered address is the next root row
    for prev, nxt in zip(records, records[1:]):
        assert nxt["root_token"] == prev["continuation"]
        assert nxt["position"] == prev["position"] + prev["accepted"] + 1


def _first_two_pvalue(target, drafter, verifier, n, temperature):
    config = DecodeConfig(PoolShape(3, 2, 3), budget=4, extra=0, temperature=temperature, max_new_tokens=2)
    with torch.no_grad():
        p1 = torch.softmax(target.model(torch.tensor([PROMPT])).logits[0, -1] / temperature, -1)
        v = p1.shape[0]
        both = torch.tensor([PROMPT + [x] for x in range(v)])
        p2 = torch.softmax(target.model(both).logits[:, -1] / temperature, -1)
    exact = (p1[:, None] * p2).double()  # (V, V) law of the first two tokens
    exact[EOS], exact[EOS, EOS] = 0.0, p1[EOS]  # output stops at EOS: cell (EOS, EOS) stands for "EOS first"
    exact = exact.reshape(-1).numpy()
    counts = np.zeros_like(exact)
    for seed in range(n):
        out, _ = decode_prompt(target, drafter, PROMPT, DecodeConfig(**{**config.__dict__, "seed": seed}),
                               prompt_id="q", verifier=verifier)
        counts[out[0] * v + (out + [EOS])[1]] += 1
    return pooled_chisquare(counts.reshape(v, v), exact.reshape(v, v) * n)


def test_sampling_first_tokens_follow_target_law_and_wrong_verifier_fails():
    torch.set_num_threads(1)
    target = tiny_target(vocab=32, hidden_size=16, num_layers=2)  # root row: top-3 mass ~0.55
    drafter = noisy_drafter(target.model, 0.05, seed=2)
    assert _first_two_pvalue(target, drafter, ExhaustiveVerifier(1.0), 160, 1.0) > 1e-3
    assert _first_two_pvalue(target, drafter, RedrawVerifier(1.0), 160, 1.0) < 1e-4


def test_generator_is_seeded_per_prompt_and_run():
    target = tiny_target()
    drafter = noisy_drafter(target.model, 0.05)
    config = DecodeConfig(SMALL, budget=6, extra=0, temperature=1.0, max_new_tokens=10, seed=7)
    a, _ = decode_prompt(target, drafter, PROMPT, config, prompt_id="x")
    decode_prompt(target, drafter, PROMPT, config, prompt_id="other")  # order does not matter
    b, _ = decode_prompt(target, drafter, PROMPT, config, prompt_id="x")
    c, _ = decode_prompt(target, drafter, PROMPT, DecodeConfig(**{**config.__dict__, "seed": 8}), prompt_id="x")
    assert a == b and a != c


def test_config_rejects_budget_over_pool_size():
    with pytest.raises(ValueError, match="budget 22 must be in 1..21"):
        DecodeConfig(SMALL, budget=22)
