"""Goals: featurize 1M candidate rows in < 30 s and < 4 GB; cross-fit LightGBM on them in < 5 min.

    python benchmarks/bench_rerankers.py [--rounds 100000] [--workdir DIR] [--skip-train] [--n-jobs N]

CPU seconds are reported beside wall seconds: on a shared machine the wall time mostly measures
the other jobs (with --n-jobs 1, CPU seconds bound the single-core wall time of an idle machine).

Writes a synthetic run (EAGLE-3 pool shape: topk 10, depth 8, 710 candidates; 10 candidates per
round) once, then featurizes it from disk in a fresh process (wall time, peak RSS) and cross-fits
the Rows reranker with the paper's settings (400 iterations, learning rate 0.05, 63 leaves).
"""

from __future__ import annotations

from harness import write_results  # benchmarks/harness.py, beside this script
import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARD_ROUNDS = 10_000


def write_run(run_dir: Path, n_rounds: int) -> None:
    from specrank.featurize.synthetic import synthetic_rounds

    rounds_per_prompt = 100
    per_shard = SHARD_ROUNDS // rounds_per_prompt
    (run_dir / "rounds").mkdir(parents=True, exist_ok=True)
    import pyarrow.parquet as pq

    for shard in range(n_rounds // SHARD_ROUNDS):
        table, manifest = synthetic_rounds(per_shard, rounds_per_prompt, topk=10, depth=8, seed=shard)
        ids = np.char.add(f"s{shard:03d}-", table.column("prompt_id").to_numpy(zero_copy_only=False).astype(str))
        table = table.set_column(0, "prompt_id", [ids])
        pq.write_table(table, run_dir / "rounds" / f"shard-{shard:05d}.parquet")
    (run_dir / "manifest.json").write_text(json.dumps(manifest))


def featurize_stage(run_dir: Path, out: Path) -> None:
    """Child process: featurize from disk, write the table, report time and peak RSS."""
    from specrank.featurize import featurize_run, write_features

    start, cpu = time.perf_counter(), time.process_time()
    df = featurize_run(run_dir)
    mid, cpu = time.perf_counter(), time.process_time() - cpu
    write_features(df, out)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"rows": len(df), "featurize_s": mid - start, "write_s": time.perf_counter() - mid,
                      "featurize_cpu_s": cpu, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_gb": usage.ru_maxrss / 2**20}))


def train_stage(features: Path, n_jobs) -> dict:
    from specrank.featurize import read_features
    from specrank.rerankers import GBMReranker, cross_fit_table

    df = read_features(features)
    start, cpu = time.perf_counter(), time.process_time()
    out = cross_fit_table(GBMReranker("rows", n_jobs=n_jobs), df)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    y = df.label.to_numpy()
    return {"crossfit_s": elapsed, "cpu_s": cpu, "mse_rows": float(np.mean((out.predictions - y) ** 2)),
            "mse_draft": float(np.mean((df.q.to_numpy() - y) ** 2))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100_000, help="rounds (x10 candidate rows)")
    ap.add_argument("--workdir", help="keep the synthetic run here (default: a temporary directory)")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--n-jobs", type=int, default=None, help="LightGBM threads (default: all cores)")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_rerankers_"))
    run_dir, features = work / "run", work / "features.parquet"
    if args.stage == "featurize":
        featurize_stage(run_dir, features)
        return
    if not (run_dir / "manifest.json").is_file():
        start = time.perf_counter()
        write_run(run_dir, args.rounds)
        print(f"synthetic run: {args.rounds} rounds in {time.perf_counter() - start:.1f} s")
    child = subprocess.run([sys.executable, __file__, "--stage", "featurize", "--workdir", str(work)],
                           check=True, capture_output=True, text=True)
    feat = json.loads(child.stdout.strip().splitlines()[-1])
    print(f"featurize (read + features): {feat['rows']} rows in {feat['featurize_s']:.1f} s wall,"
          f" {feat['featurize_cpu_s']:.1f} s CPU (+{feat['write_s']:.1f} s write; whole process {feat['cpu_s']:.1f} s CPU),"
          f" peak RSS {feat['peak_rss_gb']:.2f} GB"
          "  [goal < 30 s, < 4 GB]")
    if not args.skip_train:
        tr = train_stage(features, args.n_jobs)
        print(f"cross-fit LightGBM rows reranker, both folds: {tr['crossfit_s']:.0f} s wall, {tr['cpu_s']:.0f} s CPU"
              "  [goal < 300 s];"
              f" held-out MSE {tr['mse_rows']:.5f} vs draft {tr['mse_draft']:.5f}")
    write_results("bench_rerankers", {"rounds": args.rounds, "featurize": feat, "goal_featurize_s": 30,
                                       "goal_peak_rss_gb": 4, "train": None if args.skip_train else tr,
                                       "goal_crossfit_s": 300})


if __name__ == "__main__":
    main()
