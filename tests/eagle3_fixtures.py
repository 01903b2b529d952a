"""Tiny EAGLE-3 heads written exactly as each project's exporter writes them (key names, config fields,
dtypes, the d2t/t2d construction), from random weights; none of them goes through specrank.

- ``write_eagle_head``: SafeAILab EAGLE, ``eagle/traineagle3/main.py``: ``save_16bit_model`` of the
  fp16 DeepSpeed module with frozen parameters (the target and the embedding) left out but the target's
  persistent buffers kept (``target_model.model.layers.*.self_attn.rotary_emb.inv_freq``,
  ``traineagle3/modeling_llama_kv.py``) -> ``pytorch_model.bin``; ``config.json`` is
  ``eagle/traineagle3/config.json``; ``d2t``/``t2d`` from ``cnets.py`` ``scandata``.
- ``write_specforge_head``: SpecForge ``specforge/export/to_sglang.py``: ``save_pretrained`` of
  ``LlamaForCausalLMEagle3`` (``modeling/draft/llama3_eagle.py``) materialised in bf16, every key with
  "embed" dropped; ``d2t``/``t2d`` from ``data/preprocessing.py`` ``process_token_dict_to_mappings``.
- ``write_sglang_head``: several draft layers under the names SGLang's ``LlamaForCausalLMEagle3``
  (``python/sglang/srt/models/llama_eagle3.py``, 03d5a777) gives them, ``model.`` left out as SpecForge's
  export leaves it (``load_weights`` adds it back): SpecForge's files plus ``additional_layers.0..N-2`` and
  ``num_hidden_layers`` N. No trainer writes these upstream yet, so the names are those SGLang loads.
- ``write_speculators_head``: vLLM speculators ``convert/eagle/eagle3_converter.py``: ``midlayer.`` ->
  ``layers.0.``, ``Eagle3SpeculatorConfig`` (``models/eagle3/config.py``), bf16 ``save_pretrained``.

Each writer returns the fixture's meaning for the test's own reference: the flags in specrank's names.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch


def token_counts(vocab_size: int, seed: int) -> Counter:
    """A skewed token frequency count, standing in for the training data's."""
    gen = torch.Generator().manual_seed(seed)
    draws = torch.multinomial(torch.rand(vocab_size, generator=gen) ** 4, 2000, replacement=True, generator=gen)
    return Counter(draws.tolist())


def eagle_maps(counts: Counter, draft_vocab: int, vocab_size: int):
    """EAGLE ``cnets.py`` scandata: the top-N tokens sorted, d2t = used[i] - i, t2d = membership."""
    used = sorted(key for key, _ in counts.most_common(draft_vocab))
    return torch.tensor([used[i] - i for i in range(len(used))]), torch.tensor([i in used for i in range(vocab_size)])


def specforge_maps(counts: Counter, draft_vocab: int, vocab_size: int):
    """SpecForge ``process_token_dict_to_mappings``: first pads the count with unseen ids below N."""
    counts = Counter(counts)
    if len(counts) < draft_vocab:
        for token in set(range(draft_vocab)) - set(counts):
            counts[token] = 0
            if len(counts) >= draft_vocab:
                break
    return eagle_maps(counts, draft_vocab, vocab_size)


