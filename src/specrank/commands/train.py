"""``specrank train FEATURES``: cross-fit named rerankers, write predictions.parquet and the models.

``OUT_DIR/models/NAME-foldF`` (a format-2 reranker directory) is the model that predicted fold F (it was
trained on the other folds). Every reranker is fitted before anything is written: a failure leaves no output.
With ``--tracking-uri`` the run is logged to MLflow (``specrank.tracking.training``): parameters,
per-fold metrics and models, Optuna studies, and predictions.parquet; ``--register NAME`` then refits the
reranker with the lowest fold-mean held-out MSE on every prompt and registers it in the Model Registry under
an alias (``models:/NAME@champion``).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import pandas as pd

from specrank.commands.args import at_least, experiment_name
from specrank.featurize import features_meta, read_features, write_features
from specrank.featurize.features import META_KEY
from specrank.featurize.sets import input_columns, resolve_features
from specrank.featurize.storage import check_same_rounds, rounds_of
from specrank.outputs import check_distinct, check_output_dir, staged
from specrank.rerankers import GBMReranker, IsotonicFirstFactor, PerDepthCalibration, cross_fit
from specrank.schema import FEATURE_KEYS, require_columns

HELP = "Cross-fit rerankers on a features table; write predictions.parquet (keys + one column per reranker) and models."
NAMES = ("isotonic", "base", "rows", "per_depth")


def make_reranker(name: str, args):
    """The reranker called ``name`` with the command line's boosting settings."""
    if name == "isotonic":
        return IsotonicFirstFactor()
    if name == "per_depth":
        return PerDepthCalibration()
    return GBMReranker(name, backend=args.backend, n_estimators=args.n_estimators, learning_rate=args.learning_rate,
                       num_leaves=args.num_leaves, monotone_draft=args.monotone_draft,
                       boost_from_draft=args.boost_from_draft, n_jobs=args.n_jobs,
                       random_state=args.seed)


def add_arguments(parser) -> None:
    parser.add_argument("features", help="features Parquet file written by `specrank featurize`")
    parser.add_argument("--rerankers", default="isotonic,base,rows",
                        help=f"comma-separated names among {', '.join(NAMES)} (default: isotonic,base,rows)")
    parser.add_argument("--out-dir", help="output directory (default: next to FEATURES, in rerankers/)")
    parser.add_argument("--edges", help="edges table (`featurize --edges-out`), needed by per_depth")
    parser.add_argument("--backend", choices=("lightgbm", "sklearn"), default="lightgbm")
    gbm = GBMReranker()
    parser.add_argument("--n-estimators", type=int, default=gbm.n_estimators,
                        help=f"boosting iterations of Base and Rows (default {gbm.n_estimators}; the paper's: 400)")
    parser.add_argument("--learning-rate", type=float, default=gbm.learning_rate,
                        help=f"(default {gbm.learning_rate}; the paper's: 0.05)")
    parser.add_argument("--num-leaves", type=int, default=gbm.num_leaves,
                        help=f"the most leaves a tree has (default {gbm.num_leaves}; the paper's: 63)")
    parser.add_argument("--monotone-draft", action="store_true", help="predictions non-decreasing in q")
    parser.add_argument("--boost-from-draft", action="store_true",
                        help="LightGBM starts from logit(q) and learns a correction (robust on small runs)")
    parser.add_argument("--tune-trials", type=at_least(0), default=0,
                        help="Optuna trials inside each training half (0: none)")
    parser.add_argument("--n-jobs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI, or 'default' for MLflow's default store (default: log nothing)")
    parser.add_argument("--experiment", type=experiment_name, default="specrank-train",
                        help="MLflow experiment name (default specrank-train)")
    parser.add_argument("--run-name", default=None, help="MLflow parent run name")
    parser.add_argument("--model-prefix", default=None,
                        help="models and Optuna studies are named PREFIX-RERANKER-foldF (default: the run name, "
                             "else the features' folder name)")
    parser.add_argument("--register", default=None, metavar="NAME",
                        help="refit the chosen reranker on every prompt and register it as a new version of NAME "
                             "in the MLflow Model Registry (needs --tracking-uri)")
    parser.add_argument("--register-reranker", default=None,
                        help="the reranker --register registers (default: the lowest fold-mean held-out MSE)")
    parser.add_argument("--alias", default="champion", help="alias of the registered version (default champion)")


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        raise ValueError(f"unknown reranker {unknown[0] if unknown else text!r} (choose from {', '.join(NAMES)})")
    return names


def model_prefix(args) -> str:
    """The ``PREFIX`` of ``PREFIX-RERANKER-foldF`` model and study names."""
    return args.model_prefix or args.run_name or Path(args.features).resolve().parent.name


def _fit(name, table, args, tracker):
    """Cross-fit the reranker ``name`` on ``table`` (its trials tracked when tuned)."""
    trials = args.tune_trials if name in ("base", "rows") else 0
    hook = tracker.tune_callbacks(name) if tracker and trials else None
    return cross_fit(make_reranker(name, args), table, tune_trials=trials, tune_seed=args.seed, tune_callbacks=hook,
                     tune_study=f"{model_prefix(args)}-{name}")


def _refit(name, feats, edges, args, callbacks):
    """The registered reranker fitted on every prompt (tuned first on all of them, study ``<prefix>-<name>-all``):
    (model, the table it was fitted on, tuned parameters)."""
    from specrank.rerankers.tune import tune

    table = edges if name == "per_depth" else feats
    model, tuned = make_reranker(name, args), {}
    if args.tune_trials and name in ("base", "rows"):
        tuned = tune(model, table, n_trials=args.tune_trials, seed=args.seed, callbacks=callbacks,
                     study_name=f"{model_prefix(args)}-{name}-all")
        model.set_params(**tuned)
    return model.fit(table), table, tuned


