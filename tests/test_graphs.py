"""The static KV cache, the fixed-shape passes that CUDA graphs capture, and the round's host synchronisation.

On the CPU a pass with ``graphs`` on runs eagerly on its own input buffers, reading the cache's whole capacity
under a padded mask: everything a captured pass does but the capture. ``tests/test_cuda.py`` checks the capture
itself on a GPU.
"""

import numpy as np
import pytest
import torch

import specrank.decode.core as core
import specrank.decode.engine.prompt as prompt_loop
import specrank.decode.verify.exhaustive as exhaustive
from specrank.decode import Decoder, load_drafter
from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape, causal_mask
from specrank.decode.kv_cache import KVStore, StaleCacheError
from specrank.decode.runs.recorder import record_prompt
from specrank.decode.strategies import STRATEGIES, make_strategy
from specrank.testing import save_tiny_eagle3
from decode_helpers import PROMPT, decode_prompt_online, greedy_reference, tiny_pair

SHAPE = PoolShape(4, 4, 4)
PROMPTS = [PROMPT] + [[2, 5, 7, 16, 25, 19, 3, 2, 6 + i, 30 + 3 * i][: 8 + i] for i in range(1, 3)]


def with_graphs(pair, on: bool):
    for model in pair:
        model.graphs = on
    return pair


@pytest.fixture(scope="module")
def pair():
    return with_graphs(tiny_pair(scale=0.05, seed=4), True)


@pytest.mark.parametrize("rule", sorted(STRATEGIES))
def test_fixed_shape_passes_decode_the_target_greedy_text(pair, rule):
    target, drafter = pair
    config = DecodeConfig(SHAPE, budget=8, extra=0, max_new_tokens=32)
    for prompt in PROMPTS[:2]:
        out, _ = decode_prompt_online(target, drafter, prompt, config, make_strategy(rule))
        assert out == greedy_reference(target, prompt, 32), rule


def test_each_shape_is_captured_once_and_later_prompts_only_replay():
    """A fresh pair (the module's shares its captures with whichever tests ran before on the same worker): the
    first decode of each prompt captures the shapes it needs, a second decode of every prompt only replays."""
    target, drafter = with_graphs(tiny_pair(scale=0.05, seed=4), True)
    config = DecodeConfig(SHAPE, budget=8, extra=0, max_new_tokens=24)
    decode_prompt_online(target, drafter, PROMPTS[0], config, make_strategy("draft"))
    first = target.passes.captures, drafter.passes.captures
    assert first[0] >= 1 and first[1] >= 2  # the tree pass; a draft step (each level's frontier is 4 wide)
    for prompt in PROMPTS[1:]:  # and the root steps (one shape per accepted length)
        decode_prompt_online(target, drafter, prompt, config, make_strategy("draft"))
    captured = target.passes.captures, drafter.passes.captures
    for prompt in PROMPTS:
        out, _ = decode_prompt_online(target, drafter, prompt, config, make_strategy("draft"))
        assert out == greedy_reference(target, prompt, 24)
    assert (target.passes.captures, drafter.passes.captures) == captured


def test_an_eagle3_head_with_fixed_shape_passes_decodes_the_target_greedy_text(pair, tmp_path):
    target, _ = pair
    drafter = load_drafter(f"eagle3:{save_tiny_eagle3(tmp_path / 'head', target.model.config, seed=0)}", target)
    assert drafter.graphs  # inherited from the target
    for strategy in ("draft", "root"):
        out = Decoder(target, drafter, strategy, budget=6, shape=SHAPE).generate(PROMPT, max_new_tokens=20,
                                                                                 temperature=0)
        assert out.tokens == greedy_reference(target, PROMPT, 20), strategy
    assert drafter.passes.captures >= 2  # the draft steps' shape and at least one root step's


