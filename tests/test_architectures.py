"""Every common target family, exact: Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3 and Phi-3 as tiny random
targets whose sliding-window layers see 6 positions, decoded past the window.

For each: every lossless strategy, with fixed-shape passes (what CUDA graphs capture) on and off, emits the
target's greedy text (Hugging Face ``generate``, which builds its own sliding-window masks); recorded edge
probabilities equal a plain forward; an EAGLE-3 head reads its hidden states and decodes its greedy text; the
early-exit drafter (its first layers, with their windows) does too. A pattern the decoder cannot mask is refused
at load in one line.
"""

import numpy as np
import pytest
import torch

from specrank.decode import Decoder, PoolShape, load_drafter
from specrank.decode.attention import AttentionLayout, UnsupportedAttentionError
from specrank.decode.config import DecodeConfig
from specrank.decode.loading.target_passes import Target
from specrank.decode.loading.targets import load_target
from specrank.decode.runs import record_prompt, rounds_table
from specrank.decode.strategies import STRATEGY_NAMES
from specrank.featurize import featurize_rounds
from specrank.rerankers import IsotonicFirstFactor
from specrank.testing import ARCHITECTURES, WINDOW, save_tiny_eagle3, tiny_causal_lm, tiny_tokenizer
from decode_helpers import greedy_reference, noisy_drafter

PROMPT = [2, 5, 7, 16, 25, 19, 3, 2, 6] + [10 + (7 * i) % 90 for i in range(31)]  # 40 tokens: 6 windows
SHAPE = PoolShape(3, 3, 3)
NEW = 24


@pytest.fixture(scope="module", params=ARCHITECTURES)
def case(request):
    """(architecture, target, noisy-copy drafter, the target's greedy continuation, a reranker fitted on its
    recorded greedy rounds)."""
    torch.set_num_threads(1)
    target = Target(tiny_causal_lm(request.param, seed=0), tiny_tokenizer(128))
    drafter = noisy_drafter(target.model, 0.05)
    config = DecodeConfig(SHAPE, budget=4, extra=0, temperature=0.0, max_new_tokens=16)
    records = []
    for i in range(3):
        records += record_prompt(target, drafter, PROMPT[: 30 + 3 * i], config, f"p{i}")[1]
    frame = featurize_rounds(rounds_table(records, SHAPE.size, SHAPE.topk), {"temperature": 0.0, "topk": SHAPE.topk})
    reranker = IsotonicFirstFactor(n_bins=4).fit(frame)
    return request.param, target, drafter, greedy_reference(target, PROMPT, NEW), reranker


def test_the_context_crosses_the_window(case):
    arch, target, *_ = case
    assert len(PROMPT) > 5 * WINDOW
    assert (target.layout.window == WINDOW) == (arch != "llama")


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "fixed-shape"])
def test_every_lossless_strategy_emits_the_target_greedy_text(case, graphs):
    arch, target, drafter, reference, reranker = case
    target.graphs = drafter.graphs = graphs
    try:
        for strategy in STRATEGY_NAMES:
            decoder = Decoder(target, drafter, strategy, reranker=reranker if strategy == "reranked" else None,
                              budget=6, shape=SHAPE)
            out = decoder.generate(PROMPT, max_new_tokens=NEW, temperature=0)
            assert out.tokens == reference, (arch, strategy, graphs)
    finally:
        target.graphs = drafter.graphs = None


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "fixed-shape"])
def test_recorded_edge_probabilities_equal_a_plain_forward(case, graphs):
    arch, target, drafter, *_ = case
    target.graphs = drafter.graphs = graphs
    try:
        config = DecodeConfig(SHAPE, budget=4, extra=21, temperature=1.0, max_new_tokens=10, seed=3)
        out, records = record_prompt(target, drafter, PROMPT, config, prompt_id="p")
    finally:
        target.graphs = drafter.graphs = None
    full = PROMPT + sum(([int(r["token"][a]) for a in r["accepted_nodes"]] + [r["continuation"]] for r in records), [])
    worst = 0.0
    for r in records[:2]:
        ctx = full[: len(PROMPT) + r["position"]]  # committed context + root
        paths = []
        for j in range(len(r["token"])):
            path, k = [], r["parent"][j]
            while k >= 0:
                path.insert(0, int(r["token"][k]))
                k = r["parent"][k]
            paths.append(path)
        for j, path in enumerate(paths):
            with torch.no_grad():
                row = torch.softmax(target.model(torch.tensor([ctx + path])).logits[0, -1].float(), -1)
            worst = max(worst, abs(float(row[r["token"][j]]) - float(r["p_edge"][j])))
    assert worst < 1e-4, arch


