"""``specrank verify-sweep``: a grid of verification rules with tree and chain speculation on one
prompt set -> block efficiency, tokens/s and exact distortion per rule, a report, a trade-off figure,
MLflow."""

from __future__ import annotations

import re
from pathlib import Path

from specrank.atomic import atomic_write
from specrank.commands.args import (add_model_arguments, add_pool_arguments,
                                    add_tracking_arguments, at_least)
from specrank.decode import DecodeConfig, PoolShape, load_drafter, load_target
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.outputs import check_output_dir, removing_new_dirs, staged
from specrank.scale import add_worker_arguments, workers_from_args

HELP = "sweep verification rules (tree and chain speculation): block efficiency vs exact distortion, logged to MLflow"


def add_arguments(parser) -> None:
    from specrank.evaluation.sweep import DEFAULT_GRID

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


def grid_cells(grid, speculations) -> tuple[list[dict], list[str]]:
    """(cells {speculation, verification_rule (the spec), rule (parsed)}, skipped 'speculation spec' notes) for
    every grid combination."""
    from specrank.decode.verify.lossy.parse import parse_verification_rule
    from specrank.decode.verify.lossy.rules import RuleError
    from specrank.decode.verify.lossy.tree import tree_form
    from specrank.evaluation.sweep import expand_grid

    specs = [spec for entry in grid for spec in expand_grid(entry)]
    rules = [parse_verification_rule(spec) for spec in specs]  # every entry must parse before any work
    cells, skipped = [], []
    for speculation in speculations:
        for spec, rule in zip(specs, rules, strict=True):
            try:
                if speculation == "tree":
                    tree_form(rule)
            except RuleError:
                skipped.append(f"{speculation} {spec}")
                continue
            cells.append({"speculation": speculation, "verification_rule": spec, "rule": rule})
    if not cells:
        raise ValueError("the grid has no rule the chosen speculations can run")
    return cells, skipped


def cell_dir(out: Path, cell: dict) -> Path:
    return out / "runs" / cell["speculation"] / re.sub(r"[^A-Za-z0-9_.=-]", "_", cell["verification_rule"])


def cell_config(args, speculation: str):
    from specrank.decode.runs.chain import chain_config

    if speculation == "chain":
        return chain_config(args.chain_length, args.temperature, args.max_new_tokens, args.seed)
    return DecodeConfig(PoolShape(args.topk, args.depth, args.expand), args.budget, args.extra, args.temperature,
                        args.max_new_tokens, args.seed)




def run(args) -> int:
    import torch
    from transformers.utils import logging as hf_logging

    from specrank.decode.core import parse_device
    from specrank.decode.loading.drafters import parse_drafter_spec
    from specrank.decode.loading.targets import check_target_spec
    from specrank.decode.runs import build_manifest, lossy_decode_run, read_diagnostics
    from specrank.evaluation.sweep import findings, sweep_report, sweep_table, tradeoff_figure

    out = check_output_dir(args.out)
    workers = workers_from_args(args)
    cells, skipped = grid_cells(args.grid, args.speculations)
    configs = {s: cell_config(args, s) for s in args.speculations}  # refused before any model loads
    uri = None
    if not args.no_tracking:
        from specrank.tracking import check_tracking_uri, resolve_tracking_uri

        uri = check_tracking_uri(resolve_tracking_uri(args.tracking_uri))  # before any work: no partial output
    if args.threads and workers is None:
        torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    prompts_path = args.prompts or default_prompts_path()
    prompts = read_prompts(prompts_path, limit=args.limit)
    parse_device(args.device)
    parse_drafter_spec(args.drafter, args.eagle3_layers, args.specforge_norm_output)
    with removing_new_dirs(out):
        if workers is not None:
            from specrank.decode.runs.workers import Models, RunSpec, decode_on_workers

            runs = [RunSpec(str(cell_dir(out, c)), configs[c["speculation"]], c["speculation"], c["verification_rule"])
                    for c in cells]
            models = Models(args.target, args.drafter, args.device, args.dtype, args.eagle3_layers,
                            args.specforge_norm_output, args.graphs)
            decode_on_workers(workers, models, prompts, prompts_path, runs, args.shard_size,
                              progress=not args.no_progress)
        else:
            check_target_spec(args.target)
            target = load_target(args.target, args.device, args.dtype, args.graphs)
            drafter = load_drafter(args.drafter, target, args.eagle3_layers, args.specforge_norm_output)
            for cell in cells:
                config = configs[cell["speculation"]]
                manifest = build_manifest(target, drafter, config, prompts_path, args.shard_size)
                lossy_decode_run(target, drafter, prompts, cell_dir(out, cell), config, manifest, cell["rule"],
                                 cell["speculation"], args.shard_size, progress=not args.no_progress)
    table = sweep_table(cells, [read_diagnostics(cell_dir(out, c)) for c in cells])
    meta = {"target": args.target, "drafter": args.drafter, "prompts": len(prompts), "temperature": args.temperature,
            "max_new_tokens": args.max_new_tokens, "chain_length": args.chain_length, "budget": args.budget}
    report = sweep_report(table, meta)
    figure = tradeoff_figure(table, meta)
    with staged(out) as stage:  # the local outputs appear only once MLflow has them too
        save_outputs(stage, table, report, figure)
        if uri is not None:
            track(args, uri, table, report, figure, meta, skipped)
    for note in skipped:
        print(f"skipped (no tree form): {note}")
    for line in findings(table):
        print(line)
    print(f"{len(cells)} cells -> {out}/report.md" + (f" (MLflow: {uri})" if uri else ""))
    return 0


def save_outputs(out: Path, table, report: str, figure) -> None:
    """``verify_sweep.parquet``, ``verify_sweep.csv``, ``report.md``, ``figures/tradeoff.png`` (each atomic)."""
    (out / "figures").mkdir(parents=True, exist_ok=True)

    atomic_write(out / "verify_sweep.parquet", lambda tmp: table.to_parquet(tmp, index=False))
    atomic_write(out / "verify_sweep.csv", lambda tmp: table.to_csv(tmp, index=False))
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(report))
    atomic_write(out / "figures" / "tradeoff.png", lambda tmp: figure.savefig(tmp, dpi=120, format="png"))


def track(args, uri, table, report: str, figure, meta: dict, skipped: list[str]) -> None:
    from specrank import tracking
    from specrank.evaluation.sweep import METRICS

    params = {"stage": "verify-sweep", **meta, "grid": list(args.grid), "speculations": list(args.speculations),
              "pool": {"topk": args.topk, "depth": args.depth, "expand": args.expand, "extra": args.extra},
              "seed": args.seed, "skipped": skipped}
    run_name = args.run_name or f"verify-sweep-{Path(args.out).resolve().name}"
    with tracking.experiment_run(args.experiment, run_name=run_name, tracking_uri=uri):
        tracking.log_params(params)
        tracking.log_metrics({f"{r.speculation}.{r.verification_rule}.{m}": getattr(r, m)
                              for r in table.itertuples() for m in METRICS})
        tracking.log_frame(table, "verify_sweep")
        tracking.log_figure(figure, "tradeoff")
        tracking.log_report(report)