def test_recorded_rounds_with_fixed_shape_passes_equal_the_eager_ones():
    """Every recorded edge probability within float32 rounding of the eager run's, at T = 1 (same draws)."""
    config = DecodeConfig(PoolShape(3, 3, 3), budget=4, extra=21, temperature=1.0, max_new_tokens=16, seed=5)
    runs = []
    for on in (False, True):
        target, drafter = with_graphs(tiny_pair(scale=0.05, seed=4), on)
        runs.append(record_prompt(target, drafter, PROMPT, config, prompt_id="p"))
    (out_eager, eager), (out_fixed, fixed) = runs
    assert out_fixed == out_eager and len(fixed) == len(eager)
    for a, b in zip(eager, fixed):
        np.testing.assert_array_equal(a["token"], b["token"])
        np.testing.assert_allclose(b["p_edge"], a["p_edge"], rtol=1e-4, atol=1e-6, equal_nan=True)  # sums over padded keys


@pytest.mark.parametrize("on", [False, True])
def test_a_store_outgrown_mid_prompt_keeps_its_context(on):
    """A store of 4 positions doubles several times within one decode (and its captured passes are dropped
    with the old buffers); the output is still the target's greedy text."""
    target, drafter = with_graphs(tiny_pair(scale=0.05, seed=4), on)
    target.store, drafter.store = KVStore(4), KVStore(4)
    out, _ = decode_prompt_online(target, drafter, PROMPT, DecodeConfig(SHAPE, budget=8, max_new_tokens=40),
                                  make_strategy("draft"))
    assert out == greedy_reference(target, PROMPT, 40)
    assert target.store.capacity >= len(PROMPT) + len(out) and target.store.generation >= 2


def test_a_cache_taken_over_by_a_newer_prompt_refuses_to_be_used(pair):
    target, _ = pair
    older = target.new_cache()
    target.forward(torch.tensor([2, 5, 7]), torch.arange(3), causal_mask(3, 0), older)
    newer = target.new_cache()
    with pytest.raises(StaleCacheError):
        target.forward(torch.tensor([9]), torch.tensor([3]), causal_mask(1, 3), older)
    with pytest.raises(StaleCacheError):
        older.crop(1)
    target.forward(torch.tensor([2]), torch.arange(1), causal_mask(1, 0), newer)
    assert newer.get_seq_length() == 1


class HostReads:
    """Counts, inside decoding rounds only, the calls that make the host wait for a device: ``.item()``,
    ``.cpu()``, ``.tolist()`` and ``int()`` / ``float()`` / ``bool()`` of a tensor, plus copies through
    ``core.host_arrays`` (the round's funnel: one wait for all it copies)."""

    WAITS = ("item", "cpu", "tolist", "__int__", "__float__", "__bool__")

    def __init__(self, monkeypatch):
        self.inside, self.counts, self.rounds = False, dict.fromkeys(self.WAITS + ("host_arrays",), 0), 0
        for name in self.WAITS:
            monkeypatch.setattr(torch.Tensor, name, self.counted(name, getattr(torch.Tensor, name)))
        for module in (core, exhaustive):
            monkeypatch.setattr(module, "host_arrays", self.counted("host_arrays", core.host_arrays))
        decode_round = prompt_loop.decode_round

        def counted_round(*args, **kwargs):
            self.inside, self.rounds = True, self.rounds + 1
            try:
                return decode_round(*args, **kwargs)
            finally:
                self.inside = False

        monkeypatch.setattr(prompt_loop, "decode_round", counted_round)

    def counted(self, name, fn):
        def call(*args, **kwargs):
            if self.inside:
                self.counts[name] += 1
            return fn(*args, **kwargs)

        return call


def greedy_draft_rounds(pair):
    """A decode as users run it: no observer (measuring a round reads the host on purpose)."""
    target, drafter = pair
    config = DecodeConfig(SHAPE, budget=8, extra=0, max_new_tokens=24)
    return prompt_loop.decode_prompt(target, drafter, PROMPT, config, make_strategy("draft"))


