"""The EAGLE-3 head as a torch module (``Eagle3Head``): its config from a canonical config dict, its draft layers as
vLLM/speculators and SGLang stack them, and the head built from a checkpoint's tensors and the target's embedding."""

from __future__ import annotations

import torch
from torch import nn

from specrank.decode.core import ModelLoadError
from specrank.decode.loading.target_passes import cache_keyword

# The head's behaviour flags, in specrank's own names (each dialect's spelling is translated in
# ``eagle3_formats``); their defaults are plain EAGLE-3.
FLAGS = {
    "fc_bias": False,  # fc has a bias
    "fc_norm": False,  # one RMSNorm per fused target state before fc
    "norm_before_fc": False,  # one RMSNorm over the whole fused vector before fc
    "norm_before_residual": False,  # the residual branch carries hidden_norm(h), not h
    "feedback_post_norm": False,  # a child reads its parent's normed output (EAGLE 3.1)
    "logits_from_norm": True,  # the lm head reads norm(output), not the raw output
    "tie_word_embeddings": False,  # the lm head is the (target's) embedding
}


def layer_classes(layer_type: str):
    """(config class, attention class, decoder layer class) of a draft layer type."""
    if layer_type == "qwen3":
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3DecoderLayer

        return Qwen3Config, Qwen3Attention, Qwen3DecoderLayer
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer

    return LlamaConfig, LlamaAttention, LlamaDecoderLayer


def eagle3_config(cfg: dict):
    """The draft layers' ``LlamaConfig`` / ``Qwen3Config`` from a canonical EAGLE-3 config dict (sdpa
    attention); fields the dict lacks take that class's defaults, as speculators' ``to_diff_dict`` assumes."""
    config_class = layer_classes(cfg.get("draft_layer_type", "llama"))[0]
    skip = ("architectures", "model_type", "torch_dtype", "dtype", "draft_layer_type", "layer_stacking")
    config = config_class(**{k: v for k, v in cfg.items() if k not in skip})
    config.num_hidden_layers = int(cfg.get("num_hidden_layers") or 1)  # draft layers, not the target's
    config.draft_layer_type = cfg.get("draft_layer_type", "llama")
    # how layers after the first stack (heads of one layer are alike under both): ``speculators``, plain decoder
    # layers on the residual stream; ``sglang``, layers reading the previous MLP output without that stream
    config.layer_stacking = cfg.get("layer_stacking", "speculators")
    if not hasattr(config, "mlp_bias"):  # Qwen3's MLP has no bias: LlamaMLP reads the flag
        config.mlp_bias = False
    config.draft_vocab_size = int(cfg.get("draft_vocab_size") or config.vocab_size)
    config.target_hidden_size = int(cfg.get("target_hidden_size") or config.hidden_size)
    for name, default in FLAGS.items():
        setattr(config, name, bool(cfg.get(name, default)))
    config._attn_implementation = "sdpa"
    return config


class Eagle3Layer(nn.Module):
    """The EAGLE-3 decoder layer: attention over [norm(embedding), norm(hidden)] (2H), residual on hidden."""

    def __init__(self, config):
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = layer_classes(config.draft_layer_type)[1](config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.self_attn, name)
            setattr(self.self_attn, name, nn.Linear(2 * h, old.out_features, bias=old.bias is not None))
        self.mlp = LlamaMLP(config)
        self.input_layernorm, self.hidden_norm = LlamaRMSNorm(h, eps=eps), LlamaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.norm_before_residual = config.norm_before_residual

    def branches(self, embeds, hidden, position_embeddings, mask, cache):
        """(MLP output, residual stream after attention), each (1, n, H): the layer's output is their sum,
        and SGLang's next layer reads the MLP output alone."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden  # vllm llama_eagle3.py _norm_before_residual
        x = torch.cat([self.input_layernorm(embeds), normed], -1)  # (1, n, 2H)
        attn = self.self_attn(hidden_states=x, position_embeddings=position_embeddings, attention_mask=mask,
                              **{cache_keyword(): cache})[0]
        hidden = residual + attn
        return self.mlp(self.post_attention_layernorm(hidden)), hidden

    def forward(self, embeds, hidden, position_embeddings, mask, cache):
        mlp, stream = self.branches(embeds, hidden, position_embeddings, mask, cache)
        return stream + mlp


class SGLangLayer(nn.Module):
    """A later draft layer as SGLang stacks it (``BasicDecoderLayer``): attention over ``hidden_norm`` of the
    previous layer's MLP output, that output its residual, then the MLP; no ``input_layernorm``."""

    def __init__(self, config, layer_idx: int):
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = layer_classes(config.draft_layer_type)[1](config, layer_idx=layer_idx)  # its own KV cache
        self.mlp = LlamaMLP(config)
        self.hidden_norm, self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps), LlamaRMSNorm(h, eps=eps)

    def forward(self, mlp, position_embeddings, mask, cache):
        """The previous layer's MLP output (1, n, H) -> this layer's (MLP output, residual stream)."""
        attn = self.self_attn(hidden_states=self.hidden_norm(mlp), position_embeddings=position_embeddings,
                              attention_mask=mask, **{cache_keyword(): cache})[0]
        stream = mlp + attn
        return self.mlp(self.post_attention_layernorm(stream)), stream


