"""Benchmark pipelined decoding (target-row reuse, arXiv 2610.29210, §5.4, App. D.14, Table 28, Figure 4): the drafter
in its own process drafts while the target runs the root pass.

Decoders: serial draft selection (the base), serial root-draw (what pipelining saves), and draft, root,
root-draw and PEARL-style selection with the drafter in a worker process ("-pipelined"), on the embedded
default (SmolLM2-135M, early-exit:8 drafting as a standalone 8-layer copy), one CPU thread for the target
process and one for the worker. Per budget, every strategy runs on every prompt in an order rotated by the
prompt's position in a seeded prompt order, after warm-up decodes; speeds are summed tokens over summed
seconds (prefill included), with 95% paired prompt-bootstrap intervals. Reports tokens/s, tokens per target
pass, each strategy's speed ratio over serial draft selection and over the pipelined PEARL-style strategy,
where each round's time goes, and the share of root-pass time hidden under drafting. Logs to MLflow
(tables, metrics, the speed-gain figure in the style of Figure 4) unless --no-tracking.

Measured on a quiet 2-core machine (pinned, one thread each): 12 prompts x 24 tokens with all six strategies
took 13 minutes; the goals' three strategies on 24 prompts also 13 minutes (every goal met):

    python benchmarks/bench_pipeline.py --pin --prompts 24 --warmup 1 --max-new-tokens 24 --budgets 8 \\
        --serial draft --pipelined root_draw,pearl --out runs/bench_pipeline --tracking-uri sqlite:///mlflow.db

All six strategies at both budgets (about an hour quiet):

    python benchmarks/bench_pipeline.py --pin --prompts 24 --warmup 1 --max-new-tokens 24 --budgets 8,59 \\
        --out runs/bench_pipeline --tracking-uri sqlite:///mlflow.db

Quick look (~8 minutes loaded): python benchmarks/bench_pipeline.py --prompts 2 --warmup 1 --max-new-tokens 8 \\
    --budgets 8,59 --no-tracking

Goals, at B = 8: pipelined root-draw over serial draft and over pipelined PEARL-style with the
lower end of each paired interval above 1.0; root-pass time hidden under drafting >= 80% for every pipelined
root-pass strategy. Prints one JSON object; exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from harness import write_results  # benchmarks/harness.py, beside this script

PIPE = "-pipelined"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="early-exit:8")
    parser.add_argument("--prompts", type=int, default=24, help="the first N bundled prompts, in a seeded order")
    parser.add_argument("--warmup", type=int, default=2, help="prompts decoded first by every strategy, untimed")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budgets", default="8,59")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--serial", default="draft,root_draw", help="strategies run with the drafter in-process")
    parser.add_argument("--pipelined", default="draft,root,root_draw,pearl", help="strategies run with the worker")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the target process")
    parser.add_argument("--drafter-threads", type=int, default=1, help="torch threads of the drafter worker")
    parser.add_argument("--drafter-device", default=None, help="the worker's device (default: the drafter's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pin", action="store_true", help="pin the target process to CPU 0, the worker to CPU 1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--out", default=None, help="directory for the tables (Parquet) and the figure (PNG)")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--experiment", default="specrank-bench")
    parser.add_argument("--no-tracking", action="store_true")
    parser.add_argument("--min-hidden", type=float, default=0.8)
    return parser.parse_args(argv)


def named_strategies(args) -> dict:
    """{strategy name: (rule, pipelined?)}."""
    serial = {r: (r, False) for r in args.serial.split(",") if r}
    return {**serial, **{f"{r}{PIPE}": (r, True) for r in args.pipelined.split(",") if r}}


def run_budgets(args, target, drafter, worker, encoded) -> "pd.DataFrame":  # noqa: F821
    """The decodes table of every budget (the protocol run once per budget)."""
    import pandas as pd

    from specrank.decode import DecodeConfig, make_strategy
    from specrank.decode.runs import run_protocol

    named = named_strategies(args)
    frames = []
    for budget in [int(b) for b in args.budgets.split(",")]:
        config = DecodeConfig(budget=budget, extra=0, temperature=args.temperature,
                              max_new_tokens=args.max_new_tokens, seed=args.seed)
        strategies = {name: make_strategy(rule) for name, (rule, _) in named.items()}
        drafters = {name: worker for name, (_, piped) in named.items() if piped}
        progress = lambda i, _, b=budget: print(f"B={b}: prompt {i}/{len(encoded)}", file=sys.stderr)  # noqa: E731
        _, decodes = run_protocol(target, drafter, encoded, config, strategies, warmup=args.warmup, progress=progress,
                                  measure=False, drafters=drafters)
        frames.append(decodes.assign(budget=budget))
    return pd.concat(frames, ignore_index=True)


def summarize(args, decodes) -> dict:
    """{table name: DataFrame}: per-budget strategy table, speed ratios over both bases, root-pass overlap."""
    import pandas as pd

    from specrank.experiments.online.online_tables import strategy_table, root_overlap, speed_ratios

    bases = ["draft"] + [f"pearl{PIPE}"] * (f"pearl{PIPE}" in set(decodes["strategy"]))
    tables = {"strategies": [], "speed": [], "overlap": []}
    for budget, part in decodes.groupby("budget"):
        tables["strategies"].append(strategy_table(part).assign(budget=budget))
        tables["speed"] += [speed_ratios(part, b, args.bootstrap, args.seed).assign(budget=budget) for b in bases]
        tables["overlap"].append(root_overlap(part, args.bootstrap, args.seed).assign(budget=budget))
    return {"pipeline_decodes": decodes, **{f"pipeline_{k}": pd.concat(v, ignore_index=True) for k, v in tables.items()}}


def report(args, tables) -> dict:
    """The JSON result: per budget and strategy, speeds, ratios, time per round and hidden root-pass share."""
    dec = tables["pipeline_strategies"].set_index(["budget", "strategy"])
    speed = tables["pipeline_speed"].set_index(["budget", "strategy", "base"])
    overlap = tables["pipeline_overlap"].set_index(["budget", "strategy"])
    out = {}
    for (budget, d), r in dec.iterrows():
        ms = lambda c: 1000 * r[c] / r["rounds"]  # noqa: E731
        entry = {"tokens_per_s": r["tokens_per_s"], "tokens_per_pass": r["tokens_per_pass"],
                 "tokens_per_round": r["tokens"] / r["rounds"], "rounds": int(r["rounds"]),
                 "ms_per_round": {k.removesuffix("_s"): ms(k) for k in (
                     "prefill_s", "draft_s", "drafter_busy_s", "root_pass_s", "tree_pass_s", "bookkeeping_s")}}
        for (b, dd, base), s in speed.iterrows():
            if (b, dd) == (budget, d) and base != d:
                entry[f"speed_vs_{base}"] = [s["ratio"], s["low"], s["high"]]
        if (budget, d) in overlap.index:
            entry["root_pass_hidden_share"] = list(overlap.loc[(budget, d), ["hidden", "low", "high"]])
        out.setdefault(f"B={budget}", {})[d] = entry
    return out


def goals(args, result) -> dict:
    """Each goal with its measured value and whether it holds."""
    b8 = result.get("B=8", {})
    draw = b8.get(f"root_draw{PIPE}", {})
    checks = {}
    for base in ("draft", f"pearl{PIPE}"):
        iv = draw.get(f"speed_vs_{base}")
        checks[f"root_draw{PIPE} over {base} at B=8: low > 1"] = {"value": iv, "met": bool(iv and iv[1] > 1.0)}
    for budget, decs in result.items():
        for d, entry in decs.items():
            if d.endswith(PIPE) and "root_pass_hidden_share" in entry:
                hidden = entry["root_pass_hidden_share"][0]
                checks[f"{d} root pass hidden at {budget} >= {args.min_hidden}"] = {
                    "value": hidden, "met": bool(hidden >= args.min_hidden)}
    return checks


def track(args, tables, result, checks, figure, target, drafter) -> None:
    from specrank import tracking

    params = {"stage": "bench-pipeline", "target": target.name, "target_sha256": target.source_hash,
              "drafter": drafter.spec, **{k: v for k, v in vars(args).items() if k not in ("tracking_uri",)}}
    metrics = {}
    for budget, decs in result.items():
        for d, e in decs.items():
            for k, v in e.items():
                if isinstance(v, list):
                    metrics.update({f"{budget}.{d}.{k}.{n}": x for n, x in zip(("point", "low", "high"), v)})
                elif isinstance(v, dict):
                    metrics.update({f"{budget}.{d}.ms_per_round.{n}": x for n, x in v.items()})
                else:
                    metrics[f"{budget}.{d}.{k}"] = v
    metrics.update({f"goal_met.{i}": float(c["met"]) for i, c in enumerate(checks.values())})
    with tracking.experiment_run(args.experiment, run_name="bench-pipeline", tracking_uri=args.tracking_uri):
        tracking.log_params(params)
        tracking.log_metrics(metrics)
        tracking.log_tables(tables)
        tracking.log_figure(figure, "speed_gain")
        tracking.log_report("\n".join(f"- {k}: {c['value']} ({'met' if c['met'] else 'missed'})"
                                      for k, c in checks.items()), "goals.md")


def write(out_dir, tables, figure) -> None:
    from specrank.atomic import write_parquet_atomic

    out = Path(out_dir)
    for name, frame in tables.items():
        write_parquet_atomic(frame, out / f"{name}.parquet")
    tmp = out / ".speed_gain.png.tmp"
    figure.savefig(tmp, format="png", dpi=120)
    tmp.replace(out / "speed_gain.png")


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    from specrank.decode import load_drafter, load_target
    from specrank.decode.pipeline import PipelinedDrafter
    from specrank.decode.prompts import default_prompts_path, encode_prompt, read_prompts
    from specrank.evaluation.figures import speed_gain_figure

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    if args.pin:
        os.sched_setaffinity(0, {0})
    target = load_target(args.target, args.device, "float32")
    drafter = load_drafter(args.drafter, target)
    prompts = read_prompts(default_prompts_path())[: args.prompts]
    random.Random(args.seed).shuffle(prompts)  # the seeded prompt order the rotation follows
    encoded = [(p.prompt_id, p.task, encode_prompt(target.tokenizer, p.text)) for p in prompts]
    with PipelinedDrafter(drafter, args.drafter_device, args.drafter_threads) as worker:
        if args.pin:
            os.sched_setaffinity(worker.pid, {1})
        decodes = run_budgets(args, target, drafter, worker, encoded)
    tables = summarize(args, decodes)
    result = report(args, tables)
    checks = goals(args, result)
    figure = speed_gain_figure(tables["pipeline_speed"], "Pipelined decoding: speed gain", list(named_strategies(args)))
    if args.out:
        write(args.out, tables, figure)
    if not args.no_tracking:
        track(args, tables, result, checks, figure, target, drafter)
    figures = {"target": args.target, "drafter": args.drafter, "prompts": len(encoded),
               "max_new_tokens": args.max_new_tokens, "threads": [args.threads, args.drafter_threads],
               "pinned": args.pin, "results": result, "goals": checks}
    print(json.dumps(figures, indent=2, default=float))
    write_results("bench_pipeline", figures)
    return int(not all(c["met"] for c in checks.values()))


if __name__ == "__main__":
    sys.exit(main())
