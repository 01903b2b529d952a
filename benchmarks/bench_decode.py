"""Benchmark the recording decoder: host work outside target and drafter passes, rounds/s, tokens per
target pass, the time split (drafting / verification pass / recording / bookkeeping) and peak resident memory.

    python benchmarks/bench_decode.py                      # SmolLM2-135M, early-exit drafter, 8 prompts
    python benchmarks/bench_decode.py --prompts 48 --max-new-tokens 256   # the memory check
    python benchmarks/bench_decode.py --target gemma3-270m --drafter early-exit:6 --temperature 1 \
        --name bench_decode_gemma3-270m                    # a 262k vocabulary: memory, disk and time a round

``recording`` is the round records (full-vocabulary rows of every scored prefix, every pool edge's
probability, retained-row diagnostics); ``bookkeeping`` is the decoder's own host work besides (pool
ranking, the scored set and mask, verification, commits, row caches). Goal: bookkeeping at
most 5 ms per round at the default pool. Prints one JSON object; exits 1 when it is missed.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from harness import write_results  # benchmarks/harness.py, beside this script


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="early-exit:8")
    parser.add_argument("--prompts", type=int, default=8, help="first N prompts of the bundled set")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", type=int, default=59, help="B, the verified tree size")
    parser.add_argument("--max-bookkeeping-ms", type=float, default=5.0)
    parser.add_argument("--name", default="bench_decode", help="the results file's name")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    import torch

    from specrank.decode import DecodeConfig, load_drafter, load_target
    from specrank.decode.prompts import default_prompts_path, read_prompts
    from specrank.decode.runs import build_manifest, record_run

    torch.set_num_threads(args.threads)
    target = load_target(args.target, "cpu", "float32")
    drafter = load_drafter(args.drafter, target)
    config = DecodeConfig(budget=args.budget, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    prompts = read_prompts(default_prompts_path(), limit=args.prompts)
    with tempfile.TemporaryDirectory() as out:
        manifest = build_manifest(target, drafter, config, default_prompts_path(), 1)
        wall = time.perf_counter()
        timer = record_run(target, drafter, prompts, out, config, manifest, shard_size=1)
        wall = time.perf_counter() - wall
        disk = sum(f.stat().st_size for f in Path(out).rglob("*.parquet"))
    result = figures(args, target, config, len(prompts), timer, wall, disk)
    print(json.dumps(result, indent=2))
    write_results(args.name, result)
    return int(result["ms_per_round"]["bookkeeping"] > args.max_bookkeeping_ms)


def figures(args, target, config, prompts: int, timer, wall: float, disk: int) -> dict:
    """The recorded run's figures: its rate, time split, peak memory and disk, against the bookkeeping goal."""
    return {
        "target": args.target, "drafter": args.drafter, "vocab_size": target.vocab_size, "budget": args.budget,
        "extra": config.extra, "temperature": args.temperature,
        "prompts": prompts,
        "rounds": timer.rounds,
        "tokens": timer.tokens,
        "rounds_per_s": timer.rounds / timer.total,
        "tokens_per_s": timer.tokens / timer.total,
        "tokens_per_target_pass": timer.tokens / timer.rounds,
        "mean_accepted": timer.tokens / timer.rounds - 1,
        "seconds": {"prefill": timer.prefill, "draft": timer.draft, "target": timer.target,
                    "recording": timer.measure, "bookkeeping": timer.bookkeeping, "total": timer.total,
                    "wall_with_writes": wall},
        "ms_per_round": {k: 1000 * getattr(timer, k) / timer.rounds for k in ("draft", "target", "measure")}
        | {"bookkeeping": 1000 * timer.bookkeeping / timer.rounds},
        "bookkeeping_fraction": timer.bookkeeping / timer.total,
        "goal_bookkeeping_ms_per_round": args.max_bookkeeping_ms,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "disk_bytes_per_round": disk / timer.rounds,
        "ms_per_round_total": 1000 * timer.total / timer.rounds,
    }


if __name__ == "__main__":
    sys.exit(main())
