"""The run manifest: everything that determines the recorded rounds (no timestamps, so reruns compare equal)."""

from __future__ import annotations


from specrank.decode.config import DecodeConfig
from specrank.files import sha256_files
from specrank.versions import package_version

VERSIONED = ("specrank", "torch", "transformers", "numpy", "pyarrow")


def build_manifest(target, drafter, config: DecodeConfig, prompts_path, shard_size: int) -> dict:
    """Target and drafter with their hashes, tokenizer, dtype, pool, budget, law, seed, prompts, versions."""
    return run_manifest(model_identity(target, drafter), config, prompts_path, shard_size)


def model_identity(target, drafter) -> dict:
    """The manifest's fields known where the models are loaded (a Ray worker's, on a cluster): target and
    drafter with their hashes, tokenizer, dtype, library versions."""
    revisions = {f"{name}_revision": rev for name, model in (("target", target), ("drafter", drafter))
                 if (rev := getattr(model, "revision", None))}  # hub commits, for models given as hub ids
    return {
        "target": target.name,
        "target_sha256": getattr(target, "source_hash", ""),
        "drafter": getattr(drafter, "spec", type(drafter).__name__),
        "drafter_sha256": getattr(drafter, "source_hash", ""),
        **revisions,
        "tokenizer": getattr(target.tokenizer, "name_or_path", ""),
        "dtype": str(target.dtype).removeprefix("torch."),
        "versions": {name: package_version(name) for name in VERSIONED},
    }


def run_manifest(identity: dict, config: DecodeConfig, prompts_path, shard_size: int) -> dict:
    """The manifest of ``model_identity`` fields decoding the prompt file under ``config``."""
    models = {k: v for k, v in identity.items() if k != "versions"}
    return {**models, **config_manifest(config, prompts_path, shard_size), "versions": identity["versions"]}


def config_manifest(config: DecodeConfig, prompts_path, shard_size: int) -> dict:
    """The manifest's fields known before any model loads: pool, budget, law, seed, prompts, shards."""
    return {
        "pool_shape": config.shape.as_manifest(),
        "pool_size": config.shape.size,
        "budget": config.budget,
        "extra_scored": config.extra,
        "temperature": config.temperature,
        "seed": config.seed,
        "max_new_tokens": config.max_new_tokens,
        "prompts": str(prompts_path),
        "prompts_sha256": sha256_files([prompts_path]),
        "shard_size": shard_size,
    }


def with_trained_prompts(manifest: dict, trained_prompts: int) -> dict:
    """``manifest`` saying how many of its prompts the drafter was trained on, when any were (decoded only when
    asked explicitly); a run on unseen prompts has no such key."""
    return {**manifest, "drafter_trained_prompts": trained_prompts} if trained_prompts else manifest
