"""``specrank verify-sweep``: a grid of verification rules with tree and chain speculation on one
prompt set -> block efficiency, tokens/s and exact distortion per rule, a report, a trade-off figure,
MLflow."""

from __future__ import annotations

from pathlib import Path

from transformers.utils import logging as hf_logging

from specrank.commands import tracked
from specrank.commands.args import add_model_arguments, add_pool_arguments, add_tracking_arguments, at_least, model_spec
from specrank.decode.core import PoolShape
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.experiments.verify_sweep.sweep import SweepDecoding, SweepResult, SweepSettings, grid_cells, verify_sweep
from specrank.experiments.verify_sweep.sweep_tables import DEFAULT_GRID, METRICS, findings
from specrank.outputs import check_output_dir, staged
from specrank.scale import add_worker_arguments, workers_from_args


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--prompts", default=None, help="JSONL prompts; default: bundled set")
    parser.add_argument("--limit", type=at_least(1), default=None, help="decode only the first N prompts")
    parser.add_argument("--out", required=True, help="output directory (one resumable run per cell under runs/)")
    parser.add_argument("--grid", nargs="+", default=list(DEFAULT_GRID),
                        help="verification rules as NAME[:KEY=V1/V2,...] (default: %(default)s)")
    parser.add_argument("--speculations", nargs="+", default=["tree", "chain"], choices=["tree", "chain"],
                        help="tree and/or chain speculative decoding (default both)")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    parser.add_argument("--chain-length", type=int, default=4, help="chain speculation: drafted tokens per round")
    add_pool_arguments(parser, budget="tree speculation: verified tree size B, root excluded", extra=0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-size", type=at_least(1), default=4)
    parser.add_argument("--no-progress", action="store_true")
    add_tracking_arguments(parser, run_name="verify-sweep-<out name>")

    add_worker_arguments(parser)  # the cells' shards, all in one queue


def run(args) -> int:
    out = check_output_dir(args.out)
    workers = workers_from_args(args)
    prompts_path = args.prompts or default_prompts_path()
    decoding = SweepDecoding(PoolShape(args.topk, args.depth, args.expand), args.budget, args.extra, args.chain_length,
                             args.temperature, args.max_new_tokens, args.seed)
    settings = SweepSettings(str(prompts_path), tuple(args.grid), tuple(args.speculations), decoding, args.limit,
                             args.shard_size)
    grid_cells(settings.grid, settings.speculations)  # a bad rule is refused before any model loads
    settings.configs()
    uri = tracked.tracking_uri(args)  # before any work: no partial output
    hf_logging.disable_progress_bar()
    prompts = read_prompts(prompts_path, limit=args.limit)
    models = model_spec(args).check(here=workers is None)
    meta = {"target": args.target, "drafter": args.drafter, "prompts": len(prompts), "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens, "chain_length": args.chain_length, "budget": args.budget}
    result = verify_sweep(models, settings, out=out, meta=meta, workers=workers, progress=not args.no_progress)
    with staged(out) as stage:  # the local outputs appear only once MLflow has them too
        result.write(stage)
        if uri is not None:
            track(args, uri, result, meta)
    for note in result.skipped:
        print(f"skipped (no tree form): {note}")
    for line in findings(result.table):
        print(line)
    print(f"{result.cells} cells -> {out}/report.md" + (f" (MLflow: {uri})" if uri else ""))
    return 0


def track(args, uri, result: SweepResult, meta: dict) -> None:
    table = result.table
    params = {"stage": "verify-sweep", **meta, "grid": list(args.grid), "speculations": list(args.speculations),
              "pool": {"topk": args.topk, "depth": args.depth, "expand": args.expand, "extra": args.extra},
              "seed": args.seed, "skipped": list(result.skipped)}
    run_name = args.run_name or f"verify-sweep-{Path(args.out).resolve().name}"
    tracked.log_run(uri, args.experiment, run_name, params=params,
                    metrics={f"{r.speculation}.{r.verification_rule}.{m}": getattr(r, m)
                             for r in table.itertuples() for m in METRICS},
                    tables={"verify_sweep": table}, figures={"tradeoff": result.figure}, report=result.report)
