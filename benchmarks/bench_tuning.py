"""Does a 12-trial Optuna study (the demo's `--tune-trials 12`) search, or only sample at random?

    python benchmarks/bench_tuning.py [--features PATH] [--trials 12] [--studies 6] [--n-jobs 1]

Tunes the Rows reranker inside one training fold (as `specrank train` does) with each sampler, over
several studies (distinct derived seeds), and prints per sampler: the mean best inner objective after
the study (± one standard error over studies), the held-out squared error (on the other fold) of the
model refitted with the chosen settings, in how many studies and after how many trials on average the
study came within 1% of the best inner error any study found ("near-best"), the share of trials a
model proposed (not the random start-up phase), and how many studies share their first trial. Lower
is better for both errors. Without --features, a synthetic run of about
the demo's size (40 prompts x 15 rounds, topk 10) is written to a temporary directory.
"""

from __future__ import annotations

from harness import write_results  # benchmarks/harness.py, beside this script
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def samplers(n_trials: int) -> dict:
    """Sampler name -> factory(seed)."""
    import optuna

    from specrank.rerankers.tune import make_sampler

    return {
        "tpe-default (10 start-up)": lambda s: optuna.samplers.TPESampler(seed=s),
        "specrank (make_sampler)": lambda s: make_sampler(s, n_trials),
        "tpe-half-startup": lambda s: optuna.samplers.TPESampler(seed=s, n_startup_trials=n_trials // 2,
                                                                 multivariate=True),
        "qmc-sobol (scrambled)": lambda s: optuna.samplers.QMCSampler(seed=s, scramble=True,
                                                                        warn_independent_sampling=False),
        "random": lambda s: optuna.samplers.RandomSampler(seed=s),
    }


def features(path: str | None, tmp: Path):
    from specrank.featurize import featurize_run, read_features
    from specrank.featurize.synthetic import write_synthetic_run

    if path:
        return read_features(path)
    write_synthetic_run(tmp / "run", n_prompts=40, rounds_per_prompt=15, topk=10, depth=4, expand=10, seed=11)
    return featurize_run(tmp / "run")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", default=None, help="features Parquet (default: a synthetic run)")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--studies", type=int, default=6, help="studies per sampler (distinct seeds)")
    parser.add_argument("--n-jobs", type=int, default=1)
    return parser.parse_args()


def main() -> None:
    args = parse_args()

    import optuna

    from specrank.rerankers import GBMReranker
    from specrank.rerankers.base import labels_of

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        feats = features(args.features, Path(tmp))
    train, held = feats[feats["fold"] == 1], feats[feats["fold"] == 0]
    y_held = labels_of(held, None, feats.attrs["specrank"]["label_kind"])
    print(f"{len(train)} training rows, {len(held)} held-out rows; {args.trials} trials x {args.studies} studies")
    estimator = GBMReranker("rows", n_jobs=args.n_jobs, random_state=0)
    results = {}
    for name, factory in samplers(args.trials).items():
        start = time.perf_counter()
        studies = [one_study(args, estimator, train, held, y_held, name, factory, i) for i in range(args.studies)]
        results[name] = (studies, time.perf_counter() - start)
    near = 1.01 * min(v for studies, _ in results.values() for s in studies for v in s["values"])
    print_table(results, near)
    write_results("bench_tuning", {"near_best": near / 1.01, "trials": args.trials, "samplers": {
        name: {"best_inner": [min(st["values"]) for st in studies], "held_out": [st["held"] for st in studies],
               "model_led": [st["led"] for st in studies], "seconds": seconds}
        for name, (studies, seconds) in results.items()}})
    print("Goal: the chosen sampler reaches near-best settings in at least as many studies as the default TPE, with "
          "most trials model-led and no two studies sharing a first trial (± is one standard error over studies).")


def one_study(args, estimator, train, held, y_held, name: str, factory, i: int) -> dict:
    """Study ``i`` of one sampler: its trials' inner values, the refitted model's held-out error, the share of
    trials its model led, and its first trial's settings."""
    from specrank.rerankers import GBMReranker
    from specrank.rerankers.tune import study_name, study_seed, tune

    trials = []
    sampler = factory(study_seed(study_name(f"bench-{i}", 0), 0))
    params = tune(estimator, train, n_trials=args.trials, sampler=sampler,
                  callbacks=[lambda study, trial: trials.append(trial)])
    pred = GBMReranker("rows", n_jobs=args.n_jobs, random_state=0).set_params(**params).fit(train).predict(held)
    startup = getattr(sampler, "_n_startup_trials", args.trials if "random" in name or "qmc" in name else 0)
    return {"values": [t.value for t in trials], "held": float(np.mean((pred - y_held) ** 2)),
            "led": max(0, args.trials - startup) / args.trials,
            "first": tuple(sorted(trials[0].params.items()))}


def print_table(results: dict, near: float) -> None:
    """Per sampler: best inner error (± one standard error), held-out error, studies near-best and after how many
    trials, the share of trials model-led, studies sharing a first trial, seconds."""
    print(f"'near-best': within 1% of the best inner error any study found ({near / 1.01:.6f})")
    print(f"{'sampler':28s} {'best inner':>19s} {'held-out':>10s} {'near-best':>9s} {'trials to':>9s} {'model-led':>9s} "
          f"{'same 1st':>8s} {'s':>5s}")
    for name, (studies, seconds) in results.items():
        best = np.array([min(s["values"]) for s in studies])
        hits = [next((i + 1 for i, v in enumerate(np.minimum.accumulate(s["values"])) if v <= near), None)
                for s in studies]
        reached = [h for h in hits if h is not None]
        se = best.std(ddof=1) / np.sqrt(len(best)) if len(best) > 1 else float("nan")
        print(f"{name:28s} {best.mean():10.6f} ±{se:.6f} {np.mean([s['held'] for s in studies]):10.6f} "
              f"{len(reached):4d}/{len(studies):<4d} {np.mean(reached) if reached else float('nan'):9.1f} "
              f"{100 * np.mean([s['led'] for s in studies]):8.0f}% {len(studies) - len({s['first'] for s in studies}):8d} "
              f"{seconds:5.0f}")


if __name__ == "__main__":
    main()
