"""The size and load time of a format-2 Rows reranker against a pickle of the same estimator.

    python benchmarks/bench_reranker_format.py [--prompts 100] [--rounds-per-prompt 50] [--loads 20]

Fits the Rows reranker with the paper's settings (400 iterations, learning rate 0.05, 63 leaves) on a
synthetic run in the EAGLE-3 pool shape (topk 10: 10 candidate rows per round), saves it in format 2 (a
directory, and a zip) and as a pickle of the estimator (what earlier releases wrote, which specrank no
longer loads: unpickling runs code from the file), and loads each ``--loads`` times (the median is reported, in this process: the libraries are imported once, before timing). The
goal: format 2 no larger than the pickle, and loading it (which runs no code from the file) no slower
than about twice the pickle's.
"""

from __future__ import annotations

from harness import write_results  # benchmarks/harness.py, beside this script
import argparse
import pickle
import statistics
import tempfile
import time
from pathlib import Path


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def median_load_seconds(load, n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        load()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--rounds-per-prompt", type=int, default=50)
    parser.add_argument("--loads", type=int, default=20)
    parser.add_argument("--n-jobs", type=int, default=2)
    args = parser.parse_args()

    from specrank.featurize import featurize_rounds
    from specrank.featurize.synthetic import synthetic_rounds
    from specrank.rerankers import GBMReranker, load_reranker

    table, manifest = synthetic_rounds(args.prompts, args.rounds_per_prompt, topk=10, depth=8, seed=0)
    feats = featurize_rounds(table, manifest)
    start = time.perf_counter()
    est = GBMReranker("rows", n_jobs=args.n_jobs).fit(feats)
    print(f"Rows reranker: {len(feats)} training rows, {est.model_.num_trees()} trees, fitted in "
          f"{time.perf_counter() - start:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        directory, archive, pkl = est.save(tmp / "rows"), est.save(tmp / "rows.zip"), tmp / "rows.pkl"
        pkl.write_bytes(pickle.dumps(est, protocol=pickle.HIGHEST_PROTOCOL))
        load_reranker(directory), load_reranker(archive)  # imports (lightgbm, sklearn) before timing
        t_pickle = median_load_seconds(lambda: pickle.loads(pkl.read_bytes()), args.loads)
        t_dir = median_load_seconds(lambda: load_reranker(directory), args.loads)
        t_zip = median_load_seconds(lambda: load_reranker(archive), args.loads)
        sizes = {"format 2 directory": size(directory), "format 2 zip": size(archive), "pickle": size(pkl)}
    for name, n in sizes.items():
        print(f"{name:20s} {n / 1e6:7.3f} MB")
    print(f"size, directory / pickle: {sizes['format 2 directory'] / sizes['format 1 pickle']:.2f}; "
          f"zip / pickle: {sizes['format 2 zip'] / sizes['format 1 pickle']:.2f} (goal: <= 1)")
    print(f"load (median of {args.loads}): pickle {1e3 * t_pickle:.1f} ms, directory {1e3 * t_dir:.1f} ms, "
          f"zip {1e3 * t_zip:.1f} ms")
    print(f"load time, directory / pickle: {t_dir / t_pickle:.2f}; zip / pickle: {t_zip / t_pickle:.2f} (goal: <= 2)")
    write_results("bench_reranker_format", {"bytes": sizes, "load_s": {"pickle": t_pickle,
                                            "format 2 directory": t_dir, "format 2 zip": t_zip},
                                            "loads": args.loads, "goal_size_ratio": 1.0, "goal_load_ratio": 2.0})


if __name__ == "__main__":
    main()
