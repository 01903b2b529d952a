"""Self-distillation data: the target continues the prompt set (greedy and sampled), and every
position of every sequence stores what head training needs.

Per position ``t`` of a sequence ``x`` a shard stores the target's hidden states at the
head's three layers (the drafter's input features), the target's final normed hidden
state (so the target row restricted to any draft vocabulary is recomputed exactly as
``lm_head(last)``), and the target's argmax over its full vocabulary.

Shards are safetensors files written atomically under
``$SPECRANK_CACHE/drafter-data/<target-hash>/<spec-hash>/`` (default root
``~/.cache/specrank``); an interrupted generation resumes at the first missing shard.
With ``workers`` the missing shards are generated on Ray workers (``specrank.scale``), each
seeded by its index as in one process.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from specrank.atomic import atomic_write, remove_temps, write_json_atomic
from specrank.decode.loading.targets import load_target
from specrank.decode.prompts import encode_prompt
from specrank.files import cache_root
from specrank.scale import Shard, worker_pool

FP16_MAX = 65000.0  # above this a shard keeps float32 features
FORMAT = 2  # shard layout version, part of the cache key


class DataError(ValueError):
    """Self-distillation data cannot be generated or read as asked."""


@dataclass(frozen=True)
class GenerationSpec:
    """How the target continues each prompt; part of the cache key."""

    layers: tuple[int, ...]  # target hidden_states indices fed to the head (low, mid, high)
    samples: int = 3  # sampled continuations per prompt, besides the greedy one
    temperature: float = 1.0
    max_new_tokens: int = 256
    batch_size: int = 8  # sequences generated together; one shard per batch
    seed: int = 0

    def __post_init__(self):
        if len(self.layers) < 1 or any(int(i) < 0 for i in self.layers):
            raise DataError(f"layers must be non-negative hidden-state indices, got {self.layers}")
        if self.samples < 0 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise DataError("samples >= 0, max_new_tokens >= 1 and batch_size >= 1 are required")
        if self.samples and not self.temperature > 0:
            raise DataError(f"temperature must be positive for sampling, got {self.temperature}")


@dataclass
class Corpus:
    """Concatenated sequences: token ids (n,), features (n, F), last (n, H), argmax (n,),
    ``offsets`` (D+1,) sequence boundaries, ``response`` (n,) True where the target row predicts a
    generated token (position >= prompt length - 1), and one (prompt_id, sample) per sequence."""

    input_ids: torch.Tensor
    features: torch.Tensor
    last: torch.Tensor
    argmax: torch.Tensor
    offsets: torch.Tensor
    response: torch.Tensor
    docs: list[tuple[str, int]] = field(default_factory=list)

    def sequences(self, keep) -> list[slice]:
        """Slices of the sequences whose prompt id satisfies ``keep``."""
        bounds = self.offsets.tolist()
        return [slice(bounds[i], bounds[i + 1]) for i, (pid, _) in enumerate(self.docs) if keep(pid)]


def target_fingerprint(target) -> str:
    """A hash of the target's weights (its source file hash when known, else its parameters)."""
    known = getattr(target, "source_hash", "")
    if known:
        return known[:16]
    digest = hashlib.sha256()
    for name, tensor in target.model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def data_dir(target, prompts, spec: GenerationSpec, root=None) -> Path:
    """The cache directory of ``spec`` applied to ``prompts`` with ``target``."""
    key = json.dumps([FORMAT, asdict(spec), [(p.prompt_id, p.text) for p in prompts]], sort_keys=True)
    spec_hash = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(root or cache_root()) / "drafter-data" / target_fingerprint(target) / spec_hash


def jobs(prompts, spec: GenerationSpec) -> list[list[tuple[int, int]]]:
    """Shards of (prompt index, sample) pairs; sample 0 is greedy, each shard has one mode."""
    greedy = [(i, 0) for i in range(len(prompts))]
    sampled = [(i, s) for s in range(1, spec.samples + 1) for i in range(len(prompts))]
    step = spec.batch_size
    return [part[k : k + step] for part in (greedy, sampled) for k in range(0, len(part), step)]


