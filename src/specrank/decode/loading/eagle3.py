"""EAGLE-3 heads in their published checkpoint formats, loaded from a local directory.

Format: ``config.json`` (Llama-style: ``hidden_size``, heads, ``intermediate_size``,
``vocab_size`` = the target's, ``draft_vocab_size``) and ``model.safetensors`` or
``pytorch_model.bin`` holding ``fc.weight`` (H, 3 H_target), ``midlayer.*`` (one decoder
layer whose q/k/v read 2H inputs), ``norm.weight``, ``lm_head.weight`` (draft_vocab, H),
``d2t`` (draft id -> target id offset), ``t2d`` (bool target-vocabulary mask) and,
optionally, ``embed_tokens.weight`` (else the target's embedding is shared). The layouts of
EAGLE, SpecForge/SGLang and vLLM speculators, their flags and their layer-id conventions are
read by ``eagle3_formats``; ``eagle3_export`` writes them.

Pairing of hidden states and tokens. The drafter's input at position t is
``(h_t, e(x_{t+1}))``: the fused low/mid/high target hidden state *at* position t (what
the target computed when it read x_t) with the embedding of the *next* token. Its output
predicts x_{t+2}. So with committed tokens x_0..x_{L-1} (hidden h_0..h_{L-1} known) and
the root r = x_L (not yet read by the target), the root step's last input is
``(h_{L-1}, e(r))`` and predicts the depth-1 candidates. Inside the tree there is no target
hidden state, so a node's input is ``(g_parent, e(node))`` where g_parent is the head's own
(pre-norm) output at its parent's position, and ``fc`` is applied to target states only.
``commit(tokens, hidden)`` receives the root and accepted path x_L..x_{L+A} with their
target hidden states h_L..h_{L+A} (from the verification pass) and queues the pairs
``(h_{L-1}, x_L), (h_L, x_{L+1}), ..., (h_{L+A-1}, x_{L+A})``; h_{L+A} waits for the next root.
The head's position ids are those of the hidden state (t), as in EAGLE-3.
"""

from __future__ import annotations

import functools
import sys
from importlib import resources
from pathlib import Path

import torch
from torch import nn

from specrank.decode.core import Drafter, RootStep, causal_mask, draft_log_probs, to_device
from specrank.decode.graphs import CapturedPasses, cached_pass
from specrank.decode.kv_cache import KVStore, StaticKVCache
from specrank.decode.loading.eagle3_formats import (  # noqa: F401  (read_state, draft_vocab_map: re-exported)
    DIALECT_NAMES,
    WEIGHT_FILES,
    choose_layers,
    default_layers,
    draft_vocab_map,
    read_head,
    read_state,
)
from specrank.decode.loading.hub import parse_hub_id, revision_of, snapshot
from specrank.decode.loading.standalone import TokenizerMismatchError
from specrank.decode.loading.targets import ModelLoadError, cache_keyword
from specrank.files import cache_root, sha256_files

DEFAULT_HEAD = "smollm2-eagle3"
# The heads named by their target (``eagle3:NAME``): their folder, in the cache and in the package, and the make
# target that trains one into the cache (which wins over the shipped one).
NAMED_HEADS = {"default": (DEFAULT_HEAD, "make drafter"), "gemma3-270m": ("gemma3-270m-eagle3", "make drafter-gemma3")}


def cached_head_dir(name: str = "default") -> Path:
    """Where the head ``eagle3:NAME`` is trained into the cache: ``$SPECRANK_CACHE/drafters/<folder>``."""
    return cache_root() / "drafters" / NAMED_HEADS[name][0]


def shipped_head_dir(name: str = "default") -> Path:
    """The head ``eagle3:NAME`` that ships inside the package (bf16, its model card in ``README.md`` beside it)."""
    return Path(str(resources.files("specrank") / "data" / "heads" / NAMED_HEADS[name][0]))


def named_head_dir(name: str) -> Path:
    """``eagle3:NAME``: the head its make target trained into the cache when there is one, else the shipped head."""
    cached = cached_head_dir(name)
    return cached if (cached / "config.json").is_file() else shipped_head_dir(name)


def default_head_dir() -> Path:
    """``eagle3:default``: the embedded default target's head (``named_head_dir``)."""
    return named_head_dir("default")


def missing_named_head(name: str) -> str | None:
    """The one-line error for ``eagle3:NAME`` when neither the cache nor the package holds it (None: it is there)."""
    if (named_head_dir(name) / "config.json").is_file():
        return None
    return (f"no EAGLE-3 head eagle3:{name} in {cached_head_dir(name)} nor in {shipped_head_dir(name)}: run "
            f"`{NAMED_HEADS[name][1]}` (trains it into the cache)")


def head_dir(spec) -> Path:
    """The local directory of an ``eagle3:`` spec's rest: a ``NAMED_HEADS`` name, a path, or a hub id (its
    snapshot)."""
    if str(spec) in NAMED_HEADS:
        return named_head_dir(str(spec))
    if parse_hub_id(spec) is not None:
        return snapshot(spec, "EAGLE-3 head")
    return Path(spec)


def has_default_head() -> bool:
    """Whether ``eagle3:default`` names a head (the cached one or the shipped one)."""
    return (default_head_dir() / "config.json").is_file()


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