def test_a_greedy_draft_round_copies_to_the_host_once(monkeypatch):
    """The pool is the round's one copy to the host; nothing else in the round reads a tensor's value on the
    host but the verifier's draws (on the CPU a row's argmax; on a GPU, where they would each wait, all
    rows' argmaxes in one copy)."""
    pair = with_graphs(tiny_pair(scale=0.05, seed=4), False)
    reads = HostReads(monkeypatch)
    greedy_draft_rounds(pair)
    assert reads.rounds >= 3
    assert reads.counts["host_arrays"] == reads.rounds
    assert reads.counts["item"] == reads.counts["cpu"] == reads.counts["tolist"] == 0
    assert reads.counts["__float__"] == reads.counts["__bool__"] == 0
    # the verifier's lazy CPU draws: one per row on the accepted path plus the continuation, at most depth + 1
    assert reads.counts["__int__"] <= reads.rounds * (SHAPE.depth + 1)


def test_the_host_read_count_sees_a_round_that_waits_more(monkeypatch):
    """Negative control: a drafter whose commit reads a value on the host is counted."""
    pair = with_graphs(tiny_pair(scale=0.05, seed=4), False)
    target, drafter = pair
    commit = drafter.commit

    def reading_commit(tokens, target_hidden=None):
        torch.as_tensor(tokens).sum().item()
        return commit(tokens, target_hidden)

    monkeypatch.setattr(drafter, "commit", reading_commit)
    reads = HostReads(monkeypatch)
    greedy_draft_rounds(pair)
    assert reads.counts["item"] == reads.rounds


def test_a_pass_whose_capture_fails_runs_eagerly_with_one_line_on_stderr(monkeypatch, capsys):
    """A capture that raises leaves that shape eager from then on: the decode's output is unchanged, one line
    a failed shape names it and the error, and the failed shape is never tried again."""
    import specrank.decode.graphs as graphs

    attempts = []

    def failing_capture(fn, context, inputs, pool):
        attempts.append(inputs[0].shape[0])
        raise RuntimeError("operation not permitted when stream is capturing\nsecond line")

    monkeypatch.setattr(graphs, "can_capture", lambda tensor: True)  # the CPU takes the GPU's capture path
    monkeypatch.setattr(graphs, "capture_graph", failing_capture)
    target, drafter = with_graphs(tiny_pair(scale=0.05, seed=4), True)
    config = DecodeConfig(SHAPE, budget=8, extra=0, max_new_tokens=24)
    for prompt in PROMPTS[:2]:
        out, _ = decode_prompt_online(target, drafter, prompt, config, make_strategy("draft"))
        assert out == greedy_reference(target, prompt, 24)
    lines = capsys.readouterr().err.strip().splitlines()
    shapes = len(target.passes.failed) + len(drafter.passes.failed)
    assert shapes >= 2 and len(attempts) == shapes == len(lines)  # one try and one line per shape, not per pass
    assert all(line.startswith("specrank: CUDA graph capture failed for pass rows=") and "running it eagerly" in line
               and line.endswith("(RuntimeError: operation not permitted when stream is capturing)") for line in lines)


def test_a_capture_that_succeeds_prints_nothing(monkeypatch, capsys):
    """Negative control for the line above: the same decode through a capture path that works is silent."""
    import specrank.decode.graphs as graphs

    def eager_capture(fn, context, inputs, pool):
        class Graph:
            def pool(self):
                return None

            def replay(self):
                entry_outputs[:] = fn(context, *inputs)

        entry_outputs = list(fn(context, *inputs))
        return entry_outputs, Graph()

    monkeypatch.setattr(graphs, "can_capture", lambda tensor: True)
    monkeypatch.setattr(graphs, "capture_graph", eager_capture)
    target, drafter = with_graphs(tiny_pair(scale=0.05, seed=4), True)
    out, _ = decode_prompt_online(target, drafter, PROMPT, DecodeConfig(SHAPE, budget=8, max_new_tokens=24),
                                  make_strategy("draft"))
    assert out == greedy_reference(target, PROMPT, 24)
    assert capsys.readouterr().err == "" and not target.passes.failed and target.passes.captures >= 1
