"""Selection engine benchmark: every rule at B = 8 and 59 on synthetic rounds of EAGLE-3's pool shape.

Goals: >= 20,000 rounds/s per (rule, budget) with values and expected sizes on
2 cores, peak memory < 3 GB for 100,000 rounds (M = 710), and a 2,000-resample prompt
bootstrap over 650 prompts in < 5 s. Pools are generated chunk by chunk (not timed).

    python benchmarks/bench_selection.py [--rounds 100000] [--chunk 10000] [--law sampling]
"""

from __future__ import annotations

from harness import write_results  # benchmarks/harness.py, beside this script
import argparse
import os
import resource
import time
from contextlib import contextmanager

import numpy as np

from specrank.selection import (
    SCORES,
    PromptBootstrap,
    draw_values,
    equal_mean,
    fixed_values,
    pearl_curves,
    score_of,
    score_table,
    synthetic_pools,
)
from specrank.selection.draws import DraftGroups

BUDGETS = (8, 59)
GOAL_RATE = 20_000
GOAL_MEMORY_GB = 3.0
GOAL_BOOTSTRAP_S = 5.0


def score_inputs(rounds, rng) -> dict:
    """Synthetic inputs for the rules that need them (predictions, calibrated factors, rows)."""
    pool = rounds.pool
    p1 = pool.p_edge[:, : pool.n_first].astype(np.float64)
    return {
        "first_factor": np.clip(p1 + 0.1 * rng.standard_normal(p1.shape), 0, 1),
        "iso_factor": np.sqrt(pool.q_edge[:, : pool.n_first].astype(np.float64)),
        "edge_factor": np.sqrt(pool.q_edge.astype(np.float64)),
        "row_logp": rounds.rows["cache_logp"],
        "weight": 0.5,
    }


