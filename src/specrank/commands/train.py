"""``specrank train FEATURES``: cross-fit named rerankers, write predictions.parquet and the models.

``OUT_DIR/models/NAME-foldF.pkl`` is the model that predicted fold F (it was trained on the other folds).
"""

from __future__ import annotations

from pathlib import Path

HELP = "Cross-fit rerankers on a features table; write predictions.parquet (keys + one column per reranker) and models."
NAMES = ("isotonic", "base", "rows", "per_depth")


def make_reranker(name: str, args):
    """The reranker called ``name`` with the command line's boosting settings."""
    from specrank.rerankers import GBMReranker, IsotonicFirstFactor, PerDepthCalibration

    if name == "isotonic":
        return IsotonicFirstFactor()
    if name == "per_depth":
        return PerDepthCalibration()
    return GBMReranker(name, backend=args.backend, n_estimators=args.n_estimators, learning_rate=args.learning_rate,
                       num_leaves=args.num_leaves, monotone_draft=args.monotone_draft, n_jobs=args.n_jobs,
                       random_state=args.seed)


def add_arguments(parser) -> None:
    parser.add_argument("features", help="features Parquet file written by `specrank featurize`")
    parser.add_argument("--rerankers", default="isotonic,base,rows",
                        help=f"comma-separated names among {', '.join(NAMES)} (default: isotonic,base,rows)")
    parser.add_argument("--out-dir", help="output directory (default: next to FEATURES, in rerankers/)")
    parser.add_argument("--edges", help="edges table (`featurize --edges-out`), needed by per_depth")
    parser.add_argument("--backend", choices=("lightgbm", "sklearn"), default="lightgbm")
    parser.add_argument("--n-estimators", type=int, default=400)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--num-leaves", type=int, default=63)
    parser.add_argument("--monotone-draft", action="store_true", help="predictions non-decreasing in q")
    parser.add_argument("--tune-trials", type=int, default=0, help="Optuna trials inside each training half (0: none)")
    parser.add_argument("--n-jobs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        raise ValueError(f"unknown reranker {unknown[0] if unknown else text!r} (choose from {', '.join(NAMES)})")
    return names


def _fit_and_save(name, est, table, args, models_dir):
    from specrank.rerankers import cross_fit

    trials = args.tune_trials if name in ("base", "rows") else 0
    out = cross_fit(est, table, tune_trials=trials, tune_seed=args.seed)
    for fold, model in out.models.items():
        model.save(models_dir / f"{name}-fold{fold}.pkl")
    return out.predictions


def run(args) -> int:
    import pandas as pd
    import pyarrow as pa

    from specrank.featurize import read_features
    from specrank.atomic import write_parquet_atomic
    from specrank.schema import FEATURE_KEYS

    names = _names(args.rerankers)
    feats = read_features(args.features)
    out_dir = Path(args.out_dir or Path(args.features).parent / "rerankers")
    models_dir = out_dir / "models"
    keys = FEATURE_KEYS + ["prompt_index", "fold"] + (["label"] if "label" in feats else [])
    preds = feats[keys].assign(draft=feats["q"].to_numpy())
    for name in (n for n in names if n != "per_depth"):
        preds[name] = _fit_and_save(name, make_reranker(name, args), feats, args, models_dir)
        print(f"{name}: cross-fitted on {len(feats)} rows")
    if "per_depth" in names:
        if not args.edges:
            raise ValueError("per_depth needs --edges (write it with `specrank featurize --edges-out`)")
        edges = read_features(args.edges)
        edge_preds = edges[["prompt_id", "round", "node", "depth", "fold"]].copy()
        edge_preds["per_depth"] = _fit_and_save("per_depth", make_reranker("per_depth", args), edges, args, models_dir)
        first = edge_preds[edge_preds.depth == 1].set_index(["prompt_id", "round", "node"])["per_depth"]
        at = pd.MultiIndex.from_arrays([preds.prompt_id, preds["round"], preds.cand])
        preds["per_depth"] = first.reindex(at).to_numpy()
        write_parquet_atomic(pa.Table.from_pandas(edge_preds, preserve_index=False), out_dir / "edge_predictions.parquet")
    write_parquet_atomic(pa.Table.from_pandas(preds, preserve_index=False), out_dir / "predictions.parquet")
    print(f"{out_dir / 'predictions.parquet'}: {len(preds)} rows, columns {', '.join(['draft'] + names)}")
    return 0