def generate_corpus(target, prompts, spec: GenerationSpec, root=None, progress=False, workers=None) -> Path:
    """Generate (or finish generating) the shards for ``prompts``; return their directory. ``workers``
    (``specrank.scale.Workers``): generate the missing shards on Ray workers that load the target as
    ``load_target(target.name)`` on ``target``'s device type and dtype."""
    if not prompts:
        raise DataError("no prompts to generate from")
    if max(spec.layers) > target.num_layers:
        raise DataError(f"layers {spec.layers} outside the target's 0..{target.num_layers}")
    out = data_dir(target, prompts, spec, root)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"spec": asdict(spec), "prompts": [p.prompt_id for p in prompts], "target": target.name}
    write_json_atomic(out / "meta.json", meta)
    encoded = [encode_prompt(target.tokenizer, p.text) for p in prompts]
    shards = jobs(prompts, spec)
    todo = [k for k in range(len(shards)) if not shard_path(out, k).exists()]
    if workers is not None and todo:
        generate_on_workers(workers, target, prompts, spec, out, todo, progress)
        return out
    bar = _progress(len(shards), progress, "generating")
    bar.update(len(shards) - len(todo))
    for k in todo:
        _write_shard(shard_path(out, k), target, [encoded[i] for i, _ in shards[k]], shards[k], prompts, spec, k)
        bar.update(1)
    bar.close()
    return out


def shard_path(out: Path, k: int) -> Path:
    return out / f"shard-{k:05d}.safetensors"


class CorpusWork:
    """A Ray worker's state (``specrank.scale``): the target, loaded once, writing shards by index."""

    def __init__(self, load, prompts, spec: GenerationSpec, out: str):
        self.target, self.prompts, self.spec, self.out = load(), prompts, spec, Path(out)
        self.encoded = [encode_prompt(self.target.tokenizer, p.text) for p in prompts]
        self.shards = jobs(prompts, spec)

    def info(self) -> dict:
        return {"target": target_fingerprint(self.target)}

    def run(self, k: int) -> dict:
        shard = self.shards[k]
        _write_shard(shard_path(self.out, k), self.target, [self.encoded[i] for i, _ in shard], shard, self.prompts,
                     self.spec, k)
        return {"sequences": len(shard)}


def generate_on_workers(workers, target, prompts, spec: GenerationSpec, out: Path, todo: list[int], progress) -> None:
    """Write the shards ``todo`` on ``workers``; a ScaleError names the shards lost to dead workers."""
    dtype = str(target.dtype).removeprefix("torch.")
    load = functools.partial(load_target, target.name, target.device.type, dtype)
    shards = jobs(prompts, spec)
    with worker_pool(workers, functools.partial(CorpusWork, load, list(prompts), spec, str(out))) as pool:
        if pool.same_info()["target"] != target_fingerprint(target):
            raise DataError(f"the workers' target {target.name} differs from this process's (another model there?)")
        items = [Shard(k, f"data shard {k} ({shard_path(out, k)})") for k in todo]
        outcome = pool.run(items, len(shards), len(shards) - len(todo), progress, unit="shard",
                           tidy=lambda unfinished: [remove_temps(out, f".{shard_path(out, s.payload).name}.*.tmp")
                                                    for s in unfinished])
    for timing in outcome.timings:
        print(timing.line())
    outcome.check()


