"""The decoding loop on a CUDA device: greedy output equal to the target's own greedy decoding for every
strategy and drafter kind, online reranker features and predictions equal to the offline featurizer's on rounds
recorded on the device, and recorded target probabilities equal to a CPU recording's.

Skipped where no CUDA device is visible (CI has none): run ``pytest tests/test_cuda.py`` on a GPU machine.
Models are float32, so the device's tree pass and the target's sequential greedy decoding agree on every argmax.
"""

import numpy as np
import pytest
import torch

from specrank.decode import Decoder, load_drafter
from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.runs.measure import Measure
from specrank.decode.runs.tables import rounds_table
from specrank.decode.strategies import STRATEGIES, make_strategy
from specrank.testing import save_tiny_eagle3
from decode_helpers import PROMPT, decode_prompt_online, tiny_pair
from online_helpers import CapturingReranked, assert_online_equals_offline, fitted_reranker, recorded

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPE = PoolShape(4, 3, 4)
PROMPTS = [[2, 5, 7, 16, 25, 19, 3, 2, 6 + i, 30 + 3 * i] for i in range(9)]
GREEDY = DecodeConfig(SHAPE, budget=4, extra=36, temperature=0.0, max_new_tokens=32)
MANIFEST = {"temperature": 0.0, "topk": SHAPE.topk}


def on_device(pair, device):
    target, drafter = pair
    target.model.to(device)
    drafter.model.to(device)
    return target, drafter


@pytest.fixture(scope="module")
def pairs():
    """The same tiny target and noisy drafter on the CPU and on the GPU (separate copies)."""
    return tiny_pair(scale=0.05, seed=4), on_device(tiny_pair(scale=0.05, seed=4), "cuda")


@pytest.fixture(scope="module")
def cuda_pair(pairs):
    return pairs[1]