def save_models(fits: dict, models_dir: Path) -> None:
    """Each fold's model as ``models_dir/NAME-foldF`` (format 2)."""
    for name, fit in fits.items():
        for fold, model in fit.models.items():
            model.save(models_dir / f"{name}-fold{fold}")


def check_inputs(names, feats, edges) -> None:
    """Refuse a features (or edges) table that lacks a column some reranker or the predictions table reads."""
    needed = FEATURE_KEYS + ["prompt_index", "fold", "q"]
    for name in (n for n in names if n in ("base", "rows")):
        needed += input_columns(resolve_features(name))
    require_columns(feats.columns, list(dict.fromkeys(needed)), "features")
    if edges is not None:
        require_columns(edges.columns, ["prompt_id", "round", "node", "depth", "fold", "q_edge"], "edges")


def _tracker(args):
    """None without ``--tracking-uri``, else a tracker whose store was checked reachable (before any work)."""
    if args.tracking_uri is None:
        if args.register:
            raise ValueError("--register needs --tracking-uri (the registry lives in the tracking store)")
        return None
    from specrank.tracking.training import TrainingTracker
    from specrank.tracking.uri import optional_uri

    return TrainingTracker(optional_uri(args.tracking_uri), args.experiment, args.run_name, model_prefix(args))


def _cross_fit_all(names, feats, edges, args, tracker):
    """{name: CrossFit}, the predictions table (keys, label, draft, one column per name) and the edge
    predictions table (None without per_depth)."""
    keys = FEATURE_KEYS + ["prompt_index", "fold"] + (["label"] if "label" in feats else [])
    preds = feats[keys].assign(draft=feats["q"].to_numpy())
    fits, edge_preds = {}, None
    for name in (n for n in names if n != "per_depth"):
        fits[name] = _fit(name, feats, args, tracker)
        preds[name] = fits[name].predictions
        print(f"{name}: cross-fitted on {len(feats)} rows")
    if edges is not None:
        fits["per_depth"] = _fit("per_depth", edges, args, tracker)
        edge_preds = edges[["prompt_id", "round", "node", "depth", "fold"]].copy()
        edge_preds["per_depth"] = fits["per_depth"].predictions
        first = edge_preds[edge_preds.depth == 1].set_index(["prompt_id", "round", "node"])["per_depth"]
        at = pd.MultiIndex.from_arrays([preds.prompt_id, preds["round"], preds.cand])
        preds["per_depth"] = first.reindex(at).to_numpy()
    return fits, preds, edge_preds


def run(args) -> int:
    names = _names(args.rerankers)
    if args.register_reranker and args.register_reranker not in names:
        raise ValueError(f"--register-reranker {args.register_reranker}: not among --rerankers {args.rerankers}")
    if "per_depth" in names and not args.edges:
        raise ValueError("per_depth needs --edges (write it with `specrank featurize --edges-out`)")
    for name in names:
        make_reranker(name, args).check_params()  # hyper-parameters refused before any work
    out_dir = check_output_dir(args.out_dir or Path(args.features).parent / "rerankers", "--out-dir")
    check_distinct({"--out-dir": out_dir, "--out-dir predictions": out_dir / "predictions.parquet"},
                   {"features": args.features, "--edges": args.edges})
    tracker = _tracker(args)  # an unreachable store fails here, before any output
    feats = read_features(args.features)
    edges = read_features(args.edges) if "per_depth" in names else None
    check_inputs(names, feats, edges)
    if edges is not None:
        check_same_rounds(f"--edges {args.edges}", rounds_of(edges), rounds_of(feats),
                          f"features {args.features} from rounds")
    tracked = tracker.run(_params(args, feats, names), Path(args.features)) if tracker else nullcontext()
    with tracked, staged(out_dir, "--out-dir") as stage:
        fits, preds, edge_preds = _cross_fit_all(names, feats, edges, args, tracker)
        save_models(fits, stage / "models")
        preds.attrs = {META_KEY: features_meta(feats)}  # its rounds digest: evaluate checks it against the run
        write_features(preds, stage / "predictions.parquet")
        if edge_preds is not None:
            edge_preds.attrs = {META_KEY: features_meta(edges)}
            write_features(edge_preds, stage / "edge_predictions.parquet")
        if tracker:
            for key, uri in tracker.log_training(fits, preds, feats, stage / "predictions.parquet").items():
                print(f"model {key}: {uri}")
            if args.register:
                refit = lambda name, callbacks: _refit(name, feats, edges, args, callbacks)  # noqa: E731
                version = tracker.register(args.register, refit, args.alias, args.register_reranker)
                print(f"registered models:/{args.register}@{args.alias} (version {version.version}: "
                      f"{version.tags.get('specrank.reranker')} refitted on all "
                      f"{version.tags.get('specrank.training_prompts')} prompts)")
    print(f"{out_dir / 'predictions.parquet'}: {len(preds)} rows, columns {', '.join(['draft'] + names)}")
    return 0


def _params(args, feats, names) -> dict:
    from specrank.tracking.training import train_params

    settings = {k: getattr(args, k) for k in ("backend", "n_estimators", "learning_rate", "num_leaves",
                                             "monotone_draft", "boost_from_draft", "tune_trials", "n_jobs", "seed")}
    return train_params(Path(args.features), feats, names, settings, Path(args.edges) if args.edges else None)
