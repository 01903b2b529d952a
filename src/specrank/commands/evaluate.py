"""``specrank evaluate``: every selection score on a run's recorded rounds -> tables, report, figures, MLflow."""

from __future__ import annotations

from specrank.commands.args import add_tracking_arguments, at_least
from specrank.workflow import Tracking, evaluate



def add_arguments(parser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (manifest.json + rounds/*.parquet)")
    parser.add_argument("--predictions", required=True,
                        help="cross-fitted predictions (Parquet or CSV): prompt_id, task, round, cand"
                             " + one column per reranker")
    parser.add_argument("--out", required=True, help="output directory for tables, report.md and figures/")
    parser.add_argument("--budgets", type=at_least(1), nargs="+", default=None,
                        help="budgets B to evaluate (default: the sweep 2..200 up to the pool size)")
    parser.add_argument("--bootstrap", type=at_least(1), default=2000,
                        help="paired prompt-bootstrap resamples (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    add_tracking_arguments(parser, run_name="evaluate-<run dir name>")
    parser.add_argument("--models", default=None,
                        help="models/ directory of 'specrank train' (NAME-foldF): log each as an MLflow model"
                             " in its fold's nested run")
    parser.add_argument("--model-prefix", default=None,
                        help="logged models are named PREFIX-NAME-foldF (default: the run name)")


def run(args) -> int:
    tracking = None if args.no_tracking else Tracking(args.tracking_uri, args.experiment, args.run_name)
    evaluation = evaluate(args.run_dir, args.predictions, out=args.out, budgets=args.budgets,
                          bootstrap=args.bootstrap, seed=args.seed, models=args.models,
                          tracking=tracking, model_prefix=args.model_prefix)
    for key, model_uri in evaluation.logged_models.items():
        print(f"model {key}: {model_uri}")
    s = evaluation.summary
    for b in evaluation.meta["headline_budgets"]:
        root = s[(s["score"] == "root") & (s["budget"] == b)].iloc[0]
        print(f"B={b}: draft {s[(s['score'] == 'draft') & (s['budget'] == b)]['mean'].iloc[0]:.3f}, "
              f"root gain {root['gain']:+.3f} [{root['gain_low']:+.3f}, {root['gain_high']:+.3f}]")
    print(f"{evaluation.meta['rounds']} rounds, {evaluation.meta['prompts']} prompts -> {args.out}/report.md"
          + (f" (MLflow: {tracking.checked().uri})" if tracking else ""))
    return 0
