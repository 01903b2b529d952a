"""A new EAGLE-3 head for a target (``specrank.decode.loading.eagle3_head.Eagle3Head``) and its
saving in the SpecForge/SGLang layout (``eagle3_export``), which ``load_eagle3`` and SGLang read."""

from __future__ import annotations

from pathlib import Path

import torch

from specrank.decode.loading.eagle3_head import Eagle3Head, eagle3_config, plain_embedding
from specrank.decode.loading.eagle3_export import WEIGHTS, export_files, write_head
from specrank.decode.loading.eagle3_formats import HeadCheckpoint


def head_config(target, draft_vocab_size: int) -> dict:
    """The canonical config of a head for ``target`` (``eagle3_config`` reads it): the target's Llama
    shape, one layer, the draft vocabulary; every flag plain EAGLE-3."""
    cfg = target.model.config
    heads = int(cfg.num_attention_heads)
    return {
        "hidden_size": int(cfg.hidden_size),
        "intermediate_size": int(cfg.intermediate_size),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        "rms_norm_eps": float(cfg.rms_norm_eps),
        "rope_theta": rope_theta(cfg),
        "max_position_embeddings": int(cfg.max_position_embeddings),
        "vocab_size": int(target.vocab_size),
        "draft_vocab_size": int(draft_vocab_size),
        "hidden_act": "silu",
    }


def rope_theta(cfg) -> float:
    """The target's RoPE base (``rope_parameters`` in recent transformers, ``rope_theta`` before)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(cfg, "rope_theta", None) or 10000.0)


def norm_scale(norm) -> torch.Tensor:
    """(H,) the elementwise scale an RMS norm applies, read off the norm itself: a vector of RMS 1 comes out as the
    scale (Llama's norm multiplies by its weight, Gemma's by 1 + weight; the head's Llama norm takes the scale)."""
    weight = norm.weight
    with torch.no_grad():
        return norm(torch.ones(1, weight.shape[0], dtype=weight.dtype, device=weight.device))[0].float()


def new_head(target, vocab, seed: int = 0, train_lm_head: bool = False):
    """A float32 head: random fc and decoder layer (seeded), the target's frozen embedding, its
    final norm and its lm-head rows of the draft vocabulary (trainable iff ``train_lm_head``)."""
    config = head_config(target, len(vocab.ids))
    torch.manual_seed(seed)
    head = Eagle3Head(eagle3_config(config))
    embedding = plain_embedding(target.model)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.model.get_output_embeddings().weight[vocab.ids].float())
        final_norm = getattr(getattr(target.model, "model", None), "norm", None)
        if final_norm is not None and final_norm.weight.shape == head.norm.weight.shape:
            head.norm.weight.copy_(norm_scale(final_norm))
    head.embed_tokens = embedding  # shared with the target, unscaled, as load_eagle3 does
    head.requires_grad_(True)
    embedding.requires_grad_(False)
    head.lm_head.requires_grad_(train_lm_head)
    head.norm.requires_grad_(train_lm_head)
    return head.to(target.device)


def save_head(directory, head, vocab, layers, dtype: str = "fp32") -> Path:
    """Write ``config.json`` and ``model.safetensors`` in the SpecForge/SGLang layout (``fc``,
    ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``; the embedding stays the target's; the
    ``hidden_states`` indices ``layers`` as SGLang ids), each file atomically."""
    state = {k: v for k, v in head.state_dict().items() if not k.startswith(("embed_tokens", "rotary_emb"))}
    state["d2t"], state["t2d"] = vocab.d2t, vocab.t2d
    ckpt = HeadCheckpoint("specrank", head.config.to_dict(), state, tuple(int(i) for i in layers))
    cfg, tensors, _ = export_files(ckpt, "sglang", dtype, sglang_convention="legacy")  # SpecForge's meaning: any layers
    return write_head(Path(directory), cfg, tensors, WEIGHTS["sglang"])

