"""Tiny targets, noisy-copy drafters and the first-two-tokens law test shared by the decoder tests."""

import copy
import json
import weakref

import numpy as np
import torch

from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.loading.standalone import CausalLMDrafter
from specrank.decode.loading.target_passes import Target
from specrank.decode.output_law import pooled_chisquare
from specrank.decode.strategies import RootDrawSelection
from specrank.decode.verify import ExhaustiveVerifier
from specrank.testing import save_tiny_llama, tiny_llama, tiny_tokenizer

PROMPT = [2, 5, 7, 16, 25, 19, 3, 2, 6]


def decode_prompt_online(target, drafter, prompt_ids, config, strategy, prompt_id="0", task="", timer=None,
                         measure=None):
    """One online decode whose rounds are measured (records with realized and expected acceptance)."""
    from specrank.decode.engine.prompt import decode_prompt
    from specrank.decode.runs.measure import Measure

    return decode_prompt(target, drafter, prompt_ids, config, strategy, observer=measure or Measure(),
                         prompt_id=prompt_id, task=task, timer=timer)
EOS = 3


def saved_tiny_inputs(d, texts):
    """(target dir, drafter dir, prompt file) on disk for CLI runs: a tiny target, a 2-layer drafter, ``texts``."""
    tgt = save_tiny_llama(d / "tgt", seed=0, vocab_size=128)
    drf = save_tiny_llama(d / "drf", seed=0, vocab_size=128, num_layers=2)
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n"
                               for i, t in enumerate(texts)))
    return tgt, drf, prompts


def tiny_target(vocab=128, **cfg):
    """A random tiny Llama target with a word-level tokenizer."""
    return Target(tiny_llama(0, vocab_size=vocab, **cfg), tiny_tokenizer(vocab))


def noisy_drafter(model, scale, seed=0):
    """A copy of ``model`` with perturbed weights (scale 0: the model itself): agrees often, not always."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp_min(1e-3))
    return CausalLMDrafter(draft, model.config.vocab_size)


def tiny_pair(vocab=128, scale=0.05, seed=0, **cfg):
    """A random tiny target and a perturbed copy of it as drafter."""
    torch.set_num_threads(1)
    target = tiny_target(vocab, **cfg)
    return target, noisy_drafter(target.model, scale, seed)


_REFERENCES = weakref.WeakKeyDictionary()  # model -> {(prompt, n): tokens}: a model's greedy text is computed once


def greedy_reference(target, prompt, n):
    """The target's own greedy continuation of ``prompt`` (``n`` tokens, HF ``generate``), kept per model: several
    strategies are checked against the same text, which one ``generate`` gives."""
    known = _REFERENCES.setdefault(target.model, {})
    key = (tuple(prompt), n)
    if key not in known:
        with torch.no_grad():
            known[key] = target.model.generate(torch.tensor([prompt]), max_new_tokens=n,
                                               do_sample=False)[0, len(prompt):].tolist()
    return list(known[key])


def first_two_law(target, prompt, temperature):
    """(V, V) exact law of the first two emitted tokens; cell (EOS, EOS) stands for 'EOS first'."""
    with torch.no_grad():
        p1 = torch.softmax(target.model(torch.tensor([prompt])).logits[0, -1] / temperature, -1)
        v = p1.shape[0]
        p2 = torch.softmax(target.model(torch.tensor([prompt + [x] for x in range(v)])).logits[:, -1] / temperature, -1)
    exact = (p1[:, None] * p2).double()
    exact[EOS], exact[EOS, EOS] = 0.0, p1[EOS]
    return exact.numpy()


class RedrawVerifier(ExhaustiveVerifier):
    """Deliberately wrong: after a rejection the continuation is drawn afresh from the full row."""

    def verify(self, tree, logits, generator, first=None):
        path, row = [], 0
        while True:
            node = tree.child(row, self.draw(logits[row], generator))
            if node < 0:
                return tree.pool_index[path], self.draw(logits[row], generator)
            path.append(node)
            row = node + 1


class DrafterRowDraw(RootDrawSelection):
    """Deliberately wrong: draws the first token from the drafter's root row instead of the target's."""

    def draw(self, root_logits, pool, verifier, generator):
        return int(torch.multinomial(torch.from_numpy(pool.q_root), 1, generator=generator))


def sampled_pvalue(target, drafter, strategy, n=100):
    """Chi-square p-value of ``n`` seeded two-token decodes (T = 1) against the target's first-two law."""
    config = DecodeConfig(PoolShape(3, 2, 3), budget=3, extra=0, temperature=1.0, max_new_tokens=2)
    exact = first_two_law(target, PROMPT, 1.0)
    counts = np.zeros_like(exact)
    for seed in range(n):
        cfg = DecodeConfig(**{**config.__dict__, "seed": seed})
        out, _ = decode_prompt_online(target, drafter, PROMPT, cfg, strategy, prompt_id="q")
        counts[out[0], (out + [EOS])[1]] += 1
    return pooled_chisquare(counts, exact * n)
