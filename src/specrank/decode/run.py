"""A recording run directory: ``manifest.json`` and ``rounds/shard-FIRST-LAST.parquet``.

Shards hold consecutive prompts (by index in the prompt file) and are written atomically,
so a rerun of the same command skips every prompt already in a shard file and leaves
those files untouched. A rerun whose manifest differs is refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from specrank.decode.loop import DecodeConfig, Timer, decode_prompt
from specrank.decode.models import sha256_files
from specrank.decode.prompts import encode_prompt
from specrank.atomic import write_json_atomic, write_parquet_atomic
from specrank.decode.record import rounds_table

SHARD = re.compile(r"shard-(\d+)-(\d+)\.parquet")
VERSIONED = ("specrank", "torch", "transformers", "numpy", "pyarrow")


class RunDirError(ValueError):
    """The run directory holds a different run."""


def build_manifest(target, drafter, config: DecodeConfig, prompts_path, shard_size: int) -> dict:
    """Everything that determines the recorded rounds (no timestamps, so reruns compare equal)."""
    return {
        "target": target.name,
        "target_sha256": getattr(target, "source_hash", ""),
        "drafter": getattr(drafter, "spec", type(drafter).__name__),
        "drafter_sha256": getattr(drafter, "source_hash", ""),
        "tokenizer": getattr(target.tokenizer, "name_or_path", ""),
        "dtype": str(target.dtype).removeprefix("torch."),
        "pool_shape": asdict(config.shape),
        "pool_size": config.shape.size,
        "budget": config.budget,
        "extra_scored": config.extra,
        "temperature": config.temperature,
        "seed": config.seed,
        "max_new_tokens": config.max_new_tokens,
        "prompts": str(prompts_path),
        "prompts_sha256": sha256_files([prompts_path]),
        "shard_size": shard_size,
        "versions": {name: metadata.version(name) for name in VERSIONED},
    }


# Recorded for the reader but not part of a run's identity: the prompts are identified by their
# hash, so the same file in another checkout (a fresh clone sharing the cache) resumes the run.
LOCATIONS = ("prompts",)


def open_run_dir(out_dir, manifest: dict) -> Path:
    """Create the run directory, or check that an existing one holds the same run."""
    out = Path(out_dir)
    path = out / "manifest.json"
    if path.exists():
        old = json.loads(path.read_text())
        keys = (set(old) | set(manifest)) - set(LOCATIONS)
        differ = sorted(k for k in keys if old.get(k) != manifest.get(k))
        if differ:
            raise RunDirError(f"{out} holds a different run (differs in: {', '.join(differ)}); use a new --out")
    else:
        (out / "rounds").mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, manifest)
    (out / "rounds").mkdir(exist_ok=True)
    for stale in (out / "rounds").glob(".*.tmp"):  # left by a killed write; never a finished shard
        stale.unlink()
    return out


def done_prompts(out_dir) -> set:
    """Prompt indices already recorded in finished shard files."""
    done = set()
    for f in Path(out_dir, "rounds").glob("shard-*.parquet"):
        m = SHARD.fullmatch(f.name)
        if m:
            done.update(range(int(m[1]), int(m[2]) + 1))
    return done


def pending_shards(n_prompts: int, done: set, shard_size: int) -> list[list[int]]:
    """Consecutive runs of unfinished prompt indices, cut into shards of at most ``shard_size``."""
    shards, current = [], []
    for i in range(n_prompts):
        if i in done or len(current) == shard_size or (current and current[-1] != i - 1):
            if current:
                shards.append(current)
            current = []
        if i not in done:
            current.append(i)
    return shards + ([current] if current else [])


def decode_run(target, drafter, prompts, out_dir, config: DecodeConfig, manifest: dict, shard_size: int = 4,
               verifier=None, progress: bool = True) -> Timer:
    """Decode ``prompts`` into ``out_dir`` shard by shard, skipping finished ones; return the timer."""
    from tqdm import tqdm

    if shard_size < 1:
        raise ValueError(f"shard size must be >= 1, got {shard_size}")
    encoded = [encode_prompt(target.tokenizer, p.text) for p in prompts]  # fail before any output
    out = open_run_dir(out_dir, manifest)
    done = done_prompts(out)
    timer = Timer()
    bar = tqdm(total=len(prompts), initial=len(done & set(range(len(prompts)))), unit="prompt",
               disable=not progress, dynamic_ncols=True)
    for shard in pending_shards(len(prompts), done, shard_size):
        records = []
        for i in shard:
            _, recs = decode_prompt(target, drafter, encoded[i], config, prompts[i].prompt_id, prompts[i].task,
                                    verifier=verifier, timer=timer)
            records += recs
            bar.update(1)
            bar.set_postfix(rounds=timer.rounds, accepted=f"{(timer.tokens / max(timer.rounds, 1)) - 1:.2f}",
                            tok_s=f"{timer.tokens / max(timer.total, 1e-9):.1f}")
        table = rounds_table(records, config.shape.size, config.shape.topk)
        write_parquet_atomic(table, out / "rounds" / f"shard-{shard[0]:05d}-{shard[-1]:05d}.parquet")
    bar.close()
    return timer