class Eagle3Drafter(Drafter):
    """An EAGLE-3 head drafting from the target's fused hidden states (see the module docstring)."""

    def __init__(self, head: Eagle3Head, vocab_size: int, draft_to_target, hidden_layers, path=None, spec=""):
        self.head, self.vocab_size, self.path, self.spec = head, int(vocab_size), path, spec
        self.draft_to_target = draft_to_target.to(next(head.parameters()).device)
        self.hidden_layers = tuple(int(i) for i in hidden_layers)
        self.store, self.passes = KVStore(), CapturedPasses()
        self.cache, self.committed = None, 0
        self.revision = revision_of(path) if path else None  # the hub commit a snapshot resolved to

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    @functools.cached_property
    def source_hash(self) -> str:
        """sha256 of the checkpoint's weight file."""
        return sha256_files([p for p in (self.path / n for n in WEIGHT_FILES) if p.is_file()][:1])

    def _hidden(self, target_hidden, n: int) -> torch.Tensor:
        width = self.head.fc.in_features
        if target_hidden is None or tuple(target_hidden.shape) != (n, width):
            got = None if target_hidden is None else tuple(target_hidden.shape)
            raise ValueError(f"EAGLE-3 drafter needs target hidden states of shape ({n}, {width}), got {got}")
        return target_hidden.detach().to(self.head.fc.weight.device, self.head.fc.weight.dtype)

    def start(self, prompt_ids, target_hidden=None) -> None:
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1)  # host tokens
        if not len(ids):
            raise ValueError("EAGLE-3 drafter needs a non-empty prompt (its last hidden state pairs with the root)")
        hidden = self._hidden(target_hidden, len(ids))
        self.cache, self.committed = StaticKVCache(self.store), 0
        self.pending_ids, self.pending_hidden, self.last_hidden = ids[1:], hidden[:-1], hidden[-1]

    def commit(self, tokens, target_hidden=None) -> None:
        ids = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        if not len(ids):
            return
        hidden = self._hidden(target_hidden, len(ids))
        self.pending_ids = torch.cat([self.pending_ids, ids])
        self.pending_hidden = torch.cat([self.pending_hidden, self.last_hidden[None], hidden[:-1]])
        self.last_hidden = hidden[-1]

    @torch.inference_mode()
    def _forward(self, ids, hidden, positions, mask, fused: bool):
        dev, dt = self.device, self.head.fc.weight.dtype
        tensors = (to_device(ids, dev), hidden, to_device(positions, dev))
        fn = functools.partial(self._pass, fused=fused)
        logits, out = cached_pass(self.cache, len(ids), dev, fn, tensors, mask, dt,
                                  self.passes if self.graphs else None, fused)
        return draft_log_probs(logits), out

    def _pass(self, cache, ids, hidden, positions, mask, write, fused: bool):
        cache.write = write
        return self.head(ids, hidden, positions, mask, cache, fused)

    def _draft_root(self, root_token: int) -> RootStep:
        if self.cache is None:
            raise RuntimeError("drafter.start() must be called before grow_pool()")
        ids = torch.cat([self.pending_ids, torch.tensor([root_token])])
        hidden = torch.cat([self.pending_hidden, self.last_hidden[None]])
        n, past = len(ids), self.committed
        logp, out = self._forward(ids, hidden, torch.arange(past, past + n), causal_mask(n, past), fused=True)
        self.committed = past + n - 1
        self.pending_ids, self.pending_hidden = ids[:0], hidden[:0]
        return RootStep(logp[-1], out[-1], past + n, past + n - 1)

    def _draft_step(self, tokens, positions, mask, feed):
        return self._forward(tokens, feed, positions, mask, fused=False)

    def _rewind(self) -> None:
        self.cache.crop(self.committed)


def default_hidden_layers(config, num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default target states for a target of ``num_layers`` layers: ``hidden_states`` (2, L//2, L-3)."""
    return default_layers(num_layers)


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


def load_eagle3(directory, target, spec: str = "", eagle3_layers=None, specforge_norm_output=None) -> Eagle3Drafter:
    """Load an EAGLE-3 head for ``target`` from a local checkpoint directory in any dialect of
    ``eagle3_formats``; ``eagle3_layers`` (``hidden_states`` indices) overrides the config's choice and
    ``specforge_norm_output`` says which SpecForge wrote ``norm_output``. Says once, on stderr, which dialect and
    which target layers were chosen."""
    if str(directory) in NAMED_HEADS and (missing := missing_named_head(str(directory))):
        raise FileNotFoundError(missing)
    named, directory = str(directory), head_dir(directory)
    ckpt = read_head(directory, specforge_norm_output)
    config = eagle3_config(ckpt.config)
    if config.vocab_size != target.vocab_size:
        raise TokenizerMismatchError(
            f"EAGLE-3 head vocabulary ({config.vocab_size}) differs from the target's ({target.vocab_size})"
        )
    if config.target_hidden_size != target.hidden_size:
        raise ModelLoadError(
            f"EAGLE-3 head expects target hidden size {config.target_hidden_size}, not {target.hidden_size}"
        )
    layers, how = choose_layers(ckpt, target.num_layers, eagle3_layers)
    d2t = draft_vocab_map(ckpt.state, config)
    embedding = plain_embedding(target.model)
    head, shared = build_head(ckpt, embedding)
    head = head.to(target.device, target.dtype).eval().requires_grad_(False)
    if shared:
        head.embed_tokens = embedding  # share, never copy
        if config.tie_word_embeddings:
            head.lm_head.weight = embedding.weight
    notes = "".join(f"; {n}" for n in ckpt.notes)
    print(f"EAGLE-3 head {directory}: {DIALECT_NAMES[ckpt.dialect]} layout, target hidden_states "
          f"{list(layers)} from {how}{notes}", file=sys.stderr)
    if not spec:
        spec = f"eagle3:{directory if named == 'default' else named}"
    if eagle3_layers is not None:
        spec += f" --eagle3-layers {','.join(map(str, layers))}"  # part of a run's identity
    if specforge_norm_output is not None:
        spec += f" --specforge-norm-output {specforge_norm_output}"
    return Eagle3Drafter(head, target.vocab_size, d2t, layers, directory, spec)
