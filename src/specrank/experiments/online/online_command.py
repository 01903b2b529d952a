"""``specrank online``: decode prompts with selection strategies (a reranker included) in the loop, measure
realized vs expected acceptance at the same contexts, and time the strategies against each other."""

from __future__ import annotations

from specrank.commands import tracked
from specrank.commands.args import add_model_arguments, add_pool_arguments, add_tracking_arguments, at_least, model_spec
from specrank.decode import DecodeConfig, PoolShape
from specrank.decode.pipeline import WorkerError
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.errors import CommandError
from specrank.experiments.online.comparison import OnlineSettings, Protocol, compare_online
from specrank.outputs import check_output_dir
from specrank.rerankers.defaults import champion_name, load_default_reranker
from specrank.workflow import Tracking


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--strategies", default="draft",
                        help="comma list of draft, reranked, root, root_draw, pearl, covering (default draft);"
                             " each runs on every prompt, order rotated per prompt; speeds are relative to the first")
    parser.add_argument("--reranker", default=None, help="reranker for 'reranked': a saved reranker (format 2), an"
                                                         " MLflow model URI (models:/NAME/VERSION, runs:/ID/NAME), or "
                                                         "reranker:default (the default study's champion for the "
                                                         "temperature; trained with eagle3:default)")
    parser.add_argument("--compare", default=None,
                        help="comma list of strategies (draft, root, root_draw, pearl, reranked) whose trees the tree"
                             " pass also scores, for measurement only: their expected acceptance at each context")
    parser.add_argument("--prompts", default=None, help="JSONL prompts; default: the bundled set")
    parser.add_argument("--limit", type=at_least(1), default=None, help="only the first N prompts")
    parser.add_argument("--warmup", type=at_least(0), default=1, help="prompts decoded once by every strategy first, untimed")
    parser.add_argument("--out", required=True, help="output directory (rounds, decodes, summary tables, figure)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    add_pool_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="run seed; generators are seeded per (prompt, seed)")
    parser.add_argument("--pipeline", action="store_true",
                        help="draft in a worker process while the target runs the root pass (target-row reuse, "
                             "arXiv 2610.29210, App. D.14); standalone and early-exit drafters only")
    parser.add_argument("--drafter-device", default=None, help="--pipeline: the worker's device (default --device)")
    parser.add_argument("--drafter-threads", type=at_least(1), default=None,
                        help="--pipeline: the worker's torch CPU threads (default: torch's)")
    parser.add_argument("--bootstrap", type=at_least(1), default=2000, help="paired prompt-bootstrap resamples")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar while decoding (none is drawn when stderr is not a terminal)")
    add_tracking_arguments(parser, run_name="online-<strategies>")


def run(args) -> int:
    check_output_dir(args.out)
    config = DecodeConfig(PoolShape(args.topk, args.depth, args.expand), args.budget, 0, args.temperature,
                          args.max_new_tokens, args.seed)
    reranker = None
    if champion_name(args.reranker):
        reranker = load_default_reranker(args.temperature, champion_name(args.reranker))
    elif args.reranker:
        reranker = tracked.resolve_reranker(args.reranker, args.tracking_uri)
    tracking = None if args.no_tracking else Tracking(args.tracking_uri, args.experiment, args.run_name)
    protocol = Protocol(args.warmup, args.bootstrap, args.pipeline, args.drafter_device, args.drafter_threads)
    prompts = read_prompts(args.prompts or default_prompts_path(), limit=args.limit) if args.limit else args.prompts
    try:
        settings = OnlineSettings(prompts, tuple(args.strategies.split(",")), tuple((args.compare or "").split(",")),
                                  config, protocol)
        result = compare_online(model_spec(args), settings, reranker=reranker, reranker_source=args.reranker or "",
                                out=args.out, tracking=tracking, progress=not args.no_progress)
    except WorkerError as exc:  # the pipelined drafter's worker failed: its failure in one line
        raise CommandError(str(exc)) from None
    for line in result.summary():
        print(line)
    return 0
