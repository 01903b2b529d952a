"""The GBM rerankers' ensemble size against what they recover offline: the paper's 400 trees of 63 leaves
(learning rate 0.05) beside smaller ensembles, on the same recorded rounds.

Records a sampled (T = 1) run of the embedded default with the shipped EAGLE-3 head on the bundled Spec-Bench
prompts (or reuses one: ``--run``), featurizes it, cross-fits Rows and Base at each size on prompt halves as
``specrank train`` does, and evaluates every size on the same rounds: the share of root selection's gain each
recovers, and its paired gain over the paper's size in percent of draft selection's value (prompt bootstrap).
Beside each size: its nodes, the bytes of its compiled round model (``rerankers.quickscorer``) and the kernel's
time on one round's ten rows back to back, the part of a round's rerank that grows with the ensemble.

    python benchmarks/bench_gbm_size.py --prompts 128     # about 26 minutes of recording on 2 CPU cores
    python benchmarks/bench_gbm_size.py --run DIR         # a recorded run (specrank decode --out DIR)

Prints one JSON object and writes it to ``benchmarks/results/NAME.json`` (``--name``). Goal: GBMReranker's
default size (``--online``) recovers at least the paper size's share at both budgets, for Rows and Base (its
paired gain's lower end above -0.5% of draft selection's value); exits 1 otherwise.
"""

from __future__ import annotations

from harness import best_ms, gbm_size, write_results  # benchmarks/harness.py, beside this script
import argparse
import json
import tempfile
from pathlib import Path

PAPER = "400x63@0.05"


def parse_sizes(text: str) -> dict[str, dict]:
    """``TREESxLEAVES@RATE,...`` -> {``TREESxLEAVES``: GBMReranker parameters} (a results key holds no dot)."""
    sizes = {}
    for label in text.split(","):
        try:
            params = gbm_size(label.strip())
        except argparse.ArgumentTypeError as exc:
            raise SystemExit(f"--sizes: {exc}") from None
        key = f"{params['n_estimators']}x{params['num_leaves']}"
        if key in sizes:
            raise SystemExit(f"--sizes: {key} is given twice")
        sizes[key] = params
    return sizes


def record(out: Path, prompts: int, max_new_tokens: int, threads: int) -> None:
    """A T = 1 run of SmolLM2 with the shipped EAGLE-3 head on the first ``prompts`` Spec-Bench questions."""
    import torch

    from specrank.decode import DecodeConfig, load_drafter, load_target
    from specrank.decode.prompts import read_prompts, spec_bench_path
    from specrank.decode.runs import build_manifest, record_run

    torch.set_num_threads(threads)
    target = load_target("smollm2")
    drafter = load_drafter("eagle3:default", target)
    path = spec_bench_path()
    config = DecodeConfig(temperature=1.0, max_new_tokens=max_new_tokens)
    record_run(target, drafter, read_prompts(path)[:prompts], out, config,
               build_manifest(target, drafter, config, path, 4))


def kernel_ms(model, trees, features, topk: int) -> float:
    """Milliseconds of a model's compiled trees on one round's ``topk`` rows, back to back."""
    m = model._matrix(features.iloc[:topk], model.prior_.transform(features["token"].to_numpy()[:topk]))
    return best_ms(lambda: trees.raw(m))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a recorded run directory (default: record one in a temporary directory)")
    parser.add_argument("--prompts", type=int, default=128, help="Spec-Bench prompts to record")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", default=f"{PAPER},200x31@0.1,100x15@0.1,50x7@0.2,25x7@0.3",
                        help="ensembles to compare, TREESxLEAVES@RATE (the first is the reference; default: the "
                             "paper's, then smaller ones)")
    parser.add_argument("--online", default=None, help="the size the goal checks, TREESxLEAVES (default: "
                        "GBMReranker's)")
    parser.add_argument("--budgets", default="8,59", help="comma-separated budgets B")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--name", default="gbm_size", help="results file benchmarks/results/NAME.json")
    args = parser.parse_args(argv)
    from specrank.rerankers import GBMReranker

    sizes = parse_sizes(args.sizes)
    reference = next(iter(sizes))
    default = GBMReranker()
    online = args.online or f"{default.n_estimators}x{default.num_leaves}"
    if online not in sizes:
        raise SystemExit(f"--online: {online} is not one of --sizes")

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.run) if args.run else Path(tmp) / "run"
        if not args.run:
            record(run, args.prompts, args.max_new_tokens, args.threads)
        budgets = [int(b) for b in args.budgets.split(",")]
        result = evaluate_sizes(run, sizes, reference, budgets, args.bootstrap)
    result["online"] = online
    worst = min(result["features"][f]["sizes"][online]["gain_vs_reference_pct"][b][1]
                for f in ("rows", "base") for b in result["budgets"])
    result["goals"] = {"online_gain_vs_reference_low_pct": -0.5}
    result["met"] = bool(worst >= -0.5)
    print(json.dumps(result, indent=2))
    write_results(args.name, result)
    return int(not result["met"])


def evaluate_sizes(run: Path, sizes: dict, reference: str, budgets: list[int], n_boot: int) -> dict:
    """Cross-fit Rows and Base at every size on ``run``; root shares, paired gains over ``reference``, costs."""
    from specrank import schema
    from specrank.evaluation.data import align_predictions, load_rounds
    from specrank.evaluation.offline import evaluate
    from specrank.featurize import featurize_run
    from specrank.rerankers import GBMReranker, compiled
    from specrank.rerankers.crossfit import cross_fit_table

    features = featurize_run(run)
    topk = int(features.attrs["specrank"]["topk"])
    predictions = features[schema.FEATURE_KEYS].copy()
    costs = {}
    for name in ("rows", "base"):
        for label, params in sizes.items():
            model = GBMReranker(features=name, n_jobs=1, **params)
            fit = cross_fit_table(model, features)
            predictions[f"{name} {label}"] = fit.predictions
            fitted = fit.models[min(fit.models)]
            inference = compiled(fitted, "quickscorer")
            arrays = inference.trees.arrays
            costs[(name, label)] = {"nodes": int(len(arrays.thresholds) + len(arrays.cat_trees)),
                                    "model_bytes": int(inference.model.nbytes),
                                    "kernel_ms_back_to_back": kernel_ms(fitted, inference.trees, features, topk)}
    rounds = load_rounds(run)
    ev = evaluate(rounds, align_predictions(rounds, predictions), budgets=budgets, n_boot=n_boot)
    summary = ev.summary.set_index(["score", "budget"])
    pairs = ev.comparisons.set_index(["score", "base", "budget"])
    out = {"rounds": int(rounds.n_rounds), "prompts": int(features["prompt_id"].nunique()), "reference": reference,
           "budgets": [str(b) for b in budgets], "features": {}}
    for name in ("rows", "base"):
        by_size = {}
        for label in sizes:
            col = f"{name} {label}"
            entry = dict(sizes[label], **costs[(name, label)])
            entry["root_share"] = {str(b): [float(summary.loc[(col, b), k]) for k in
                                            ("root_share", "root_share_low", "root_share_high")] for b in budgets}
            ref = f"{name} {reference}"
            entry["gain_vs_reference_pct"] = {str(b): [0.0, 0.0, 0.0] if label == reference else
                                              [float(pairs.loc[(col, ref, b), k]) for k in
                                               ("gain_pct", "gain_pct_low", "gain_pct_high")] for b in budgets}
            by_size[label] = entry
        out["features"][name] = {"sizes": by_size}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