def layer_tensors(prefix: str, h: int, heads: int, kv: int, inter: int, gen, first=True, qk_norm=False) -> dict:
    """One decoder layer under ``prefix``: the EAGLE-3 first layer (q/k/v read 2H, ``hidden_norm``) or a
    plain one; Qwen3's per-head ``q_norm`` / ``k_norm`` if ``qk_norm``. Norms near 1, weights ~N(0, 0.3)."""
    hd, width = h // heads, 2 * h if first else h
    shapes = {"self_attn.q_proj.weight": (heads * hd, width), "self_attn.k_proj.weight": (kv * hd, width),
              "self_attn.v_proj.weight": (kv * hd, width), "self_attn.o_proj.weight": (h, heads * hd),
              "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter)}
    out = {prefix + k: 0.3 * torch.randn(s, generator=gen) for k, s in shapes.items()}
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm")[0 if first else 1:]:
        out[f"{prefix}{norm}.weight"] = 1 + 0.2 * torch.randn(h, generator=gen)
    for norm in ("q_norm", "k_norm") if qk_norm else ():  # Qwen3RMSNorm(head_dim)
        out[f"{prefix}self_attn.{norm}.weight"] = 1 + 0.2 * torch.randn(hd, generator=gen)
    return out


def head_tensors(cfg, draft_vocab: int, gen, prefix="midlayer.", fc_norm=False, input_norm=False) -> dict:
    h = cfg.hidden_size
    state = layer_tensors(prefix, h, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, gen)
    state["fc.weight"] = 0.3 * torch.randn(h, 3 * h, generator=gen)
    state["norm.weight"] = 1 + 0.2 * torch.randn(h, generator=gen)
    state["lm_head.weight"] = 0.5 * torch.randn(draft_vocab, h, generator=gen)
    if fc_norm:  # llama3_eagle.py: nn.ModuleList of three RMSNorm(target_hidden_size)
        state.update({f"fc_norm.{i}.weight": 1 + 0.2 * torch.randn(h, generator=gen) for i in range(3)})
    if input_norm:  # speculators core.py: RMSNorm(3 * hidden) when norm_before_fc
        state["input_norm.weight"] = 1 + 0.2 * torch.randn(3 * h, generator=gen)
    return state


def write_eagle_head(path, cfg, draft_vocab: int = 40, seed: int = 0) -> dict:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    state = {k: v.half() for k, v in head_tensors(cfg, draft_vocab, gen).items()}  # DeepSpeed fp16 module
    state["d2t"], state["t2d"] = eagle_maps(token_counts(cfg.vocab_size, seed), draft_vocab, cfg.vocab_size)
    hd = cfg.hidden_size // cfg.num_attention_heads
    inv_freq = (1.0 / 10000.0 ** (torch.arange(0, hd, 2).float() / hd)).half()  # module.half() casts buffers too
    state.update({f"target_model.model.layers.{i}.self_attn.rotary_emb.inv_freq": inv_freq
                  for i in range(cfg.num_hidden_layers)})
    torch.save(state, path / "pytorch_model.bin")
    config = {"architectures": ["LlamaForCausalLM"], "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
              "hidden_act": "silu", "hidden_size": cfg.hidden_size, "initializer_range": 0.02,
              "intermediate_size": cfg.intermediate_size, "max_position_embeddings": 2048, "model_type": "llama",
              "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
              "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": False,
              "torch_dtype": "float16", "transformers_version": "4.28.1", "use_cache": True,
              "vocab_size": cfg.vocab_size, "draft_vocab_size": draft_vocab}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return {}


def write_specforge_head(path, cfg, draft_vocab: int = 40, seed: int = 1, ids=None, fc_norm=False) -> dict:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    state = {k: v.bfloat16() for k, v in head_tensors(cfg, draft_vocab, gen, fc_norm=fc_norm).items()}
    state["d2t"], state["t2d"] = specforge_maps(token_counts(cfg.vocab_size, seed), draft_vocab, cfg.vocab_size)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "head_dim": cfg.head_dim,
              "hidden_act": "silu", "hidden_size": cfg.hidden_size, "initializer_range": 0.02,
              "intermediate_size": cfg.intermediate_size, "max_position_embeddings": 2048, "model_type": "llama",
              "num_attention_heads": cfg.num_attention_heads, "num_hidden_layers": 1,
              "num_key_value_heads": cfg.num_key_value_heads, "rms_norm_eps": cfg.rms_norm_eps, "rope_scaling": None,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.53.2", "use_cache": True, "vocab_size": cfg.vocab_size,
              "draft_vocab_size": draft_vocab}
    if fc_norm:  # configs/qwen3-30B-A3B-eagle3.1.json
        config.update(fc_norm=True, norm_output=True)
    if ids is not None:  # configs/gpt-oss-20B-eagle3.json
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids)}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return {"fc_norm": fc_norm, "feedback_post_norm": fc_norm}  # norm_output as SpecForge reads it since PR #879


def write_sglang_head(path, cfg, num_layers: int = 2, draft_vocab: int = 40, seed: int = 6, ids=None) -> dict:
    from safetensors.torch import load_file, save_file

    path = Path(path)
    write_specforge_head(path, cfg, draft_vocab, seed, ids)
    state = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for i in range(num_layers - 1):  # BasicDecoderLayer: q/k/v read H, hidden_norm in place of input_layernorm
        layer = layer_tensors(f"additional_layers.{i}.", cfg.hidden_size, cfg.num_attention_heads,
                              cfg.num_key_value_heads, cfg.intermediate_size, gen, first=False)
        state.update({k.replace("input_layernorm", "hidden_norm"): v.bfloat16() for k, v in layer.items()})
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": num_layers}, indent=2))
    return {"layers": num_layers}


