"""``specrank train FEATURES``: cross-fit named rerankers, write predictions.parquet and the models.

``OUT_DIR/models/NAME-foldF`` (a format-2 reranker directory) is the model that predicted fold F (it was
trained on the other folds). Every reranker is fitted before anything is written: a failure leaves no output.
With ``--tracking-uri`` the run is logged to MLflow (``specrank.tracking.training``): parameters,
per-fold metrics and models, Optuna studies, and predictions.parquet; ``--register NAME --register-reranker R``
then refits R on every prompt and registers it in the Model Registry under an alias (``models:/NAME@champion``).
Training alone does not choose a champion: that is the study's rule (the cross-fitted gain over draft), and
``specrank study`` registers its own.
"""

from __future__ import annotations

from pathlib import Path

from specrank.commands.args import at_least, experiment_name
from specrank.rerankers import GBMReranker
from specrank.rerankers.registry import KINDS
from specrank.workflow import Features, Tracking, cross_fit
from specrank.workflow.rerankers import GBM_SETTINGS



def add_arguments(parser) -> None:
    parser.add_argument("features", help="features Parquet file written by `specrank featurize`")
    parser.add_argument("--rerankers", default="isotonic,base,rows",
                        help=f"comma-separated reranker kinds among {', '.join(KINDS)} (default: isotonic,base,rows)")
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
                        help="refit --register-reranker on every prompt and register it as a new version of NAME "
                             "in the MLflow Model Registry (needs --tracking-uri)")
    parser.add_argument("--register-reranker", default=None,
                        help="the reranker --register registers (required with it: the champion is chosen by its "
                             "gain over draft, which `specrank study` measures and registers)")
    parser.add_argument("--alias", default="champion", help="alias of the registered version (default champion)")


def run(args) -> int:
    gbm = {k: getattr(args, k) for k in GBM_SETTINGS}
    features = Features(Path(args.features), Path(args.edges) if args.edges else None)
    tracking = Tracking.opt_in(args.tracking_uri, args.experiment, args.run_name)
    fitted = cross_fit(features, rerankers=args.rerankers, out=args.out_dir, tune_trials=args.tune_trials,
                       seed=args.seed, n_jobs=args.n_jobs, gbm=gbm, tracking=tracking, model_prefix=args.model_prefix,
                       register=args.register, register_reranker=args.register_reranker, alias=args.alias)
    for key, uri in fitted.logged.items():
        print(f"model {key}: {uri}")
    version = fitted.registered
    if version is not None:
        print(f"registered models:/{args.register}@{args.alias} (version {version.version}: "
              f"{version.tags.get('specrank.reranker')} refitted on all "
              f"{version.tags.get('specrank.training_prompts')} prompts)")
    print(f"{fitted.predictions_path}: {fitted.rows} rows, columns {', '.join(['draft', *fitted.names])}")
    return 0
