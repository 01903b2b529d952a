"""Benchmark the chain's first token chosen by specrank (``specrank tree-config --vllm-choices``): for vLLM's
EAGLE-3 chains of k tokens, every rule's acceptance length and share of root selection's gain at the chain's
choice, exact on recorded rounds, and the tokens/s they predict inside vLLM with the plugin's cost a step.

    python benchmarks/bench_chain_choice.py                      # the bundled held-out prompts, k = 1..4, T = 0, 1
    python benchmarks/bench_chain_choice.py --tokens 1,3 --limit 8 --max-new-tokens 16 --bootstrap 200   # smoke

vLLM's own steps come from ``benchmarks/results/engine_parity_speed.json`` (``bench_engine_parity.py --part
speed``, the same CPU). Goals: the best rule's share at the chain's choice >= 35% at both temperatures, and its
predicted tokens/s over vLLM's chain >= 1.03 at the best k. Prints one JSON object, writes
benchmarks/results/chain_choice.json, exits 1 when a goal is missed. Recordings are kept under ``--work`` and a
rerun resumes them (run it alone for the timings).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import ROOT, write_results  # benchmarks/harness.py, beside this script

GOAL_SHARE = 35.0
GOAL_SPEED = 1.03
REUSED = ("reranked", "best_chain", "ranking")  # the rules a plugin would serve


def vllm_timing(path: Path, tokens):
    """vLLM's plain step, its chain steps at ``tokens`` and its verify passes, as tree-config reads them."""
    from specrank.experiments.tree_config.engine_timing import engine_timing_text, parse_engine_timing

    figures = json.loads(path.read_text())["figures"]
    steps = {int(k): v["decode_ms_per_step"] for k, v in figures["vllm"].items() if int(k) in tokens}
    verify = {int(n): ms for n, ms in figures["vllm_verify_ms"].items()}
    return parse_engine_timing(engine_timing_text(figures["vllm"]["0"]["decode_ms_per_step"], steps, verify))


def needed_share(rows) -> float:
    """The share (%) of root's gain at which the rule's engine tokens/s would reach ``GOAL_SPEED`` times the
    chain's, at the rule's own cost a step."""
    draft, root, rule = (rows[rows["rule"] == r].iloc[0] for r in ("draft", "root", "reranked"))
    cost_ratio = rule["engine_round_seconds"] / draft["engine_round_seconds"]
    return 100 * (GOAL_SPEED * cost_ratio * draft["length"] - draft["length"]) / (root["length"] - draft["length"])


def run_temperature(args, temperature: float, target, drafter) -> list[dict]:
    from specrank.experiments.tree_config.chain_choice import ChainChoice
    from specrank.decode.loading.model_spec import Models
    from specrank.experiments.tree_config.configure import TreeConfigSettings, tree_config
    from specrank.engines.vllm.token_trees import vllm_chain

    tokens = [int(t) for t in args.tokens.split(",")]
    choices = tuple(ChainChoice(k, args.choices, args.drafted_chains) for k in tokens)
    run = TreeConfigSettings(args.prompts, temperature, args.max_new_tokens, 0, repeats=args.repeats,
                             bootstrap=args.bootstrap, engine_timing=vllm_timing(Path(args.engine_results), tokens),
                             chain_choices=choices, plugin_ms=args.plugin_ms, limit=args.limit,
                             trees=tuple(vllm_chain(k) for k in tokens))
    result = tree_config(Models(target, drafter), run, out=Path(args.work) / f"choice-t{temperature:g}",
                         say=lambda line: print(line, file=sys.stderr, flush=True))
    table = result.choices
    out = []
    for label, rows in table.groupby("choice", sort=False):
        record = {"choice": label, "temperature": temperature, "needed_share_pct": needed_share(rows),
                  "rules": rows.drop(columns=["choice"]).to_dict("records")}
        out.append(record)
    return out


def main(argv=None) -> int:
    from specrank.decode.prompts import default_prompts_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default=str(default_prompts_path()))
    parser.add_argument("--limit", type=int, default=56, help="prompts (default 56: the whole bundled set)")
    parser.add_argument("--tokens", default="1,2,3,4", help="vLLM num_speculative_tokens scored (default 1,2,3,4)")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--choices", type=int, default=10, help="first tokens a rule chooses among (default 10)")
    parser.add_argument("--drafted-chains", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--plugin-ms", type=float, default=1.0, help="the plugin's cost a step (default: the goal)")
    parser.add_argument("--engine-results", default=str(ROOT / "benchmarks/results/engine_parity_speed.json"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", default=str(ROOT / "runs/bench-chain-choice"))
    parser.add_argument("--name", default="chain_choice")
    args = parser.parse_args(argv)

    import torch

    from specrank.decode import load_drafter, load_target

    torch.set_num_threads(args.threads)
    target = load_target("smollm2")
    drafter = load_drafter("eagle3:default", target)
    records = [r for t in args.temperatures.split(",") for r in run_temperature(args, float(t), target, drafter)]
    best = {}
    for r in records:
        for rule in r["rules"]:
            if rule["rule"] in REUSED:
                key = r["temperature"]
                best[key] = max(best.get(key, -1e9), rule["share_pct"])
    speed = max(rule.get("engine_speed_over_draft", float("nan")) for r in records for rule in r["rules"]
                if rule["rule"] in REUSED)
    figures = {"choices": records, "best_share_pct": {str(k): v for k, v in best.items()},
               "best_engine_speed_over_draft": speed, "goal_share_pct": GOAL_SHARE, "goal_speed": GOAL_SPEED,
               "plugin_ms": args.plugin_ms, "threads": args.threads, "prompts": args.prompts, "limit": args.limit}
    write_results(args.name, figures)
    print(json.dumps({k: v for k, v in figures.items() if k != "choices"}, indent=2))
    met = all(v >= GOAL_SHARE for v in best.values()) and speed >= GOAL_SPEED
    print(f"best share at the chain's choice {best} (goal >= {GOAL_SHARE:g}%), best predicted vLLM speed over its"
          f" chain {speed:.3f} (goal >= {GOAL_SPEED})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
