"""EAGLE-3 heads in their published checkpoint formats, loaded from a local directory.

Format: ``config.json`` (Llama-style: ``hidden_size``, heads, ``intermediate_size``,
``vocab_size`` = the target's, ``draft_vocab_size``) and ``model.safetensors`` or
``pytorch_model.bin`` holding ``fc.weight`` (H, 3 H_target), ``midlayer.*`` (one decoder
layer whose q/k/v read 2H inputs), ``norm.weight``, ``lm_head.weight`` (draft_vocab, H),
``d2t`` (draft id -> target id offset), ``t2d`` (bool target-vocabulary mask) and,
optionally, ``embed_tokens.weight`` (else the target's embedding is shared). The layouts of
EAGLE, SpecForge/SGLang and vLLM speculators, their flags and their layer-id conventions are
read by ``eagle3_formats``; ``eagle3_export`` writes them. The head module is ``eagle3_head``;
``eagle3_named_heads`` says where the head of a spec is (``eagle3:default``, a path, a hub id).

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

import torch

from specrank.decode.core import Drafter, ModelLoadError, RootStep, causal_mask, draft_log_probs, to_device
from specrank.decode.graphs import CapturedPasses, cached_pass
from specrank.decode.kv_cache import KVStore, StaticKVCache
from specrank.decode.loading.eagle3_formats import (
    DIALECT_NAMES,
    WEIGHT_FILES,
    choose_layers,
    default_layers,
    draft_vocab_map,
    read_head,
)
from specrank.decode.loading.eagle3_head import Eagle3Head, build_head, eagle3_config, plain_embedding
from specrank.decode.loading.eagle3_named_heads import NAMED_HEADS, head_dir, missing_named_head
from specrank.decode.loading.hub import revision_of
from specrank.decode.loading.standalone import TokenizerMismatchError
from specrank.files import sha256_files


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
