"""The run manifest: everything that determines the recorded rounds (no timestamps, so reruns compare equal)."""

from __future__ import annotations

from dataclasses import asdict
from importlib import metadata

from specrank.decode.config import DecodeConfig
from specrank.decode.loading.targets import sha256_files

VERSIONED = ("specrank", "torch", "transformers", "numpy", "pyarrow")


def build_manifest(target, drafter, config: DecodeConfig, prompts_path, shard_size: int) -> dict:
    """Target and drafter with their hashes, tokenizer, dtype, pool, budget, law, seed, prompts, versions."""
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
