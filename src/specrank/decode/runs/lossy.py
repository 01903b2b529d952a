"""Runs with a verification rule (tree or chain speculation): ``rounds/`` as usual plus, per shard,
``diagnostics/shard-FIRST-LAST.parquet`` with one row per emitted token (exact emission diagnostics,
``specrank.decode.verify.lossy.emission``). The diagnostics shard is written before the rounds shard, and
a prompt counts as done once its rounds shard exists, so a rerun resumes exactly as ``decode`` does.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from specrank.decode.config import DecodeConfig
from specrank.decode.engine.timer import Timer
from specrank.decode.prompts import encode_prompts
from specrank.decode.runs.chain import chain_length, decode_chain_prompt
from specrank.decode.runs.recorder import record_prompt
from specrank.decode.runs.shards import open_run_dir, record_shards
from specrank.decode.runs.tables import read_shards, rounds_table
from specrank.decode.verify.lossy.adapters import TreeRuleVerifier
from specrank.decode.verify.lossy.emission import DIAGNOSTIC_COLUMNS, DIAGNOSTIC_KEYS, DIAGNOSTIC_VALUES

SPECULATIONS = ("tree", "chain")


class LossyRunError(ValueError):
    """A lossy run was asked with an unknown speculation or a rule it cannot run."""


def diagnostics_schema() -> pa.Schema:
    """Arrow schema of ``diagnostics/*.parquet``."""
    return pa.schema([pa.field(k, pa.type_for_alias(t)) for k, t in {**DIAGNOSTIC_KEYS, **DIAGNOSTIC_VALUES}.items()])


def prompt_diagnostics(rounds: list[dict], records: list[dict], prompt_id: str, task: str, seconds: float) -> dict:
    """Columns of one prompt's diagnostics rows from its per-round dicts (aligned with ``records``)."""
    sizes = np.array([len(d["token"]) for d in rounds], dtype=np.int64)  # (R,) emitted tokens per round
    per_round = {"round": [r["round"] for r in records], "position": [r["position"] for r in records],
                 "round_accepted": [r["accepted"] for r in records],
                 "expected_accepted": [d["expected_accepted"] for d in rounds]}
    cols = {k: np.repeat(np.asarray(v), sizes) for k, v in per_round.items()}
    for key in ("token", "accepted", "acceptance", "tv", "kl", "tv_truncated", "kl_truncated", "ceiling_excess"):
        cols[key] = np.concatenate([np.asarray(d[key]) for d in rounds]) if rounds else np.zeros(0)
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    cols["step"] = np.arange(int(sizes.sum())) - starts
    total = int(sizes.sum())
    cols.update(prompt_id=[prompt_id] * total, task=[task] * total, prompt_seconds=np.full(total, seconds))
    return cols


def diagnostics_table(prompts: list[dict]) -> pa.Table:
    """One Arrow table from the per-prompt column dicts of ``prompt_diagnostics``."""
    sch = diagnostics_schema()
    arrays = [pa.array(np.concatenate([np.asarray(p[f.name]) for p in prompts]) if prompts else [], type=f.type)
              for f in sch]
    return pa.Table.from_arrays(arrays, schema=sch)


def read_diagnostics(run_dir):
    """All diagnostics rows of a run directory as one pandas DataFrame (shard order)."""
    return read_shards(run_dir, "diagnostics")


def lossy_manifest(manifest: dict, rule, speculation: str) -> dict:
    """The run manifest with the speculation and the verification rule."""
    return {**manifest, "speculation": speculation, "verification_rule": rule.name}


def decode_one(target, drafter, ids, config: DecodeConfig, rule, speculation: str, verifier, prompt, timer: Timer):
    """(rounds records, per-round diagnostics) of one prompt under ``speculation``."""
    if speculation == "chain":
        _, records, rounds = decode_chain_prompt(target, drafter, ids, config, rule, prompt.prompt_id, prompt.task,
                                                 timer=timer)
        return records, rounds
    _, records = record_prompt(target, drafter, ids, config, prompt.prompt_id, prompt.task, verifier, timer)
    return records, verifier.take()


def lossy_work(target, drafter, prompts, config: DecodeConfig, rule, speculation: str = "tree",
               timer: Timer | None = None):
    """``(decode_one, tables)`` of the shard writer (``runs.shards.record_shards``) decoding ``prompts`` with
    ``rule`` under ``speculation``; refuses a bad speculation, rule or prompt before any output."""
    if speculation not in SPECULATIONS:
        raise LossyRunError(f"unknown speculation {speculation!r} (one of {', '.join(SPECULATIONS)})")
    if speculation == "chain":
        chain_length(config)
    verifier = TreeRuleVerifier(rule, config.temperature) if speculation == "tree" else None  # refuses non-tree rules
    encoded = encode_prompts(target, prompts, config)  # fail before any output

    def decode_shard_prompt(i):
        start = time.perf_counter()
        recs, rounds = decode_one(target, drafter, encoded[i], config, rule, speculation, verifier, prompts[i], timer)
        seconds = time.perf_counter() - start
        return {"rounds": recs,
                "diagnostics": prompt_diagnostics(rounds, recs, prompts[i].prompt_id, prompts[i].task, seconds)}

    tables = {"diagnostics": diagnostics_table,
              "rounds": lambda parts: rounds_table([r for p in parts for r in p], config.shape.size, config.shape.topk)}
    return decode_shard_prompt, tables


def lossy_decode_run(target, drafter, prompts, out_dir, config: DecodeConfig, manifest: dict, rule,
                     speculation: str = "tree", shard_size: int = 4, progress: bool = True) -> Timer:
    """Decode ``prompts`` with ``rule`` under ``speculation`` into ``out_dir`` (resumable); return the timer."""
    if shard_size < 1:
        raise LossyRunError(f"shard size must be >= 1, got {shard_size}")
    timer = Timer()
    decode_shard_prompt, tables = lossy_work(target, drafter, prompts, config, rule, speculation, timer)
    out = open_run_dir(out_dir, lossy_manifest(manifest, rule, speculation))
    record_shards(out, len(prompts), shard_size, decode_shard_prompt, tables, progress=progress)
    return timer


__all__ = ["SPECULATIONS", "DIAGNOSTIC_COLUMNS", "lossy_decode_run", "read_diagnostics"]