def _write_shard(path, target, prompt_ids, shard, prompts, spec, k) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(spec.seed * 1_000_003 + k)
    greedy = shard[0][1] == 0
    seqs = continue_prompts(target, prompt_ids, spec.max_new_tokens, None if greedy else spec.temperature)
    parts = [sequence_rows(target, seq, spec.layers) for seq in seqs]
    features = torch.cat([p[0] for p in parts])
    keep32 = not bool(features.abs().max() < FP16_MAX)
    state = {
        "input_ids": torch.cat([torch.tensor(s, dtype=torch.int32) for s in seqs]),
        "features": features if keep32 else features.half(),
        "last": torch.cat([p[1] for p in parts]),  # float32: the teacher rows are recomputed exactly
        "argmax": torch.cat([p[2] for p in parts]).int(),
        "offsets": torch.tensor(np.cumsum([0] + [len(s) for s in seqs]), dtype=torch.int64),
        "prompt_lens": torch.tensor([len(p) for p in prompt_ids], dtype=torch.int64),
    }
    docs = [[prompts[i].prompt_id, s] for i, s in shard]
    atomic_write(path, lambda tmp: save_file(state, tmp, metadata={"docs": json.dumps(docs)}))


@torch.inference_mode()
def continue_prompts(target, prompt_ids, max_new_tokens: int, temperature=None) -> list[list[int]]:
    """Batched continuations (greedy when ``temperature`` is None), each ending at its first EOS."""
    from transformers import GenerationConfig

    model, tok = target.model, target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for row, p in enumerate(prompt_ids):  # left padding: generation continues every row at the end
        ids[row, width - len(p) :] = torch.tensor(p)
        attn[row, width - len(p) :] = 1
    # An explicit config: the model's own generation defaults (top-k 50, penalties) do not apply.
    law = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
    config = GenerationConfig(max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=tok.eos_token_id, **law)
    out = model.generate(input_ids=ids.to(target.device), attention_mask=attn.to(target.device), generation_config=config)
    return [p + _until_eos(out.cpu()[row, width:].tolist(), tok.eos_token_id) for row, p in enumerate(prompt_ids)]


def _until_eos(new: list[int], eos) -> list[int]:
    if eos is not None and eos in new:
        return new[: new.index(eos) + 1]
    return new


def sequence_rows(target, seq, layers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One causal target pass over ``seq``: features (n, len(layers)*H), last (n, H), argmax (n,)."""
    n = len(seq)
    ids = torch.tensor(seq, dtype=torch.long)
    causal = torch.full((n, n), float("-inf")).triu_(1)
    logits, hidden = target.forward(ids, torch.arange(n), causal, target.new_cache(), tuple(layers),
                                    final_normed=True)
    h = target.hidden_size
    return hidden[:, :-h].cpu(), hidden[:, -h:].cpu(), logits.argmax(-1).cpu()


def load_corpus(*directories) -> Corpus:
    """Read every shard of one or more data directories, in order (features and last states in their stored dtype)."""
    from safetensors import safe_open

    paths = []
    for directory in directories:
        found = sorted(Path(directory).glob("shard-*.safetensors"))
        if not found:
            raise DataError(f"no shards in {directory}")
        paths += found
    parts, docs, base = [], [], 0
    for path in paths:
        with safe_open(str(path), "pt") as f:
            part = {k: f.get_tensor(k) for k in f.keys()}
            docs += [tuple(d) for d in json.loads(f.metadata()["docs"])]
        part["offsets"] = part["offsets"][:-1] + base
        base += int(part["input_ids"].shape[0])
        parts.append(part)
    cat = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    offsets = torch.cat([cat["offsets"], torch.tensor([base])])
    lengths = offsets.diff()
    within = torch.arange(base) - torch.repeat_interleave(offsets[:-1], lengths)  # (n,) position in its sequence
    response = within >= torch.repeat_interleave(cat["prompt_lens"], lengths) - 1
    return Corpus(
        input_ids=cat["input_ids"].long(),
        features=cat["features"],
        last=cat["last"],
        argmax=cat["argmax"].long(),
        offsets=offsets,
        response=response,
        docs=docs,
    )


def _progress(total: int, enabled: bool, desc: str):
    return tqdm(total=total, disable=not enabled, desc=desc, unit="shard")
