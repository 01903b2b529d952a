"""What each engine does with an EAGLE-3 head directory, re-implemented as small pure functions from its
own loader (no engine is installed here), and a from-scratch EAGLE-3 forward used as the reference.

- SGLang ``python/sglang/srt/models/llama_eagle3.py`` ``LlamaForCausalLMEagle3.load_weights`` and
  ``LlamaModel.forward`` (03d5a777: ``midlayer`` then ``additional_layers``), and ``models/llama.py``
  ``set_eagle3_layers_to_capture`` (before and after PR #25454).
- vLLM ``vllm/model_executor/models/llama_eagle3.py`` ``Eagle3LlamaForCausalLM.load_weights``,
  ``models/qwen3_eagle3.py`` ``Eagle3Qwen3ForCausalLM.load_weights`` (055e47c2),
  ``vllm/transformers_utils/configs/speculators/algos.py`` ``update_eagle3`` and
  ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` with ``models/llama.py``'s capture.
- SafeAILab EAGLE ``eagle/model/cnets.py`` ``Model`` (``load_state_dict(strict=False)``),
  ``eagle/model/ea_model.py`` and ``eagle/model/modeling_llama_kv.py``'s capture.
"""

from __future__ import annotations

import math

import torch

STACKED = ((".qkv_proj", ".q_proj"), (".qkv_proj", ".k_proj"), (".qkv_proj", ".v_proj"),
           (".gate_up_proj", ".gate_proj"), (".gate_up_proj", ".up_proj"))
LAYER = ("self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
         "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight")


def _stack(name: str) -> str:
    for param, shard in STACKED:
        if shard in name:
            return name.replace(shard, param)
    return name


# ---- SGLang -------------------------------------------------------------------------------------------
def sglang_params(config: dict) -> set[str]:
    """Parameter names of SGLang's ``LlamaForCausalLMEagle3`` for ``config``: ``model.midlayer`` and, for
    ``num_hidden_layers`` N > 1, ``model.additional_layers.0..N-2`` (``BasicDecoderLayer`` sets its
    ``input_layernorm`` to None, so that weight is no parameter there)."""
    names = {"model.embed_tokens.weight", "model.fc.weight", "model.norm.weight"} | {f"model.midlayer.{p}" for p in LAYER}
    for i in range(int(config.get("num_hidden_layers") or 1) - 1):
        names |= {f"model.additional_layers.{i}.{p}" for p in LAYER if p != "input_layernorm.weight"}
    if config.get("bias"):
        names.add("model.fc.bias")
    if not config.get("tie_word_embeddings"):
        names.add("lm_head.weight")
    return names


def sglang_load(config: dict, state: dict) -> tuple[set[str], list[str], torch.Tensor | None]:
    """(parameters loaded, checkpoint names silently skipped, hot_token_id) as ``load_weights`` does: a name is
    tried as given, then under ``model.``; a stacked parameter counts as loaded once every shard of it came."""
    params, shards, skipped, hot = sglang_params(config), {}, [], None
    for name in state:
        if "d2t" in name:
            hot = state[name] + torch.arange(state[name].shape[0])
            continue
        if "t2d" in name:
            continue
        mapped = _stack(name)
        target = mapped if mapped in params else f"model.{mapped}"
        if target not in params:
            skipped.append(name)
            continue
        shards.setdefault(target, set()).add(next((shard for _, shard in STACKED if shard in name), None))
    whole = {t for t, got in shards.items() if got == ({s for p, s in STACKED if p in t} or {None})}
    return whole, skipped, hot