def write_speculators_head(path, cfg, draft_vocab: int = 40, seed: int = 2, ids=None, verifier="tiny-target") -> dict:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    # an EAGLE 3.1 head: norm_before_residual, a norm over the fused vector, post-norm feedback
    state = head_tensors(cfg, draft_vocab, gen, prefix="layers.0.", input_norm=True)
    state = {k: v.bfloat16() for k, v in state.items()}  # model.to(dtype) leaves the int/bool buffers
    state["d2t"], state["t2d"] = eagle_maps(token_counts(cfg.vocab_size, seed), draft_vocab, cfg.vocab_size)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    layer = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
             "num_hidden_layers": 1, "num_attention_heads": cfg.num_attention_heads,
             "num_key_value_heads": cfg.num_key_value_heads, "hidden_act": "silu", "max_position_embeddings": 2048,
             "initializer_range": 0.02, "rms_norm_eps": cfg.rms_norm_eps, "use_cache": True, "attention_bias": False,
             "mlp_bias": False, "tie_word_embeddings": False, "head_dim": cfg.head_dim,
             "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "model_type": "llama",
             "torch_dtype": "bfloat16"}
    config = {"architectures": ["Eagle3Speculator"], "draft_vocab_size": draft_vocab,
              "eagle_aux_hidden_state_layer_ids": None if ids is None else list(ids), "embed_requires_grad": False,
              "fc_norm": False, "has_no_defaults_at_init": False, "norm_before_fc": True, "norm_before_residual": True,
              "norm_output": True,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                                           "speculative_tokens": 3, "verifier_accept_k": 1}],
                                     "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": verifier}},
              "speculators_model_type": "eagle3", "speculators_version": "0.7.0", "target_hidden_size": None,
              "torch_dtype": "bfloat16", "transformer_layer_config": layer, "transformers_version": "4.57.1"}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return {"norm_before_residual": True, "norm_before_fc": True, "feedback_post_norm": True}


def write_speculators_trained_head(path, cfg, ids, num_layers: int = 2, arch: str = "llama", draft_vocab: int = 40,
                                   seed: int = 5) -> dict:
    """What speculators' trainer saves (``scripts/train.py`` + ``Eagle3DraftModel.save_pretrained``, c05b95b3):
    EAGLE 3.1 by default since #692 (llama layers, ``norm_before_fc``, ``norm_output``, ``norm_before_residual``
    per ``train/config/schema.py``), ``num_layers`` layers (``layers.0`` the EAGLE-3 one, the rest plain
    decoder layers), the embedding saved with the head (only the verifier's norm and lm head are left out),
    ``transformer_layer_config`` as the config class's ``to_diff_dict``."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, Qwen3Config

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    qk = arch == "qwen3"
    state = head_tensors(cfg, draft_vocab, gen, prefix="layers.0.", input_norm=True)
    if qk:
        hd = cfg.hidden_size // cfg.num_attention_heads
        state.update({f"layers.0.self_attn.{n}.weight": 1 + 0.2 * torch.randn(hd, generator=gen) for n in ("q_norm", "k_norm")})
    for i in range(1, num_layers):
        state.update(layer_tensors(f"layers.{i}.", cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.intermediate_size, gen, first=False, qk_norm=qk))
    state["embed_tokens.weight"] = 0.5 * torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    state = {k: v.bfloat16() for k, v in state.items()}
    state["d2t"], state["t2d"] = eagle_maps(token_counts(cfg.vocab_size, seed), draft_vocab, cfg.vocab_size)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    layer = (Qwen3Config if qk else LlamaConfig)(  # create_transformer_layer_config, every layer full attention
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, hidden_act="silu", max_position_embeddings=2048,
        initializer_range=0.02, rms_norm_eps=cfg.rms_norm_eps, head_dim=cfg.head_dim, tie_word_embeddings=False,
        sliding_window=None, use_sliding_window=False, layer_types=["full_attention"] * num_layers,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, dtype="bfloat16").to_diff_dict()
    config = {"architectures": ["Eagle3Speculator"], "draft_vocab_size": draft_vocab,
              "eagle_aux_hidden_state_layer_ids": list(ids), "embed_requires_grad": False, "fc_norm": False,
              "has_no_defaults_at_init": False, "norm_before_fc": True, "norm_before_residual": True,
              "norm_output": True,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                                           "speculative_tokens": 3, "verifier_accept_k": 1}],
                                     "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "tiny-target"}},
              "speculators_model_type": "eagle3", "speculators_version": "0.7.0", "target_hidden_size": None,
              "torch_dtype": "bfloat16", "transformer_layer_config": layer, "transformers_version": "5.1.0"}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return {"norm_before_residual": True, "norm_before_fc": True, "feedback_post_norm": True, "layers": num_layers,
            "qk_norm": qk}
