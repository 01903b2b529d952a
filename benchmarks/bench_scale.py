"""Benchmark recording on Ray workers: rounds/s of 2 workers x 1 thread against 1 process x 2 threads on the
same prompts, and Ray's own overhead per shard. The full run (the lead's, on a quiet 2-core machine, ~30 min):

    python benchmarks/bench_scale.py --target smollm2 --drafter early-exit:8 --prompts 14 --max-new-tokens 64

Measured here with ``--prompts 10 --max-new-tokens 32`` (7 minutes quiet): ratio 1.54 [1.46, 1.62], Ray
overhead 0.015% of shard time. A short check that it works: ``--prompts 4 --max-new-tokens 8``.

Both configurations record the first ``--prompts`` bundled prompts at the default pool (710 candidates,
B = 59, M = 160), one prompt per shard, into fresh run directories: first one process with 2 torch threads
(no Ray running), then ``--workers`` Ray workers with 1 thread each (a local Ray, not timed while starting;
model loading is not timed in either). Reported:

- ``ratio``: rounds per wall second, workers / one process (goal >= 1.3). Its 95% interval is a paired
  prompt bootstrap of the per-prompt estimate (each configuration's rounds over its summed per-prompt
  seconds, divided by its concurrency), scaled by the measured packing (per-prompt seconds / concurrency
  over wall seconds: the idle tail and Ray's gaps), which the bootstrap holds fixed.
- ``ray_overhead_share``: per shard, (driver submit -> result back) minus the seconds inside the worker,
  summed over shards, over the summed round trips (goal < 2%); split into scheduling (submit -> start) and
  result transfer (end -> back).
- ``ms_per_round``: where each configuration's time goes (drafting, target passes, recording, bookkeeping).

Prints one JSON object; exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import write_results  # benchmarks/harness.py, beside this script

SPANS = ("draft", "root", "target", "measure", "bookkeeping", "total")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="early-exit:8")
    parser.add_argument("--prompts", type=int, default=14, help="first N prompts of the bundled set")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="threads of the one process (workers: threads / workers)")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--goal-ratio", type=float, default=1.3)
    parser.add_argument("--goal-overhead", type=float, default=0.02)
    args = parser.parse_args(argv)

    from specrank.decode import DecodeConfig
    from specrank.decode.prompts import default_prompts_path, read_prompts

    config = DecodeConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    path = default_prompts_path()
    prompts = read_prompts(path, limit=args.prompts)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        one = one_process(args, config, prompts, Path(tmp) / "one")
        many = on_workers(args, config, prompts, path, Path(tmp) / "many")
    result = report(args, one, many)
    print(json.dumps(result, indent=2))
    write_results("bench_scale", result)
    return int(result["ratio"]["point"] < args.goal_ratio or result["ray_overhead_share"] >= args.goal_overhead)


def one_process(args, config, prompts, out: Path) -> dict:
    """Record every prompt (one per shard) in this process with ``args.threads`` torch threads."""
    import torch

    from specrank.decode import load_drafter, load_target
    from specrank.decode.engine.timer import Timer
    from specrank.decode.runs.recorder import recorder_work
    from specrank.decode.runs.shards import decode_shard, write_shard

    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    drafter = load_drafter(args.drafter, target)
    timer = Timer()
    decode_one, tables = recorder_work(target, drafter, prompts, config, timer=timer)
    out.mkdir(parents=True)
    seconds, rounds = [], []
    wall = time.perf_counter()
    for i in range(len(prompts)):
        start, before = time.perf_counter(), timer.rounds
        write_shard(out, [i], decode_shard([i], decode_one, tables))
        seconds.append(time.perf_counter() - start)
        rounds.append(timer.rounds - before)
    wall = time.perf_counter() - wall
    return {"seconds": np.array(seconds), "rounds": np.array(rounds), "wall": wall, "concurrency": 1,
            "spans": timer.split()}


def on_workers(args, config, prompts, prompts_path, out: Path) -> dict:
    """Record every prompt (one per shard) on ``args.workers`` local Ray workers, each with the threads split."""
    from specrank.decode.loading.model_spec import ModelSpec
    from specrank.decode.runs.workers import RunSpec, decode_on_workers
    from specrank.scale import Workers

    threads = max(1, args.threads // args.workers)
    outcome = decode_on_workers(Workers(args.workers, threads=threads), ModelSpec(args.target, args.drafter),
                                prompts, prompts_path, [RunSpec(str(out), config)], shard_size=1)
    by_prompt = sorted(outcome.done, key=lambda d: d["shard"].payload[1][0])
    totals = outcome.totals()
    return {"seconds": np.array([d["seconds"] for d in by_prompt]),
            "rounds": np.array([d["stats"]["rounds"] for d in by_prompt]), "wall": outcome.wall,
            "concurrency": args.workers, "spans": {k: totals[f"{k}_s"] for k in SPANS},
            "round_trip": np.array([d["round_trip"] for d in by_prompt]),
            "scheduling": sum(t.scheduling for t in outcome.timings), "transfer": sum(t.transfer for t in outcome.timings),
            "load_seconds": [t.load_seconds for t in outcome.timings]}


def rate(run: dict, weights=None):
    """Rounds per second of per-prompt time times the concurrency (over bootstrap ``weights`` (R, P) if given)."""
    r, s = run["rounds"], run["seconds"]
    if weights is not None:
        r, s = weights @ r, weights @ s
    else:
        r, s = r.sum(), s.sum()
    return r / (s / run["concurrency"])


def report(args, one: dict, many: dict) -> dict:
    from specrank.selection.stats import PromptBootstrap

    packing = {name: (run["seconds"].sum() / run["concurrency"]) / run["wall"] for name, run in
               (("one", one), ("many", many))}
    wall_rate = {name: run["rounds"].sum() / run["wall"] for name, run in (("one", one), ("many", many))}
    point = wall_rate["many"] / wall_rate["one"]
    weights = PromptBootstrap(np.arange(len(one["rounds"])), args.bootstrap).weights
    scale = packing["many"] / packing["one"]
    resampled = rate(many, weights) / rate(one, weights) * scale
    low, high = np.quantile(resampled, [0.025, 0.975])
    overhead = many["round_trip"] - many["seconds"]
    return {
        "prompts": len(one["rounds"]),
        "max_new_tokens": args.max_new_tokens,
        "rounds": {"one_process": int(one["rounds"].sum()), "workers": int(many["rounds"].sum())},
        "rounds_per_s": {"one_process": wall_rate["one"], "workers": wall_rate["many"]},
        "ratio": {"point": point, "low": float(low), "high": float(high), "per_prompt_estimate": rate(many) / rate(one),
                  "packing": packing},
        "goal_ratio": args.goal_ratio,
        "ray_overhead_share": float(overhead.sum() / many["round_trip"].sum()),
        "ray_overhead_ms_per_shard": {"total": 1000 * float(overhead.mean()),
                                      "scheduling": 1000 * many["scheduling"] / len(overhead),
                                      "transfer": 1000 * many["transfer"] / len(overhead)},
        "shard_seconds_mean": float(many["seconds"].mean()),
        "goal_overhead_share": args.goal_overhead,
        "ms_per_round": {name: {k: 1000 * run["spans"][k] / max(run["rounds"].sum(), 1) for k in SPANS}
                         for name, run in (("one_process", one), ("workers", many))},
        "worker_load_seconds": many["load_seconds"],
        "threads": {"one_process": args.threads, "per_worker": max(1, args.threads // args.workers),
                    "workers": args.workers},
    }


if __name__ == "__main__":
    sys.exit(main())