@contextmanager
def timed(timings: dict, name: str):
    """Add (wall, CPU) seconds of the block to ``timings[name]``."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    w, c = timings.get(name, (0.0, 0.0))
    timings[name] = (w + time.perf_counter() - wall, c + time.process_time() - cpu)


def evaluate_chunk(rounds, law, max_budget, rng, timings) -> tuple[dict, tuple]:
    """Per-round values and sizes of every rule at BUDGETS; adds seconds per stage to ``timings``."""
    pool = rounds.pool
    inputs = score_inputs(rounds, rng)
    out = {}
    with timed(timings, "shared (paths, ancestors)"):
        pool.path_prob(law), pool.first_ancestor
    for name in SCORES:
        with timed(timings, name):
            out[name] = fixed_values(pool, score_of(pool, name, law, **inputs), BUDGETS, law)
    with timed(timings, "draw rules (3) + curves"):
        groups = DraftGroups.of(pool)
        out.update(draw_values(pool, BUDGETS, law, groups))
        curves = pearl_curves(pool, law, max_budget, groups)
    return out, tuple(c.astype(np.float32) for c in curves)


def evaluate_all(args, timings: dict):
    """Generate and evaluate the rounds chunk by chunk; returns per-round values and prompt ids."""
    rng = np.random.default_rng(0)
    parts, curves, prompts, gen_s = [], [], [], 0.0
    for k, start in enumerate(range(0, args.rounds, args.chunk)):
        n = min(args.chunk, args.rounds - start)
        t0 = time.perf_counter()
        rounds = synthetic_pools(n, seed=k, n_prompts=max(1, args.prompts * n // args.rounds))
        gen_s += time.perf_counter() - t0
        prompts.append(rounds.pool.prompt_id + sum(len(np.unique(x)) for x in prompts))
        values, curve = evaluate_chunk(rounds, args.law, args.max_budget, rng, timings)
        parts.append(values)
        curves.append(curve)
    with timed(timings, "equal mean (2 budgets)"):
        values = {r: np.concatenate([p[r][0] for p in parts]) for r in parts[0]}
        sizes = {r: np.concatenate([p[r][1] for p in parts]) for r in parts[0]}
        pv, ps = (np.concatenate([c[i] for c in curves]).astype(np.float64) for i in (0, 1))
        matched = [equal_mean(pv, ps, sizes["root_draw"][:, j].mean()) for j in range(len(BUDGETS))]
        values["pearl_equal_mean"] = np.column_stack([em.values for em in matched])
    for b, em in zip(BUDGETS, matched):
        print(f"equal-mean PEARL-style at B={b}: pre-draw budget {em.budget:.2f}, mean size {em.sizes.mean():.2f}")
    print(f"\n{args.rounds:,} rounds x M={rounds.pool.shape[1]}, law={args.law}, budgets {BUDGETS} "
          f"(generation {gen_s:.1f} s, not timed)")
    return values, np.concatenate(prompts)


def print_rates(timings: dict, n_rounds: int) -> None:
    """Per-stage and overall rounds per second per (rule, budget), wall-clock and CPU time."""
    n_pairs = len(SCORES) + 3 + 1  # fixed rules, three draw rules, equal mean
    per_stage = {"draw rules (3) + curves": 3}
    print(f"{'stage':<28}{'wall s':>8}{'CPU s':>8}{'rounds/s per (rule, budget): wall':>36}{'CPU':>9}")
    for name, (w, c) in timings.items():
        k = n_rounds * len(BUDGETS) * per_stage.get(name, 1)
        print(f"{name:<28}{w:>8.2f}{c:>8.2f}{k / w:>36,.0f}{k / c:>9,.0f}")
    for i, label in enumerate(("wall", "CPU")):
        s = sum(t[i] for t in timings.values())
        rate = n_rounds * len(BUDGETS) * n_pairs / s
        print(f"all {n_pairs} rules x {len(BUDGETS)} budgets, {label}: {s:.2f} s -> {rate:,.0f} rounds/s per "
              f"(rule, budget)   goal >= {GOAL_RATE:,}  {'OK' if rate >= GOAL_RATE else 'MISSED'}")
    print(f"machine load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other users included)")


def bootstrap_report(values: dict, prompt_id: np.ndarray, n_resamples: int) -> None:
    """Time the paired prompt bootstrap of every (rule, budget) and print its table."""
    timings = {}
    with timed(timings, "bootstrap"):
        boot = PromptBootstrap(prompt_id, n_resamples=n_resamples, seed=0)
        table = score_table(boot, values, BUDGETS)
    wall, cpu = timings["bootstrap"]
    print(f"bootstrap: {n_resamples} resamples x {len(boot.prompts)} prompts, {len(table)} (rule, budget) rows, "
          f"5 statistics each: {wall:.2f} s wall, {cpu:.2f} s CPU   goal < {GOAL_BOOTSTRAP_S} s  "
          f"{'OK' if wall < GOAL_BOOTSTRAP_S else 'MISSED'}")
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    verdict = "OK" if peak_gb < GOAL_MEMORY_GB else "MISSED"
    print(f"peak memory: {peak_gb:.2f} GB   goal < {GOAL_MEMORY_GB} GB  {verdict}")
    cols = ["score", "budget", "mean", "gain", "gain_low", "gain_high", "gain_pct"]
    print("\n" + table[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=2_000)
    ap.add_argument("--law", default="sampling", choices=["sampling", "greedy"])
    ap.add_argument("--prompts", type=int, default=650)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--max-budget", type=int, default=300, help="largest PEARL-style pre-draw budget")
    args = ap.parse_args(argv)
    timings = {}
    values, prompt_id = evaluate_all(args, timings)
    print_rates(timings, args.rounds)
    bootstrap_report(values, prompt_id, args.resamples)
    write_results("bench_selection", {"rounds": args.rounds, "law": args.law, "budgets": list(BUDGETS),
                                      "seconds": {k: {"wall": w, "cpu": c} for k, (w, c) in timings.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
