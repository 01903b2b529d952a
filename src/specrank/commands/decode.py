"""``specrank decode``: record every verification round of a target + drafter on a prompt set."""

from __future__ import annotations

from specrank.commands.args import (add_model_arguments, add_pool_arguments, add_tracking_arguments, at_least,
                                    model_spec, tracking_asked)
from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.runs.chain import chain_config
from specrank.errors import optional
from specrank.scale import add_worker_arguments, workers_from_args
from specrank.workflow import Tracking, record
from specrank.workflow.recording import Lossy

EXPERIMENT = "specrank"


def add_arguments(parser) -> None:
    add_model_arguments(parser, threads="torch CPU threads (per worker with --workers)")
    parser.add_argument("--prompts", default=None, help="JSONL prompts (Spec-Bench or HumanEval form); default: bundled set")
    parser.add_argument("--out", required=True, help="run directory (rerun the same command to resume)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    add_pool_arguments(parser, extra=160)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="run seed; generators are seeded per (prompt, seed)")
    parser.add_argument("--limit", type=at_least(1), default=None, help="decode only the first N prompts")
    parser.add_argument("--shard-size", type=at_least(1), default=4, help="prompts per parquet shard (default 4)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--verification-rule", default=None,
                        help="verification rule NAME[:KEY=VALUE,...] (e.g. lenience:l=0.5, speccascade:p_base=0.3);"
                             " records diagnostics/ beside rounds/ (default: exhaustive target sampling)")
    parser.add_argument("--speculation", default="tree", choices=["tree", "chain"],
                        help="tree (default) or chain speculative decoding (chain: lossless unless"
                             " --verification-rule)")
    parser.add_argument("--chain-length", type=int, default=4,
                        help="chain speculation: drafted tokens per round (default 4)")
    add_worker_arguments(parser)
    add_tracking_arguments(parser, experiment=EXPERIMENT, run_name="decode-<out dir name>",
                           no_tracking="record the run directory only, log nothing (also what happens, said in one "
                                       "line, when MLflow is not installed and no MLflow option was given)")
    add_seen_prompts_argument(parser)


def add_seen_prompts_argument(parser) -> None:
    parser.add_argument("--allow-training-prompts", action="store_true",
                        help="decode prompts the EAGLE-3 head was trained on (refused by default: its acceptance there "
                             "is inflated); the manifest records how many")


def run(args) -> int:
    tracking = None
    if not args.no_tracking and optional("mlflow", tracking_asked(args, EXPERIMENT),
                                         "specrank decode: MLflow is not installed, so the run logs nothing to it "
                                         "(as with --no-tracking)"):
        tracking = Tracking(args.tracking_uri, args.experiment, args.run_name)
    temperature, tokens, seed = args.temperature, args.max_new_tokens, args.seed
    if args.speculation == "chain":
        config = chain_config(args.chain_length, temperature, tokens, seed)
    else:
        config = DecodeConfig(PoolShape(args.topk, args.depth, args.expand), args.budget, args.extra, temperature,
                              tokens, seed)
    lossy = (Lossy(args.verification_rule or "lossless", args.speculation)
             if args.verification_rule is not None or args.speculation == "chain" else None)
    recording = record(model_spec(args), args.prompts, out=args.out, config=config, limit=args.limit,
                       shard_size=args.shard_size, workers=workers_from_args(args), lossy=lossy,
                       allow_training_prompts=args.allow_training_prompts, progress=not args.no_progress,
                       tracking=tracking)
    print(recording.summary)
    return 0
