"""Target loading and tree passes: exactness against sequential decoding, cache commit, errors."""

import hashlib
import time

import numpy as np
import pytest
import torch

from specrank.decode.core import ModelLoadError, causal_mask
from specrank.decode.loading.target_passes import Target
from specrank.decode.loading.targets import load_target
from specrank.testing import save_tiny_llama

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("target"), seed=0, num_layers=4)


@pytest.fixture(scope="module")
def target(target_dir):
    return load_target(target_dir)


def full_logits(target, ids, layers=()):
    """Plain causal forward of the whole sequence (the reference); layer L is read with the final norm
    taken out (the last layer's output before it), the others from HF ``hidden_states``."""
    out = target.model(input_ids=torch.tensor(ids)[None], output_hidden_states=True)
    norm, target.model.model.norm = target.model.model.norm, torch.nn.Identity()
    try:
        pre = target.model(input_ids=torch.tensor(ids)[None], output_hidden_states=True).hidden_states
    finally:
        target.model.model.norm = norm
    hidden = torch.cat([pre[i][0] for i in layers], -1) if layers else None
    return out.logits[0].float(), hidden


def test_layer_l_is_the_residual_stream_before_the_final_norm(target):
    ids = [5, 9, 17, 33]
    _, hidden = target.forward(torch.tensor(ids), torch.arange(4), causal_mask(4, 0), target.new_cache(), (4,),
                               final_normed=True)
    _, ref = full_logits(target, ids, (4,))
    hf = target.model(input_ids=torch.tensor(ids)[None], output_hidden_states=True).hidden_states[4][0]
    torch.testing.assert_close(hidden[:, :32], ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden[:, 32:], hf, atol=1e-5, rtol=1e-5)  # final_normed: HF's last state
    assert (hidden[:, :32] - hf).abs().max() > 1e-1  # control: the two differ


def test_attributes_and_hash(target, target_dir):
    assert (target.vocab_size, target.num_layers, target.hidden_size) == (128, 4, 32)
    assert target.device == torch.device("cpu") and target.dtype == torch.float32
    weights = sorted(target_dir.glob("*.safetensors"))
    assert target.source_hash == hashlib.sha256(b"".join(p.read_bytes() for p in weights)).hexdigest()


def tree_mask(past, parents):
    """Additive mask for tree nodes given parent indices among the new nodes (-1: none)."""
    n = len(parents)
    allowed = np.zeros((n, past + n), bool)
    allowed[:, :past] = True
    for i, p in enumerate(parents):
        allowed[i, past + i] = True
        while p >= 0:
            allowed[i, past + p] = True
            p = parents[p]
    return torch.zeros(allowed.shape).masked_fill_(torch.from_numpy(~allowed), float("-inf"))


def test_tree_pass_matches_sequential_and_commit(target):
    context = [5, 9, 17, 33, 60]
    # Root 70 with children 71 and 72; 71 has child 73; 72 has child 74.
    tokens, parents, depth = [70, 71, 72, 73, 74], [-1, 0, 0, 1, 2], [0, 1, 1, 2, 2]
    cache, layers = target.new_cache(), (1, 2, 4)
    target.forward(torch.tensor(context), torch.arange(5), causal_mask(5, 0), cache)
    logits, hidden = target.forward(
        torch.tensor(tokens), 5 + torch.tensor(depth), tree_mask(5, parents), cache, hidden_layers=layers
    )
    assert hidden.shape == (5, 3 * 32)
    for i, path in enumerate([[70], [70, 71], [70, 72], [70, 71, 73], [70, 72, 74]]):
        ref, ref_hidden = full_logits(target, context + path, layers)
        torch.testing.assert_close(logits[i], ref[-1], atol=1e-4, rtol=1e-4)  # float32 accumulation order
        torch.testing.assert_close(hidden[i], ref_hidden[-1], atol=1e-4, rtol=1e-4)
    # Keep root -> 72 -> 74 and continue with token 80 at position 8.
    target.commit(cache, 5, torch.tensor([0, 2, 4]))
    assert cache.get_seq_length() == 8
    nxt, _ = target.forward(torch.tensor([80]), torch.tensor([8]), causal_mask(1, 8), cache)
    ref, _ = full_logits(target, context + [70, 72, 74, 80])
    torch.testing.assert_close(nxt[0], ref[-1], atol=1e-4, rtol=1e-4)
    cache.crop(6)
    assert cache.get_seq_length() == 6


@pytest.mark.parametrize("keep, path", [([0, 1], [70, 71]), ([0, 1, 3], [70, 71, 73]), ([0], [70])])
def test_a_commit_whose_path_is_in_place_moves_only_the_rest(target, keep, path):
    """Rows already at their committed position (a leading run keep[i] == i) stay; the next row is the
    sequential one."""
    context = [5, 9, 17]
    cache = target.new_cache()
    target.forward(torch.tensor(context), torch.arange(3), causal_mask(3, 0), cache)
    target.forward(torch.tensor([70, 71, 72, 73]), torch.tensor([3, 4, 4, 5]), tree_mask(3, [-1, 0, 0, 1]), cache)
    target.commit(cache, 3, torch.tensor(keep))
    assert cache.get_seq_length() == 3 + len(keep)
    nxt, _ = target.forward(torch.tensor([80]), torch.tensor([3 + len(keep)]), causal_mask(1, 3 + len(keep)), cache)
    ref, _ = full_logits(target, context + path + [80])
    torch.testing.assert_close(nxt[0], ref[-1], atol=1e-4, rtol=1e-4)


