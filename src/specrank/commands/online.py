"""``specrank online``: decode prompts with selection strategies (a reranker included) in the loop, measure
realized vs expected acceptance at the same contexts, and time the strategies against each other."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from specrank.atomic import atomic_write, write_parquet_atomic
from specrank.commands.args import (add_model_arguments, add_pool_arguments,
                                    add_tracking_arguments, at_least)
from specrank.decode import STRATEGY_NAMES, DecodeConfig, PoolShape, load_drafter, load_target, make_strategy
from specrank.decode.prompts import default_prompts_path, encode_prompts, read_prompts
from specrank.errors import CommandError
from specrank.outputs import check_output_dir, staged

HELP = "decode online with selection strategies in the loop; realized vs expected acceptance and speed ratios"


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--strategies", default="draft",
                        help="comma list of draft, reranked, root, root_draw, pearl, covering (default draft);"
                             " each runs on every prompt, order rotated per prompt; speeds are relative to the first")
    parser.add_argument("--reranker", default=None, help="reranker for 'reranked': a saved reranker (format 2), or an"
                                                         " MLflow model URI (models:/NAME/VERSION, runs:/ID/NAME)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="also load a pickled (format 1) reranker: this runs code from the file, trust it first")
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


def _strategies(args, config) -> dict:
    """{name: strategy}, the reranker loaded and checked against the run before any decoding."""
    from specrank.decode.runs import parse_strategies

    names = parse_strategies(args.strategies, STRATEGY_NAMES, "--strategies")
    if not names:
        raise ValueError("--strategies names no strategy")
    wants = "reranked" in names or "reranked" in parse_strategies(args.compare)
    if wants and not args.reranker:
        raise ValueError("strategy reranked needs --reranker PATH or MLflow model URI")
    if wants and "reranked" not in names:
        raise ValueError("--compare reranked needs reranked in --strategies (its reranker is the one compared)")
    reranker = None
    if args.reranker:
        from specrank.tracking.models import resolve_reranker

        reranker = resolve_reranker(args.reranker, tracking_uri=args.tracking_uri, trust_pickle=args.trust_pickle)
    out = {r: make_strategy(r, reranker if r == "reranked" else None, args.reranker or "") for r in names}
    for s in out.values():
        s.check(config)
    return out


def run(args) -> int:
    import torch
    from transformers.utils import logging as hf_logging

    from specrank.decode.core import parse_device
    from specrank.decode.loading.drafters import parse_drafter_spec
    from specrank.decode.loading.targets import check_target_spec
    from specrank.decode.runs import parse_strategies, run_protocol
    from specrank.evaluation.online import acceptance_summary, strategy_table, speed_ratios

    check_output_dir(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    config = DecodeConfig(PoolShape(args.topk, args.depth, args.expand), args.budget, 0, args.temperature,
                          args.max_new_tokens, args.seed)
    compare = parse_strategies(args.compare)
    strategies = _strategies(args, config)  # before loading models: a bad reranker fails fast
    uri = None
    if not args.no_tracking:
        from specrank.tracking import check_tracking_uri, resolve_tracking_uri

        uri = check_tracking_uri(resolve_tracking_uri(args.tracking_uri))
    prompts_path = args.prompts or default_prompts_path()
    prompts = read_prompts(prompts_path, limit=args.limit)
    parse_device(args.device)
    if (args.drafter_device or args.drafter_threads) and not args.pipeline:
        raise ValueError("--drafter-device and --drafter-threads place the worker of --pipeline")
    if args.drafter_device:
        parse_device(args.drafter_device)
    check_target_spec(args.target)
    parse_drafter_spec(args.drafter, args.eagle3_layers, args.specforge_norm_output)
    target = load_target(args.target, args.device, args.dtype, args.graphs)
    encoded = [(p.prompt_id, p.task, ids) for p, ids in zip(prompts, encode_prompts(target, prompts, config))]
    started = time.time()  # the MLflow run's start: the decoding's, not its logging's
    with _drafter_worker(args, load_drafter(args.drafter, target, args.eagle3_layers, args.specforge_norm_output)) as drafter:
        # disable=None: tqdm stays quiet when stderr is not a terminal (a log file, a pipe, a test)
        with tqdm(total=len(encoded), unit="prompt", desc=f"online ({len(strategies)} strategies each)",
                  disable=True if args.no_progress else None, dynamic_ncols=True) as bar:
            rounds, decodes = run_protocol(target, drafter, encoded, config, strategies, compare, args.warmup,
                                           progress=lambda done: bar.update(done - bar.n))
    tables = {
        "online_rounds": rounds,
        "online_decodes": decodes,
        "online_acceptance": acceptance_summary(rounds, args.bootstrap, args.seed),
        "online_strategies": strategy_table(decodes),
        "online_speed": speed_ratios(decodes, next(iter(strategies)), args.bootstrap, args.seed),
    }
    with staged(args.out) as stage:  # the local outputs appear only once MLflow has them too
        _write(tables, stage)
        if uri is not None:
            _track(args, uri, tables, config, target, drafter, compare, strategies, started)
    _print(tables)
    return 0


@contextmanager
def _drafter_worker(args, drafter):
    """The drafter, moved into its worker process with --pipeline (stopped on exit; its failures one line)."""
    if not args.pipeline:
        yield drafter
        return
    from specrank.decode.pipeline import PipelinedDrafter, WorkerError

    try:
        with PipelinedDrafter(drafter, args.drafter_device, args.drafter_threads) as worker:
            yield worker
    except WorkerError as exc:
        raise CommandError(str(exc)) from None


def _write(tables: dict, out_dir) -> None:
    """Each table as Parquet and the figure as PNG under ``out_dir`` (each atomic)."""
    from specrank.evaluation.figures import acceptance_figure

    out = Path(out_dir)
    for name, frame in tables.items():
        write_parquet_atomic(frame, out / f"{name}.parquet")
    fig = acceptance_figure(tables["online_acceptance"])
    atomic_write(out / "realized_acceptance.png", lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def _track(args, uri, tables, config, target, drafter, compare, strategies, started: float) -> None:
    from specrank.tracking.online import log_online

    reranked = strategies.get("reranked")
    digest = getattr(getattr(reranked, "reranker", None), "meta_", {}).get("format_digest", "")
    params = {"stage": "online", "strategies": args.strategies, "compare": ",".join(compare), "reranker": args.reranker or "",
              "reranker_format_digest": digest,
              "target": target.name, "target_sha256": target.source_hash, "drafter": drafter.spec,
              "config": asdict(config), "prompts": str(args.prompts or default_prompts_path()),
              "warmup": args.warmup, "bootstrap": args.bootstrap, "pipeline": args.pipeline,
              "drafter_device": args.drafter_device or "", "drafter_threads": args.drafter_threads or ""}
    log_online(uri, args.experiment, args.run_name or f"online-{args.strategies}", params, tables, started)


def _print(tables) -> None:
    acc = tables["online_acceptance"].set_index(["strategy", "statistic"])
    speed = tables["online_speed"].set_index("strategy")
    for _, r in tables["online_strategies"].iterrows():
        d = r["strategy"]
        real = acc.loc[(d, "realized")]
        print(f"{d}: realized {real['mean']:.3f} [{real['low']:.3f}, {real['high']:.3f}], "
              f"{r['tokens_per_pass']:.2f} tokens/pass, {r['tokens_per_s']:.1f} tokens/s, speed x"
              f"{speed.loc[d, 'ratio']:.3f} [{speed.loc[d, 'low']:.3f}, {speed.loc[d, 'high']:.3f}]")
