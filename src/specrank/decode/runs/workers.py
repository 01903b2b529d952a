"""Runs decoded on Ray workers (``specrank decode --workers N``, ``verify-sweep --workers N``) through the shared
helper ``specrank.scale``.

Each worker loads the target and drafter once and writes whole shards of one or more run directories with
the same shard writer as a single process. The driver loads no model: it writes each manifest from the
workers' model identity (checked equal across workers), plus the worker count, which is recorded but is
not part of the run's identity. The rounds equal a single process's bit for bit at the same per-process
thread count and device, because generators are seeded per (prompt, seed) and a prompt never spans workers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

from specrank.atomic import remove_temps
from specrank.decode.config import DecodeConfig
from specrank.decode.engine.timer import Timer
from specrank.decode.loading.model_spec import ModelSpec
from specrank.decode.runs.chain import chain_length
from specrank.decode.runs.lossy import SPECULATIONS, lossy_manifest, lossy_work
from specrank.decode.runs.manifest import model_identity, run_manifest, with_trained_prompts
from specrank.decode.runs.recorder import recorder_work
from specrank.decode.runs.shards import (
    decode_shard,
    done_prompts,
    open_run_dir,
    pending_shards,
    shard_name,
    write_shard,
)
from specrank.decode.verify.lossy.adapters import TreeRuleVerifier
from specrank.decode.verify.lossy.parse import parse_verification_rule
from specrank.scale import Outcome, ScaleError, Shard, Workers, worker_pool

RECORD = "record"  # the recorder's runs: rounds only, draft selection, exhaustive verification


@dataclass(frozen=True)
class RunSpec:
    """One run directory: the recorder (``speculation="record"``) or a lossy run under ``tree`` / ``chain`` with the
    rule ``verification_rule`` (``NAME[:KEY=VALUE,...]``)."""

    out: str
    config: DecodeConfig
    speculation: str = RECORD
    verification_rule: str | None = None
    trained_prompts: int = 0  # prompts the drafter was trained on, decoded when asked explicitly

    def rule(self):
        return parse_verification_rule(self.verification_rule or "lossless")

    def check(self) -> None:
        """Refuse an unknown speculation, a rule without a tree form or a pool that is not a chain (before Ray
        starts)."""
        if self.speculation not in (RECORD, *SPECULATIONS):
            raise ScaleError(f"unknown speculation {self.speculation!r} (one of {RECORD}, {', '.join(SPECULATIONS)})")
        if self.speculation == "tree":
            TreeRuleVerifier(self.rule(), self.config.temperature)
        elif self.speculation == "chain":
            chain_length(self.config)
            self.rule()

    def manifest(self, identity: dict, prompts_path, shard_size: int, workers: int) -> dict:
        manifest = run_manifest(identity, self.config, prompts_path, shard_size)
        if self.speculation != RECORD:
            manifest = lossy_manifest(manifest, self.rule(), self.speculation)
        return {**with_trained_prompts(manifest, self.trained_prompts), "workers": workers}


class DecodeWork:
    """One worker's state: the models, loaded once, and a shard decoder per run."""

    def __init__(self, models: ModelSpec, prompts, runs: list[RunSpec]):
        self.target, self.drafter = models.load()
        self.runs, self.timers = runs, [Timer() for _ in runs]
        self.works = [run_work(self.target, self.drafter, prompts, run, timer) for run, timer in zip(runs, self.timers)]

    def info(self) -> dict:
        return model_identity(self.target, self.drafter)

    def run(self, payload) -> dict:
        """Decode and write one shard ``(run index, prompt indices)``; its counts."""
        r, shard = payload
        timer = self.timers[r]
        rounds, tokens, passes, split = timer.rounds, timer.tokens, timer.passes, timer.split()
        decode_one, tables = self.works[r]
        write_shard(Path(self.runs[r].out), shard, decode_shard(shard, decode_one, tables))
        spans = {f"{k}_s": v - split[k] for k, v in timer.split().items()}  # where the shard's time went
        return {"prompts": len(shard), "rounds": timer.rounds - rounds, "tokens": timer.tokens - tokens,
                "passes": timer.passes - passes, **spans}


def run_work(target, drafter, prompts, run: RunSpec, timer: Timer):
    """``(decode_one, tables)`` of ``run``'s shards."""
    if run.speculation == RECORD:
        return recorder_work(target, drafter, prompts, run.config, timer=timer)
    return lossy_work(target, drafter, prompts, run.config, run.rule(), run.speculation, timer)


def decode_on_workers(workers: Workers, models: ModelSpec, prompts, prompts_path, runs: list[RunSpec],
                      shard_size: int = 4, progress: bool = True) -> Outcome:
    """Decode every unfinished shard of ``runs`` on ``workers`` and print per-worker timing; a ScaleError names
    the prompts lost to dead workers (a rerun finishes exactly those)."""
    if shard_size < 1:
        raise ScaleError(f"shard size must be >= 1, got {shard_size}")
    for run in runs:
        run.check()
    models = replace(models, threads=None)  # each worker runs on the workers' threads, not the driver's
    with worker_pool(workers, functools.partial(DecodeWork, models, list(prompts), runs)) as pool:
        identity = pool.same_info()
        outs = [open_run_dir(run.out, run.manifest(identity, prompts_path, shard_size, workers.n)) for run in runs]
        shards = [Shard((r, shard), shard_label(out, shard), len(shard)) for r, out in enumerate(outs)
                  for shard in pending_shards(len(prompts), done_prompts(out), shard_size)]
        total = len(prompts) * len(runs)
        outcome = pool.run(shards, total, total - sum(s.units for s in shards), progress, rounds_postfix,
                           tidy=functools.partial(remove_shard_temps, outs))
    for timing in outcome.timings:
        print(timing.line())
    outcome.check()
    return outcome


def shard_label(out: Path, shard: list[int]) -> str:
    return f"prompts {shard[0]}-{shard[-1]} ({out / 'rounds' / shard_name(shard)})"


def rounds_postfix(totals: dict) -> dict:
    return {"rounds": totals.get("rounds", 0)}


def remove_shard_temps(outs, unfinished: list[Shard]) -> None:
    """Delete the temporary files that the ``unfinished`` shards' killed writes left (and nothing else's)."""
    for s in unfinished:
        r, shard = s.payload
        remove_temps(outs[r], f"*/.*{shard_name(shard)}.*.tmp")  # the shard's and its checksum's


def summary(outcome: Outcome, out) -> str:
    """The command's closing line: rounds, acceptance, throughput over the wall clock, workers."""
    totals = outcome.totals()
    rounds, tokens = totals.get("rounds", 0), totals.get("tokens", 0)
    if not rounds:
        return f"nothing to do: every prompt is already recorded in {out}"
    return (f"{rounds} rounds, {tokens / rounds - 1:.2f} accepted/round, {tokens / outcome.wall:.1f} tokens/s "
            f"on {len(outcome.timings)} workers -> {out}")