def test_wrong_commit_fails_sequential_check(target):
    """Negative control: committing the wrong branch changes the next row."""
    context = [5, 9, 17]
    cache = target.new_cache()
    target.forward(torch.tensor(context), torch.arange(3), causal_mask(3, 0), cache)
    target.forward(torch.tensor([70, 71, 72]), torch.tensor([3, 4, 4]), tree_mask(3, [-1, 0, 0]), cache)
    target.commit(cache, 3, torch.tensor([0, 1]))  # keeps 71, but the reference path takes 72
    nxt, _ = target.forward(torch.tensor([80]), torch.tensor([5]), causal_mask(1, 5), cache)
    ref, _ = full_logits(target, context + [70, 72, 80])
    assert (nxt[0] - ref[-1]).abs().max() > 1e-3


def test_forward_refuses_bad_masks(target):
    cache = target.new_cache()
    with pytest.raises(ValueError, match="not boolean"):
        target.forward(torch.tensor([1, 2]), torch.arange(2), torch.ones(2, 2, dtype=torch.bool), cache)
    with pytest.raises(ValueError, match="expected"):
        target.forward(torch.tensor([1, 2]), torch.arange(2), torch.zeros(2, 3), cache)
    with pytest.raises(ValueError, match="hidden_layers"):
        target.forward(torch.tensor([1]), torch.arange(1), torch.zeros(1, 1), cache, hidden_layers=(9,))
    target.forward(torch.tensor([1, 2]), torch.arange(2), causal_mask(2, 0), cache)
    with pytest.raises(ValueError, match="keep indices"):
        Target.commit(cache, 0, torch.tensor([2]))


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "mps"])
def test_unknown_device_is_one_line_error(target_dir, device):
    with pytest.raises(ModelLoadError) as err:
        load_target(target_dir, device=device)
    assert "device" in str(err.value) and "\n" not in str(err.value)


def test_cuda_without_gpu_and_bad_dtype(target_dir):
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            load_target(target_dir, device="cuda")
    with pytest.raises(ModelLoadError, match="dtype 'float64'"):
        load_target(target_dir, dtype="float64")


def test_missing_and_invalid_specs(tmp_path):
    with pytest.raises(FileNotFoundError, match="target not found"):
        load_target(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_target(tmp_path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_targets(target_dir, dtype):
    target = load_target(target_dir, dtype=str(dtype).removeprefix("torch."))
    cache = target.new_cache()
    logits, hidden = target.forward(torch.tensor([4, 5, 6]), torch.arange(3), causal_mask(3, 0), cache, (2,))
    assert target.dtype == dtype and logits.dtype == torch.float32 and hidden.dtype == torch.float32
    ref, _ = full_logits(load_target(target_dir), [4, 5, 6])
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() >= 2 / 3


@pytest.mark.slow
def test_default_smollm2_convert_and_reload():
    """Convert the embedded GGUF once (into the shared cache), reload fast, grow one early-exit pool."""
    from specrank.decode.loading.drafters import load_drafter
    from specrank.decode.loading.named_targets import default_gguf
    from specrank.decode.loading.target_spec import resolve_target

    converted = resolve_target("smollm2")  # converts on the first run on a machine (minutes)
    start = time.perf_counter()
    assert resolve_target("smollm2") == converted
    assert time.perf_counter() - start < 1.0  # conversion overhead of a cached load: one sha256
    target = load_target("smollm2")
    assert (converted / "model.safetensors").exists() and default_gguf().suffix == ".gguf"
    assert (target.num_layers, target.hidden_size) == (30, 576) and len(target.source_hash) == 64
    drafter = load_drafter("early-exit:8", target)
    text = target.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    prompt = torch.tensor(target.tokenizer(text, add_special_tokens=False)["input_ids"])
    drafter.start(prompt[:-1])
    pool = drafter.grow_pool(int(prompt[-1]))
    assert len(pool) == 710 and pool.expanded.sum() == 70


def test_the_cache_keyword_is_taken_by_every_forward_the_decoder_calls():
    """Targets, standalone drafters and EAGLE-3 layers get their KV cache by ``cache_keyword()``; a name a forward
    does not declare would vanish into its ``**kwargs`` and the pass would run without the cache."""
    import inspect

    from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaModel
    from transformers.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM

    from specrank.decode.loading.eagle3_head import layer_classes
    from specrank.decode.loading.target_passes import cache_keyword

    forwards = [LlamaForCausalLM, LlamaModel, Qwen2ForCausalLM, *layer_classes("llama")[1:], *layer_classes("qwen3")[1:]]
    for cls in forwards:
        assert cache_keyword() in inspect.signature(cls.forward).parameters, cls.__name__
    assert cache_keyword() in ("cache", "past_key_values")