def greedy_on(target, prompt, n):
    """The target's own greedy continuation (Hugging Face ``generate``) on the target's device."""
    ids = torch.tensor([prompt], device=target.device)
    with torch.no_grad():
        return target.model.generate(ids, max_new_tokens=n, do_sample=False)[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def training_rounds(cuda_pair):
    return rounds_table(recorded(*cuda_pair, make_strategy("draft"), GREEDY, PROMPTS[:5]), SHAPE.size, SHAPE.topk)


def test_the_models_are_on_the_gpu(cuda_pair):
    target, drafter = cuda_pair
    assert target.device.type == "cuda" and drafter.device.type == "cuda"


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_lossless_strategy_decodes_the_target_greedy_text(cuda_pair, name):
    target, drafter = cuda_pair
    config = DecodeConfig(PoolShape(4, 4, 4), budget=8, extra=0, max_new_tokens=32)
    out, _ = decode_prompt_online(target, drafter, PROMPT, config, make_strategy(name))
    assert out == greedy_on(target, PROMPT, 32)


def test_recorded_target_probabilities_equal_a_cpu_recording(pairs):
    """Every recorded edge probability of the GPU run within float32 rounding of the CPU run's; the pools and
    tokens are the same (the drafts agree on every argmax)."""
    (cpu_target, cpu_drafter), (gpu_target, gpu_drafter) = pairs
    cpu = recorded(cpu_target, cpu_drafter, make_strategy("draft"), GREEDY, PROMPTS[:2])
    gpu = recorded(gpu_target, gpu_drafter, make_strategy("draft"), GREEDY, PROMPTS[:2])
    assert len(cpu) == len(gpu)
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(a["token"], b["token"])
        np.testing.assert_array_equal(np.isnan(a["p_edge"]), np.isnan(b["p_edge"]))
        np.testing.assert_allclose(b["p_edge"], a["p_edge"], atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("kind,trees", [("isotonic", "quickscorer"), ("per-depth", "quickscorer"),
                                        ("base", "quickscorer"), ("rows", "quickscorer"), ("rows", "lightgbm"),
                                        ("stacked", "quickscorer")])
def test_online_rerank_on_the_gpu_equals_offline_and_keeps_greedy_output(cuda_pair, training_rounds, kind, trees,
                                                                          monkeypatch):
    """Rows retained on the device, read through their host copy: features bit for bit the offline featurizer's,
    predictions within 1e-12, the same trees, and the target's greedy text."""
    monkeypatch.setenv("SPECRANK_TREES", trees)
    target, drafter = cuda_pair
    strategy = CapturingReranked(fitted_reranker(kind, training_rounds, MANIFEST))
    records = []
    for i, ids in enumerate(PROMPTS[5:8]):
        out, recs = decode_prompt_online(target, drafter, ids, GREEDY, strategy, prompt_id=f"p{i:02d}", task="t",
                                         measure=Measure(record=True))
        records += recs
        assert out == greedy_on(target, ids, GREEDY.max_new_tokens)
    assert_online_equals_offline(strategy, records, GREEDY, MANIFEST)


@pytest.mark.parametrize("spec", ["early-exit:2", "eagle3"])
def test_built_in_drafters_on_the_gpu_decode_the_target_greedy_text(cuda_pair, training_rounds, spec, tmp_path):
    target, _ = cuda_pair
    if spec == "eagle3":
        spec = f"eagle3:{save_tiny_eagle3(tmp_path / 'eagle3', target.model.config, draft_vocab_size=48, seed=0)}"
    drafter = load_drafter(spec, target)
    model = drafter.head if spec.startswith("eagle3") else drafter.model
    assert all(p.device.type == "cuda" for p in model.parameters())
    reranker = fitted_reranker("rows", training_rounds, MANIFEST)
    for strategy in ("draft", "root", "reranked"):
        dec = Decoder(target, drafter, strategy, reranker=reranker if strategy == "reranked" else None, budget=4,
                      shape=SHAPE)
        out = dec.generate(PROMPT, max_new_tokens=16, temperature=0)
        assert out.tokens == greedy_on(target, PROMPT, 16), (spec, strategy)


def test_sampled_decoding_on_the_gpu_is_reproducible_from_its_seed(cuda_pair):
    target, drafter = cuda_pair
    def sample(seed):
        config = DecodeConfig(SHAPE, budget=4, extra=0, temperature=1.0, max_new_tokens=24, seed=seed)
        return decode_prompt_online(target, drafter, PROMPT, config, make_strategy("draft"))[0]

    first = sample(3)
    assert first == sample(3) and len(first) == 24 and first != sample(4)


def test_passes_are_captured_by_default_and_greedy_output_is_the_same_without_graphs(cuda_pair):
    """Graphs on (the default on a GPU): the tree pass and the draft steps replay captured graphs; off, every
    pass runs eagerly; both decode the target's greedy text in float32."""
    target, drafter = cuda_pair
    assert target.graphs and drafter.graphs
    config = DecodeConfig(PoolShape(4, 4, 4), budget=8, extra=0, max_new_tokens=32)
    outputs = {}
    for on in (True, False):
        target.graphs = drafter.graphs = on
        try:
            outputs[on] = [decode_prompt_online(target, drafter, ids, config, make_strategy("draft"))[0]
                           for ids in PROMPTS[:3]]
        finally:
            target.graphs = drafter.graphs = None
    assert outputs[True] == outputs[False] == [greedy_on(target, ids, 32) for ids in PROMPTS[:3]]
    graphs = [p.graph for p in (*target.passes.passes.values(), *drafter.passes.passes.values())]
    assert graphs and all(g is not None for g in graphs)


def test_a_greedy_round_on_the_gpu_waits_for_the_device_at_most_twice(cuda_pair, monkeypatch):
    """``torch.cuda.set_sync_debug_mode`` inside each round (after a warm-up prompt has captured every shape):
    the pool's copy to the host and the verifier's argmax copy are the only synchronisations."""
    import warnings

    import specrank.decode.engine.prompt as prompt_loop
    from specrank.decode.engine.prompt import decode_prompt

    target, drafter = cuda_pair
    config = DecodeConfig(PoolShape(4, 4, 4), budget=8, extra=0, max_new_tokens=24)
    decode_prompt(target, drafter, PROMPTS[0], config, make_strategy("draft"))  # captures every shape
    decode_round, rounds = prompt_loop.decode_round, []

    def watched_round(*args, **kwargs):
        rounds.append(1)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            return decode_round(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(prompt_loop, "decode_round", watched_round)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = decode_prompt(target, drafter, PROMPTS[0], config, make_strategy("draft"))
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert out == greedy_on(target, PROMPTS[0], 24) and len(rounds) >= 3
    assert len(syncs) <= 2 * len(rounds), [str(w.message)[:120] for w in syncs[:5]]
