"""Tiny random models for tests: targets of every common family, standalone drafters and EAGLE-3 heads.

Everything is built in-process from a config (no hub), saved in the formats users
load (Hugging Face directories, EAGLE-3 checkpoints), with a word-level tokenizer
that has a ChatML-style chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specrank.decode.loading.eagle3_head import Eagle3Head, eagle3_config

SPECIAL_TOKENS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
WORDS = (
    "system user assistant the a an and or but if then else of to in on at by for with from "
    "is are was were be been has have had do does did not no yes this that these those it its "
    "i you he she we they me him her us them my your our their what which who when where why how "
    "all any some many few more most one two three four five six seven eight nine ten zero "
    "cat dog bird fish tree house car road city river sun moon star sky water fire earth air "
    "red green blue black white big small long short new old good bad fast slow hot cold "
    "run walk eat drink see say make take give find think know go come get write read code "
    "def return print import class for while x y z + - * / = ( ) : , . ? ! 0 1 2 3 4 5 6 7 8 9"
).split()
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|> {{ message['role'] }} {{ message['content'] }} "
    "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def tiny_tokenizer(vocab_size: int = 128):
    """A word-level ``PreTrainedTokenizerFast`` over ``vocab_size`` tokens with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(dict.fromkeys(SPECIAL_TOKENS + WORDS))
    if not len(SPECIAL_TOKENS) + 8 <= vocab_size <= len(words):
        raise ValueError(f"vocab_size must be in [{len(SPECIAL_TOKENS) + 8}, {len(words)}], got {vocab_size}")
    vocab = {w: i for i, w in enumerate(words[:vocab_size])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        chat_template=CHAT_TEMPLATE,
    )


# The target families users pair with EAGLE-3 heads, each as a tiny random model whose sliding-window layers (where
# the family has them) see ``WINDOW`` positions, so that a test's context crosses the window.
ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3")
WINDOW = 6


def tiny_config(architecture: str = "llama", vocab_size: int = 128, hidden_size: int = 32, num_layers: int = 4,
                window: int = WINDOW, **overrides):
    """A small config of ``architecture`` (one of ``ARCHITECTURES``): 4 heads of 8, 2 KV heads, peaked rows
    (``initializer_range`` 0.5, so argmaxes are not near-ties), sliding windows of ``window`` positions on the
    layers the family slides (Qwen2 and Qwen3 on their upper half, Gemma 2 on alternate layers, Gemma 3 on all but
    its third, Mistral and Phi-3 on all). Attention is sdpa, or eager where the family needs it (Gemma 2's
    softcapping)."""
    import transformers

    sliding = {
        "llama": ("LlamaConfig", {}),
        "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=window, max_window_layers=num_layers // 2)),
        "qwen3": ("Qwen3Config", dict(use_sliding_window=True, sliding_window=window, max_window_layers=num_layers // 2)),
        "mistral": ("MistralConfig", dict(sliding_window=window)),
        "gemma2": ("Gemma2Config", dict(sliding_window=window, query_pre_attn_scalar=8)),
        "gemma3": ("Gemma3TextConfig", dict(sliding_window=window, query_pre_attn_scalar=8, layer_types=[
            "full_attention" if i % 3 == 2 else "sliding_attention" for i in range(num_layers)])),
        "phi3": ("Phi3Config", dict(sliding_window=window)),
    }
    if architecture not in sliding:
        raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
    class_name, family = sliding[architecture]
    params = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=512,
        initializer_range=0.5,
        tie_word_embeddings=False,
        bos_token_id=2,
        eos_token_id=3,
        pad_token_id=1,
        **family,
    )
    params.update(overrides)
    config = getattr(transformers, class_name)(**params)
    config._attn_implementation = "eager" if architecture == "gemma2" else "sdpa"
    return config


def tiny_llama_config(vocab_size: int = 128, hidden_size: int = 32, num_layers: int = 4, **overrides):
    """A small ``LlamaConfig`` (``tiny_config("llama", ...)``)."""
    return tiny_config("llama", vocab_size, hidden_size, num_layers, **overrides)


def tiny_causal_lm(architecture: str = "llama", seed: int = 0, **config):
    """A randomly initialised causal LM of ``architecture`` (``tiny_config``) in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(architecture, **config)).eval()


def tiny_llama(seed: int = 0, **config):
    """A randomly initialised ``LlamaForCausalLM`` in eval mode."""
    return tiny_causal_lm("llama", seed, **config)


def save_tiny_llama(path, seed: int = 0, vocab_size: int = 128, tokenizer_vocab: int | None = None, **config) -> Path:
    """Save a random Llama + tokenizer as a Hugging Face directory; return the path.

    ``tokenizer_vocab`` (default ``vocab_size``) lets a test build a drafter whose
    tokenizer differs from the target's.
    """
    path = Path(path)
    tiny_llama(seed, vocab_size=vocab_size, **config).save_pretrained(path)
    tiny_tokenizer(tokenizer_vocab or vocab_size).save_pretrained(path)
    return path


def save_tiny_eagle3(
    path, target_config, draft_vocab_size: int = 48, seed: int = 0, with_embedding: bool = False
) -> Path:
    """Save a random EAGLE-3 head for ``target_config`` in the published checkpoint format.

    Files: ``config.json`` (Llama-style, one layer, ``draft_vocab_size``) and
    ``model.safetensors`` with ``fc``, ``midlayer.*``, ``norm``, ``lm_head``,
    ``d2t`` (draft id -> target id offset) and ``t2d`` (target-vocabulary mask).
    The draft vocabulary is a random subset of the target's, in increasing id order.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = dict(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        hidden_size=target_config.hidden_size,
        intermediate_size=target_config.intermediate_size,
        num_attention_heads=target_config.num_attention_heads,
        num_key_value_heads=target_config.num_key_value_heads,
        num_hidden_layers=1,
        rms_norm_eps=target_config.rms_norm_eps,
        max_position_embeddings=target_config.max_position_embeddings,
        vocab_size=target_config.vocab_size,
        draft_vocab_size=draft_vocab_size,
        hidden_act="silu",
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    head = Eagle3Head(eagle3_config(cfg))
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3, generator=gen) if p.dim() > 1 else torch.nn.init.ones_(p)
    keep = torch.randperm(target_config.vocab_size, generator=gen)[:draft_vocab_size].sort().values
    t2d = torch.zeros(target_config.vocab_size, dtype=torch.bool)
    t2d[keep] = True
    state = {k: v.contiguous() for k, v in head.state_dict().items() if not k.startswith("embed_tokens")}
    if with_embedding:
        state["embed_tokens.weight"] = torch.randn(target_config.vocab_size, target_config.hidden_size, generator=gen)
    state["d2t"] = keep - torch.arange(draft_vocab_size)
    state["t2d"] = t2d
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path