class Eagle3Head(nn.Module):
    """fc (3 H_target -> H, optionally normed first), an Eagle3Layer, then ``num_hidden_layers - 1`` more
    layers stacked as ``layer_stacking`` says (``layers.1`` ... plain decoder layers on its output: vLLM PR
    #26164, speculators ``models/eagle3/core.py``; or SGLang's ``additional_layers.0`` ...), norm and a
    draft-vocabulary lm head."""

    def __init__(self, config):
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        self.config = config
        h, ht, eps = config.hidden_size, config.target_hidden_size, config.rms_norm_eps
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.fc = nn.Linear(3 * ht, h, bias=config.fc_bias)
        if config.norm_before_fc:  # speculators eagle3/core.py ``input_norm``
            self.input_norm = LlamaRMSNorm(3 * ht, eps=eps)
        if config.fc_norm:  # SpecForge llama3_eagle.py ``fc_norm``: one norm per fused state
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(ht, eps=eps) for _ in range(3))
        self.midlayer = Eagle3Layer(config)
        more = range(1, config.num_hidden_layers)
        if config.layer_stacking == "sglang":
            self.additional_layers = nn.ModuleList(SGLangLayer(config, i) for i in more)
            more = ()
        decoder = layer_classes(config.draft_layer_type)[2]
        self.layers = nn.ModuleDict({str(i): decoder(config, i) for i in more})
        self.norm = LlamaRMSNorm(h, eps=eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def project(self, target_hidden):
        """(..., 3 H_target) fused target states -> (..., H)."""
        if hasattr(self, "input_norm"):
            target_hidden = self.input_norm(target_hidden)
        if hasattr(self, "fc_norm"):
            chunks = target_hidden.chunk(3, dim=-1)
            target_hidden = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], -1)
        return self.fc(target_hidden)

    def read_out(self, out):
        """Layer output (..., H) -> (draft logits (..., Vd), the state a child reads (..., H))."""
        normed = self.norm(out)
        logits = self.lm_head(normed if self.config.logits_from_norm else out)
        return logits, normed if self.config.feedback_post_norm else out

    def forward(self, input_ids, hidden, positions, mask, cache, fused: bool):
        """input_ids, positions (n,); hidden (n, 3 H_target) if ``fused`` else the head's own (n, H);
        mask (n, past + n) additive -> (logits (n, Vd), output hidden (n, H))."""
        hidden = (self.project(hidden) if fused else hidden)[None]  # (1, n, H)
        embeds = self.embed_tokens(input_ids)[None].to(hidden.dtype)
        position_embeddings = self.rotary_emb(hidden, positions[None])
        if hasattr(self, "additional_layers"):  # SGLang llama_eagle3.py: norm(mlp, residual) sums the last pair
            mlp, stream = self.midlayer.branches(embeds, hidden, position_embeddings, mask[None, None], cache)
            for layer in self.additional_layers:
                mlp, stream = layer(mlp, position_embeddings, mask[None, None], cache)
            out = stream + mlp
        else:
            out = self.midlayer(embeds, hidden, position_embeddings, mask[None, None], cache)
        for layer in self.layers.values():  # (1, n, H) -> (1, n, H)
            out = layer(out, attention_mask=mask[None, None], position_embeddings=position_embeddings,
                        **{cache_keyword(): cache})
        logits, fed = self.read_out(out)
        return logits[0], fed[0]


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in memory of its own, 64-byte aligned, when it is not: a safetensors file's tensors are views of its
    buffer at 8-byte offsets, and CPU kernels round differently on unaligned weights, so one
    head read from an fp32 file would draft other logits than the same head cast from a bf16 file."""
    return t if t.data_ptr() % 64 == 0 else t.clone()


def plain_embedding(model) -> nn.Embedding:
    """The target's input embedding as an EAGLE-3 head reads it: the same weight table (shared, never copied),
    looked up without the scale some targets apply (Gemma multiplies its embeddings by sqrt(hidden size)).
    SpecForge's draft model loads the target's ``embed_tokens.weight`` into a plain ``nn.Embedding``
    (``specforge/modeling/draft/base.py``, ``load_embedding``), and SGLang's ``llama_eagle3`` looks it up plainly
    too, so a published head for such a target was trained on unscaled embeddings."""
    embedding = model.get_input_embeddings()
    if type(embedding) is nn.Embedding:
        return embedding
    plain = nn.Embedding(*embedding.weight.shape, padding_idx=embedding.padding_idx, device="meta")
    plain.weight = embedding.weight
    return plain


def build_head(ckpt, embedding) -> tuple[Eagle3Head, bool]:
    """An ``Eagle3Head`` holding ``ckpt``'s tensors (copied only where unaligned) and whether it uses ``embedding`` (the
    target's) rather than its own."""
    config = eagle3_config(ckpt.config)
    with torch.device("meta"):
        head = Eagle3Head(config)
    weights = {k: aligned(v) for k, v in ckpt.state.items() if k not in ("d2t", "t2d")}
    shared = "embed_tokens.weight" not in weights
    if shared:
        weights["embed_tokens.weight"] = embedding.weight
    if config.tie_word_embeddings:
        weights["lm_head.weight"] = weights["embed_tokens.weight"]
    missing, unexpected = head.load_state_dict(weights, strict=False, assign=True)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ModelLoadError(f"EAGLE-3 checkpoint: missing {missing[:3]}, unexpected {unexpected[:3]}")
    head.rotary_emb = type(head.rotary_emb)(config)  # buffers are computed, not stored
    return head, shared
