"""``specrank study``: ``specrank.experiments.study.study_run`` behind a command line (the pipeline at the scale
that can answer whether the rerankers help; default prompts: Spec-Bench's 480 questions, none of which the shipped head
trained on)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from specrank.commands.args import (
    add_model_arguments,
    add_tracking_arguments,
    at_least,
    model_spec,
    parse_temperatures,
    tracking_asked,
)
from specrank.commands.decode import add_seen_prompts_argument
from specrank.errors import optional
from specrank.experiments.study.study_run import study
from specrank.experiments.study.study_settings import (
    CHUNK,
    DEFAULT_GREEDY_ROUNDS,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_ONLINE_OTHER_PROMPTS,
    DEFAULT_ONLINE_PROMPTS,
    DEFAULT_ROUNDS,
    EXPERIMENT,
    FIRST_CHUNK,
    ONLINE_BUDGETS,
    StudySettings,
)
from specrank.outputs import check_output_dir
from specrank.rerankers import GBMReranker
from specrank.scale import add_worker_arguments, preflight, workers_from_args
from specrank.workflow import Tracking


def add_arguments(parser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="study directory (rerun the same command to resume)")
    add_model_arguments(parser, drafter="eagle3:default", threads="torch CPU threads (per worker with --workers)")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSONL prompts (Spec-Bench or HumanEval form; default: the bundled Spec-Bench questions)")
    parser.add_argument("--rounds", type=at_least(1), default=DEFAULT_ROUNDS,
                        help=f"rounds to record at each sampling temperature (default {DEFAULT_ROUNDS})")
    parser.add_argument("--greedy-rounds", type=at_least(1), default=DEFAULT_GREEDY_ROUNDS,
                        help=f"rounds to record greedily (default {DEFAULT_GREEDY_ROUNDS})")
    parser.add_argument("--temperatures", default="1,0", help="comma-separated temperatures (default 1,0)")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--chunk", type=at_least(1), default=CHUNK,
                        help=f"the most prompts one decoding call adds (default {CHUNK}); the first call decodes "
                             f"{FIRST_CHUNK} (or fewer, with a smaller --chunk)")
    parser.add_argument("--bootstrap", type=at_least(1), default=2000, help="paired prompt-bootstrap resamples")
    parser.add_argument("--tune-trials", type=at_least(0), default=4,
                        help="Optuna trials per fold of Base and Rows (default 4)")
    trees = GBMReranker().n_estimators
    parser.add_argument("--n-estimators", type=at_least(1), default=trees,
                        help=f"boosting iterations of Base and Rows when not tuned (default {trees}, the rerankers' "
                             "default; the paper's: 400)")
    parser.add_argument("--online-prompts", type=at_least(1), default=DEFAULT_ONLINE_PROMPTS,
                        help=f"prompts kept unseen for the online phase (default {DEFAULT_ONLINE_PROMPTS}, at most a "
                             "quarter of the prompts): draft, the champion, root and root-draw decode them in the loop "
                             "at B = 8 and 59")
    parser.add_argument("--online-other-prompts", type=at_least(1), default=DEFAULT_ONLINE_OTHER_PROMPTS,
                        help=f"of those, how many the cells other than the first sampled temperature at B = 8 decode "
                             f"(default {DEFAULT_ONLINE_OTHER_PROMPTS})")
    parser.add_argument("--online-budgets", type=parse_budgets, default=ONLINE_BUDGETS,
                        help="budgets of the online phase, from 8 and 59 (default 8,59)")
    parser.add_argument("--no-online", action="store_true",
                        help="no online phase: every prompt may be recorded, only the offline figures are made")
    parser.add_argument("--seed", type=int, default=0, help="prompt order, decoding and bootstrap seed (default 0)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar while decoding (none is drawn when stderr is not a terminal)")
    add_worker_arguments(parser)
    add_seen_prompts_argument(parser)
    add_tracking_arguments(parser, store="sqlite:///OUT/mlflow.db, the study's own store", experiment=EXPERIMENT,
                           no_tracking="write the study directory only, log nothing (also what happens, said in one "
                                       "line, when MLflow is not installed and no tracking option was given)")


def parse_budgets(text: str) -> tuple[int, ...]:
    """``--online-budgets``: a comma list of 8 and 59, in that order."""
    budgets = tuple(dict.fromkeys(int(b) for b in text.split(",") if b.strip()))
    if not budgets or not set(budgets) <= set(ONLINE_BUDGETS):
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(map(str, ONLINE_BUDGETS))}, got {text!r}")
    return tuple(b for b in ONLINE_BUDGETS if b in budgets)


def run(args) -> int:
    out = check_output_dir(args.out).resolve()
    workers = workers_from_args(args)  # --workers / --ray-address refused here, before anything loads
    if workers is not None:
        preflight(workers)  # Ray installed, a cluster's address answering
    tracking = None
    if not args.no_tracking and optional("mlflow", tracking_asked(args, EXPERIMENT),
                                         "specrank study: MLflow is not installed, so the study logs nothing to it "
                                         "(as with --no-tracking)"):
        tracking = Tracking(args.tracking_uri or f"sqlite:///{out / 'mlflow.db'}", args.experiment)
        if args.tracking_uri or out.is_dir():  # the study's own store is created with its directory
            tracking = tracking.checked()
    settings = StudySettings(tuple(parse_temperatures(args.temperatures)), args.rounds, args.greedy_rounds,
                             args.max_new_tokens, args.chunk, args.bootstrap, args.tune_trials, args.n_estimators,
                             args.seed, not args.no_online, args.online_prompts, args.online_other_prompts,
                             args.online_budgets, prompts=args.prompts)
    result = study(model_spec(args), settings, out=out, workers=workers,
                   allow_training_prompts=args.allow_training_prompts, progress=not args.no_progress,
                   tracking=tracking, command=shlex.join(["specrank", "study", *getattr(args, "argv", [])]))
    print(f"\nresults: {out / 'results.json'}, {out / 'results.md'}")
    for line in result.headline() + result.links:
        print(line)
    return 0