def test_an_eagle3_head_reads_its_hidden_states_and_decodes_its_greedy_text(case, tmp_path):
    arch, target, _, reference, _ = case
    head = load_drafter(f"eagle3:{save_tiny_eagle3(tmp_path / 'head', target.model.config, seed=0)}", target)
    layers = head.hidden_layers  # the three hidden_states indices the head reads
    mask = torch.triu(torch.full((len(PROMPT), len(PROMPT)), float("-inf")), 1)
    _, hidden = target.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)), mask, target.new_cache(),
                               hidden_layers=layers)
    with torch.no_grad():
        plain = target.model(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
    width = target.hidden_size
    for k, i in enumerate(layers):
        if i < target.num_layers:  # the last layer's own output is read before the final norm
            np.testing.assert_allclose(hidden[:, k * width:(k + 1) * width], plain[i][0], rtol=1e-4, atol=1e-5)
    for strategy in ("draft", "root"):
        out = Decoder(target, head, strategy, budget=6, shape=SHAPE).generate(PROMPT, max_new_tokens=NEW,
                                                                              temperature=0)
        assert out.tokens == reference, (arch, strategy)


def test_the_early_exit_drafter_keeps_its_layers_windows(case):
    arch, target, _, reference, _ = case
    drafter = load_drafter("early-exit:3", target)  # layer 2 slides in every family that has windows
    assert drafter.layout.window == target.layout.window
    out = Decoder(target, drafter, "draft", budget=6, shape=SHAPE).generate(PROMPT, max_new_tokens=NEW, temperature=0)
    assert out.tokens == reference, arch


def test_a_target_without_its_windows_is_caught():
    """Negative control: the same decode with the windows dropped (one mask for every layer, as before) differs
    from the target's greedy text, so the tests above can fail."""
    torch.set_num_threads(1)
    target = Target(tiny_causal_lm("gemma3", seed=0), tiny_tokenizer(128))
    drafter = noisy_drafter(target.model, 0.05)
    reference = greedy_reference(target, PROMPT, NEW)
    target.layout = AttentionLayout()
    out = Decoder(target, drafter, "draft", budget=6, shape=SHAPE).generate(PROMPT, max_new_tokens=NEW, temperature=0)
    assert out.tokens != reference


@pytest.mark.parametrize("arch, change, why", [
    ("gemma3", dict(use_bidirectional_attention=True), "bidirectional attention"),
    ("llama", dict(attention_chunk_size=4), "chunked attention"),
])
def test_an_attention_pattern_the_decoder_cannot_mask_is_refused_at_load(tmp_path, arch, change, why):
    model = tiny_causal_lm(arch, seed=0)
    for key, value in change.items():
        setattr(model.config, key, value)
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer(128).save_pretrained(tmp_path / "m")
    with pytest.raises(UnsupportedAttentionError) as caught:
        load_target(str(tmp_path / "m"))
    message = str(caught.value)
    assert why in message and "\n" not in message


def test_unknown_layer_types_are_refused_by_name():
    model = tiny_causal_lm("qwen3", seed=0)
    model.config.layer_types = ["full_attention", "linear_attention", "full_attention", "linear_attention"]
    with pytest.raises(UnsupportedAttentionError, match="layer types linear_attention are not supported"):
        Target(model, tiny_tokenizer(128))


def test_an_eagle3_head_looks_the_embedding_up_unscaled_in_the_shared_table(case, tmp_path):
    """Gemma scales its embeddings by sqrt(hidden size); SpecForge's and SGLang's EAGLE-3 heads look the target's
    table up plainly. The head shares the table (no copy) and reads it unscaled, for every family."""
    arch, target, *_ = case
    drafter = load_drafter(f"eagle3:{save_tiny_eagle3(tmp_path / 'head', target.model.config, seed=0)}", target)
    table = target.model.get_input_embeddings().weight
    ids = torch.tensor(PROMPT[:5])
    assert drafter.head.embed_tokens.weight.data_ptr() == table.data_ptr()
    assert torch.equal(drafter.head.embed_tokens(ids), table[ids])
    if arch.startswith("gemma"):  # negative control: the target's own lookup is scaled
        assert not torch.allclose(target.model.get_input_embeddings()(ids), table[ids])


def test_a_trained_head_starts_from_the_final_norm_scale_of_each_family(case):
    """Llama's RMS norm scales by its weight, Gemma's by 1 + weight: the head's (Llama) norm gets the scale."""
    from specrank.drafter_training.head import norm_scale

    arch, target, *_ = case
    norm = target.final_norm
    expected = norm.weight + 1 if arch.startswith("gemma") else norm.weight
    torch.testing.assert_close(norm_scale(norm), expected.float(), rtol=1e-5, atol=1e-5)