def sglang_capture(ids, num_layers: int, after_pr_25454: bool) -> tuple[int, ...]:
    """``layers_to_capture`` (= ``hidden_states`` indices: capture happens before layer i)."""
    if ids is None:
        return (2, num_layers // 2, num_layers - 3)
    if after_pr_25454 and ids[0] != 1:
        return tuple(ids)
    return tuple(v + 1 for v in ids)


# ---- vLLM ---------------------------------------------------------------------------------------------
def vllm_config(config: dict) -> dict:
    """The draft ``hf_config`` vLLM builds from a speculators ``config.json`` (``update_eagle3``)."""
    out = dict(config["transformer_layer_config"])
    out["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        out["target_hidden_size"] = config["target_hidden_size"]
    out["norm_before_residual"] = config.get("norm_before_residual", True)
    out["norm_before_fc"] = config.get("norm_before_fc", False)
    out["fc_norm"] = config.get("fc_norm", False)
    out["norm_output"] = config.get("norm_output", False)
    # update_eagle3's eagle3_arch_map (algos.py at 055e47c2): the layer config's model_type, absent = llama
    arch = {"qwen3": "Eagle3Qwen3ForCausalLM", "llama": "Eagle3LlamaForCausalLM"}.get(out.get("model_type", "llama"))
    if arch is None:
        raise ValueError(f"Unsupported model_type {out['model_type']} for Eagle3 speculator")
    out["architectures"] = [arch]
    if config.get("eagle_aux_hidden_state_layer_ids"):
        out["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
    return out


QK_NORM = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")  # vLLM Qwen3Attention, one weight of head_dim


def vllm_params(hf_config: dict) -> set[str]:
    """Parameters of the draft model ``update_eagle3`` names. ``Eagle3LlamaForCausalLM``: layer 0 the EAGLE-3
    one (``hidden_norm``), then ``num_hidden_layers - 1`` plain ``LlamaDecoderLayer`` s (vLLM PR #26164).
    ``Eagle3Qwen3ForCausalLM``: every layer a ``Qwen3Eagle3DecoderLayer`` (``q_norm`` / ``k_norm``), and each
    builds a ``hidden_norm``, which only layer 0's forward reads."""
    qwen3 = hf_config["architectures"] == ["Eagle3Qwen3ForCausalLM"]
    names = {"model.embed_tokens.weight", "model.fc.weight", "model.norm.weight", "lm_head.weight",
             "draft_id_to_target_id"} | {f"model.layers.0.{p}" for p in LAYER + (QK_NORM if qwen3 else ())}
    for i in range(1, int(hf_config.get("num_hidden_layers") or 1)):
        names |= {f"model.layers.{i}.{p}" for p in LAYER + (QK_NORM if qwen3 else ())
                  if qwen3 or p != "hidden_norm.weight"}
    if hf_config.get("norm_before_fc"):
        names.add("model.input_norm.weight")
    if hf_config.get("fc_norm"):
        names |= {f"model.fc_norm.{i}.weight" for i in range(3)}
    return names


def vllm_load(hf_config: dict, state: dict) -> set[str]:
    """Parameters loaded by ``load_weights`` (both classes map names alike: ``AutoWeightsLoader`` with
    ``midlayer.`` -> ``layers.0.`` and the stacked projections); an unknown name is an error there."""
    params, loaded = vllm_params(hf_config), set()
    for name in state:
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "lm_head" not in name:
            name = "model." + name
        name = _stack(name.replace("midlayer.", "layers.0."))
        if name not in params:
            raise KeyError(name)
        loaded.add(name)
    return loaded


def vllm_unloaded(hf_config: dict, loaded: set[str]) -> set[str]:
    """Parameters left at their initial values. ``Eagle3Qwen3ForCausalLM.load_weights`` returns None, so
    vLLM's ``DefaultModelLoader`` skips its every-weight-initialised check: a Qwen3 head missing a ``q_norm``
    loads without a word, which is why a test asks for this set (only layers 1.. ``hidden_norm``, unread)."""
    return vllm_params(hf_config) - loaded


def vllm_capture(hf_config: dict, num_layers: int) -> tuple[int, ...]:
    """``get_eagle3_aux_layers_from_config`` or the model default; ids are ``hidden_states`` indices."""
    ids = hf_config.get("eagle_aux_hidden_state_layer_ids")
    return tuple(ids) if ids else (2, num_layers // 2, num_layers - 3)


# ---- SafeAILab EAGLE ----------------------------------------------------------------------------------
def eagle_params(config: dict) -> set[str]:
    names = {"embed_tokens.weight", "lm_head.weight", "fc.weight", "norm.weight", "d2t", "t2d"}
    names |= {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"}
    names |= {f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    names |= {f"midlayer.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")}
    if config["vocab_size"] == config["draft_vocab_size"]:  # ea_model.py: del d2t, t2d
        names -= {"d2t", "t2d"}
    return names


def eagle_load(config: dict, state: dict) -> tuple[list[str], list[str]]:
    """(missing, unexpected) of ``load_state_dict(strict=False)``: unexpected keys are dropped silently,
    and a missing embedding is the target's only without ``target_hidden_size`` (else random)."""
    params = eagle_params(config)
    return sorted(params - set(state)), sorted(set(state) - params)


def eagle_capture(num_layers: int) -> tuple[int, ...]:
    """``modeling_llama_kv.py``: the inputs of layers 2, L//2 and L-3."""
    return (2, num_layers // 2, num_layers - 3)


# ---- the reference forward ----------------------------------------------------------------------------
def _rms(x, w, eps):
    x32 = x.float()
    return w.float() * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, theta):  # x (n, heads, hd), rotate-half convention
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    freqs = positions[:, None].float() * inv  # (n, hd/2)
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    rotated = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
    return x * cos + rotated * sin


def _attention(w, p, x, pos, cfg, flags):
    """Causal attention of the layer ``p`` on ``x`` (n, in) -> (n, H), ``o_proj`` applied; Qwen3 layers norm
    each query and key head (``q_norm`` / ``k_norm``) before RoPE."""
    eps, heads, kv, n = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, len(pos)
    hd = cfg.hidden_size // heads
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(n, heads, hd)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(n, kv, hd)
    if flags.get("qk_norm"):
        q, k = _rms(q, w[p + "self_attn.q_norm.weight"], eps), _rms(k, w[p + "self_attn.k_norm.weight"], eps)
    q, k = _rope(q, pos, 10000.0), _rope(k, pos, 10000.0)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(n, kv, hd)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd) + torch.full((n, n), float("-inf")).triu(1)
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * hd)
    return attn @ w[p + "self_attn.o_proj.weight"].T


def _mlp(w, p, x):
    return (torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)) @ \
        w[p + "mlp.down_proj.weight"].T


def _block(w, p, x, residual, pos, cfg, flags):
    """Attention of the layer ``p`` on ``x`` (n, in) added to ``residual``, then its MLP, added -> (n, H)."""
    out = residual + _attention(w, p, x, pos, cfg, flags)
    return out + _mlp(w, p, _rms(out, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps))


def reference_forward(w: dict, cfg, flags: dict, embed, tokens, target_rows, own_rows=None):
    """Uncached EAGLE-3 forward from raw tensors ``w`` (canonical names, any dtype) with the behaviour
    ``flags`` (specrank's names): positions 0..m-1 read the fused target states ``target_rows`` (m, 3H),
    the next ones the head's own outputs ``own_rows`` (n - m, H); ``flags["layers"]`` draft layers (default 1),
    ``flags["qk_norm"]`` for Qwen3 ones. -> (draft logits (n, Vd), fed-back (n, H))."""
    w = {k: v.float() for k, v in w.items()}
    eps, heads, kv, h = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    hd = h // heads
    x = target_rows.float()
    pos = torch.arange(len(tokens))
    if flags.get("norm_before_fc"):
        x = _rms(x, w["input_norm.weight"], eps)
    if flags.get("fc_norm"):
        x = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"], eps) for i, c in enumerate(x.chunk(3, -1))], -1)
    g = x @ w["fc.weight"].T  # (m, H)
    if own_rows is not None:
        g = torch.cat([g, own_rows.float()])
    n = len(tokens)
    normed = _rms(g, w["midlayer.hidden_norm.weight"], eps)
    residual = normed if flags.get("norm_before_residual") else g
    x = torch.cat([_rms(embed[tokens].float(), w["midlayer.input_layernorm.weight"], eps), normed], -1)
    out = _block(w, "midlayer.", x, residual, pos, cfg, flags)
    for i in range(1, flags.get("layers", 1)):  # plain decoder layers on the first one's output
        out = _block(w, f"layers.{i}.", _rms(out, w[f"layers.{i}.input_layernorm.weight"], eps), out, pos, cfg, flags)
    final = _rms(out, w["norm.weight"], eps)
    read = final if flags.get("logits_from_norm", True) else out
    return read @ w["lm_head.weight"].T, final if flags.get("feedback_post_norm") else out


def _add_rms(x, residual, weight, eps):
    """SGLang's ``RMSNorm(x, residual)`` (fused add): (norm(x + residual), x + residual)."""
    total = x + residual
    return _rms(total, weight, eps), total


def sglang_forward(w: dict, cfg, flags: dict, embed, tokens, target_rows, own_rows=None):
    """SGLang's ``LlamaModel.forward`` of ``llama_eagle3.py`` (03d5a777), uncached, from raw tensors ``w``
    (checkpoint names): the (hidden_states, residual) pair as its layers pass it, ``flags["layers"]`` being
    ``num_hidden_layers``. ``flags["drop_residual"]`` False is the control: each additional layer then reads
    hidden + residual, as the speculators stacking does. -> (draft logits (n, Vd), fed-back (n, H))."""
    w = {k: v.float() for k, v in w.items()}
    eps, pos = cfg.rms_norm_eps, torch.arange(len(tokens))
    hidden = target_rows.float() @ w["fc.weight"].T  # fc only where the width is not hidden_size
    if own_rows is not None:
        hidden = torch.cat([hidden, own_rows.float()])
    # LlamaDecoderLayer (the 2H one): residual = its hidden input
    residual = hidden
    x = torch.cat([_rms(embed[tokens].float(), w["midlayer.input_layernorm.weight"], eps),
                   _rms(hidden, w["midlayer.hidden_norm.weight"], eps)], -1)
    x, residual = _add_rms(_attention(w, "midlayer.", x, pos, cfg, {}), residual,
                           w["midlayer.post_attention_layernorm.weight"], eps)
    hidden = _mlp(w, "midlayer.", x)
    for i in range(flags.get("layers", 1) - 1):  # BasicDecoderLayer: the residual it is handed is overwritten
        p = f"additional_layers.{i}."
        residual = hidden if flags.get("drop_residual", True) else hidden + residual
        x = _attention(w, p, _rms(residual, w[p + "hidden_norm.weight"], eps), pos, cfg, {})
        x, residual = _add_rms(x, residual, w[p + "post_attention_layernorm.weight"], eps)
        hidden = _mlp(w, p, x)
    to_logits, to_aux = _add_rms(hidden, residual, w["norm.weight"], eps)  # aux: before the norm, fed back
    return to_logits @ w["lm_head.weight"].T, to_aux
