"""Benchmark specrank's vLLM plugin (docs/vllm.md): vLLM's EAGLE-3 chains with the shipped head, with and without a
first-step reranker choosing each chain's first token, greedy, one prompt at a time, in vLLM's own environment.

    python benchmarks/bench_vllm_reranker.py       # the shipped first-step rerankers, 102 held-out prompts, k = 1..4
    python benchmarks/bench_vllm_reranker.py --ks 3 --limit 8 --spec-bench 0 --max-new-tokens 32   # a smoke run

``--prompts FILE``: JSON Lines with a ``prompt`` field or Spec-Bench's ``turns`` (default: the bundled held-out
prompts), joined by ``--spec-bench N`` unseen Spec-Bench prompts (default 46: spread over those outside every
third, which the shipped first-step rerankers learned from). vLLM runs from ``--engine-python``
(``make .venv-vllm/.installed``, with specrank installed into it: ``.venv-vllm/bin/pip install --no-deps -e .`` and
the reranker's libraries), through ``specrank.engines.vllm.runner``'s ``speed`` mode: decode seconds exclude the
prefill, and each prompt is decoded with the plugin off and on in turns in one engine.
For each k: the acceptance length and tokens/s of the head alone and with the plugin, per prompt; their paired
prompt-bootstrap ratio; whether the greedy text is identical on every prompt; the plugin's ms a step; tree-config's
prediction for the same reranker on the same prompts (``predicted``) and whether the measured gain lies inside its
interval (on ``--prompts`` alone, at ``--predict-ks``: its recordings are the costly part). vLLM without a drafter
is timed once (``plain_tokens_per_s``). At T = 1 (``--no-sampled`` skips it): the prompts in one seeded batch,
the acceptance gain and its interval from vLLM's per-request counters, and the plugin's ms a batched step. Goals: text
identical; tokens/s with the plugin over the head alone >= 1.03 at the best k with its interval above 1; the plugin
<= 1 ms a step. Writes benchmarks/results/vllm_reranker.json (``--name``), exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from harness import engine_arguments, prepare_vllm, vllm_run, write_results  # benchmarks/harness.py, beside this script

GOAL_SPEED = 1.03
GOAL_MS = 1.0


def engine_run(args, prep: dict, k: int, reranker: str | None) -> dict:
    """One greedy setting decoded one prompt at a time (the vLLM runner's ``speed`` mode); k = 0: vLLM
    without a drafter. With ``reranker``, each prompt is decoded with the plugin off and on in turns, in one engine
    (``interleave``): both share its state and the machine's, so drift between two runs does not enter the ratio."""
    request = {"model": prep["model"], "head": prep["head"] if k else None, "k": k, "prompts": prep["prompts"],
               "max_tokens": args.max_new_tokens, "mode": "speed", "interleave": bool(reranker)}
    name = f"k{k}-{'interleaved' if reranker else 'head'}" if k else "plain"
    return vllm_run(args, name, request, reranker, {"SPECRANK_TEMPERATURE": "0"})


def prompt_set(args) -> str:
    """``--prompts`` joined by ``--spec-bench`` unseen Spec-Bench prompts, written into ``--work``: its path."""
    from specrank.decode.prompts import read_prompts, spec_bench_path, spec_bench_text

    if not args.spec_bench:
        return args.prompts
    unseen = [p for i, p in enumerate(read_prompts(spec_bench_path())) if i % 3]  # every third: learned from
    step = max(1, len(unseen) // args.spec_bench)
    prompts = read_prompts(args.prompts, limit=args.limit) + unseen[::step][: args.spec_bench]
    path = Path(args.work) / "prompts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec_bench_text(prompts), encoding="utf-8")
    return str(path)


def sampled_run(args, prep: dict, k: int, reranker: str | None) -> dict:
    """The prompts decoded at T = 1 in one batch (the vLLM runner's ``acceptance`` mode, each prompt seeded;
    vLLM's CPU build needs its ``expand_batch_to_tokens`` fixed at T > 0, which that mode runs beside the shipped
    one): per request the accepted tokens and steps, and the plugin's seconds."""
    from specrank.decode.config import prompt_seed

    prompts = [{**p, "seed": prompt_seed(0, p["id"])} for p in prep["prompts"]]
    request = {"model": prep["model"], "head": prep["head"], "k": k, "prompts": prompts,
               "max_tokens": args.max_new_tokens, "temperatures": [1.0], "mode": "acceptance"}
    settings = {"SPECRANK_TEMPERATURE": "1", "SPECRANK_VLLM_REQUESTS": str(len(prompts))}  # the whole batch's rows
    out = vllm_run(args, f"k{k}-t1-{'plugin' if reranker else 'head'}", request, reranker, settings)
    run = next(r for r in out["runs"] if r["cpu_expand_fixed"])
    steps = [r["spec"]["per_step_accepted"] for r in run["requests"]]
    return {"accepted": np.array([sum(s) for s in steps], float), "steps": np.array([len(s) for s in steps], float),
            "plugin": out["plugin"]}


def sampled_compare(head: dict, plugin: dict, n_boot: int, seed: int = 0) -> dict:
    """At T = 1: both acceptance lengths and the gain with its paired prompt-bootstrap interval (95%)."""
    from specrank.selection.stats import PromptBootstrap

    cols = {"ha": head["accepted"], "hs": head["steps"], "pa": plugin["accepted"], "ps": plugin["steps"]}
    tot = PromptBootstrap(np.arange(len(cols["ha"])).astype(str), n_resamples=n_boot, seed=seed).totals(cols)
    col = lambda name: tot.boot[:, tot.names.index(name)]  # noqa: E731
    length = lambda a, s: 1 + a.sum() / s.sum()  # noqa: E731
    gain = col("pa") / col("ps") - col("ha") / col("hs")
    timing = plugin["plugin"] or {"calls": 0, "seconds": 0.0}
    return {"head_acceptance_length": float(length(cols["ha"], cols["hs"])),
            "plugin_acceptance_length": float(length(cols["pa"], cols["ps"])),
            "acceptance_gain": float(length(cols["pa"], cols["ps"]) - length(cols["ha"], cols["hs"])),
            "acceptance_gain_interval": [float(np.percentile(gain, 2.5)), float(np.percentile(gain, 97.5))],
            "plugin_ms_per_batched_step": 1000 * timing["seconds"] / max(timing["calls"] / 2, 1),
            "batch": int(len(cols["ha"]))}


def per_prompt(run: dict, mode: str | None = None) -> dict:
    """Per prompt: tokens, decode seconds, verify steps and accepted tokens (vLLM's counters), token ids; ``mode``
    (``off`` or ``on``): an interleaved run's decodes with the plugin off or on."""
    from specrank.engines.vllm.metrics import spec_decode_counts

    rows = run["speed"] if mode is None else [r[mode] for r in run["speed"]]
    counts = [spec_decode_counts(r["metrics_after"]) - spec_decode_counts(r["metrics_before"]) for r in rows]
    return {"tokens": np.array([r["tokens"] for r in rows], float), "seconds": np.array([r["seconds"] for r in rows]),
            "drafts": np.array([c.drafts for c in counts], float),
            "accepted": np.array([c.accepted_tokens for c in counts], float), "ids": [r["token_ids"] for r in rows]}


def subset(run: dict, n: int) -> dict:
    """A ``per_prompt`` record's first ``n`` prompts."""
    return {name: values[:n] for name, values in run.items()}


def compare(head: dict, plugin: dict, n_boot: int, seed: int = 0) -> dict:
    """The plugin against the head alone on the same prompts: acceptance lengths, tokens/s and their paired
    prompt-bootstrap ratio (95%)."""
    from specrank.selection.stats import PromptBootstrap

    cols = {f"{w}|{c}": d[c] for w, d in (("head", head), ("plugin", plugin)) for c in ("tokens", "seconds", "drafts",
                                                                                          "accepted")}
    tot = PromptBootstrap(np.arange(len(head["tokens"])).astype(str), n_resamples=n_boot, seed=seed).totals(cols)
    at = lambda name: (tot.point[tot.names.index(name)], tot.boot[:, tot.names.index(name)])  # noqa: E731
    out = {}
    for who in ("head", "plugin"):
        (t, tb), (s, sb), (d, db), (a, ab) = (at(f"{who}|{c}") for c in ("tokens", "seconds", "drafts", "accepted"))
        out[f"{who}_tokens_per_s"], out[f"{who}_acceptance_length"] = t / s, 1 + a / d
        out[f"_{who}"] = (tb / sb, 1 + ab / db)
    ratio = out["_plugin"][0] / out["_head"][0]
    gain = out["_plugin"][1] - out["_head"][1]
    out["speed_ratio"] = out["plugin_tokens_per_s"] / out["head_tokens_per_s"]
    out["speed_ratio_interval"] = [float(np.percentile(ratio, 2.5)), float(np.percentile(ratio, 97.5))]
    out["acceptance_gain"] = out["plugin_acceptance_length"] - out["head_acceptance_length"]
    out["acceptance_gain_interval"] = [float(np.percentile(gain, 2.5)), float(np.percentile(gain, 97.5))]
    out["identical_text"] = all(a == b for a, b in zip(head["ids"], plugin["ids"]))
    return {k: float(v) if isinstance(v, (np.floating, float)) else v for k, v in out.items() if not k.startswith("_")}


def predicted(args, ks) -> dict:
    """tree-config's prediction for the same reranker, prompts and chains (greedy; ``--vllm-choices`` with the
    reranker given): per k the head's chain and the reranked chain's acceptance lengths and the gain, with their
    paired prompt-bootstrap intervals. Its recordings stay in ``--work`` and a rerun resumes them."""

    import torch

    from specrank.decode import load_drafter, load_target
    from specrank.experiments.tree_config.chain_choice import ChainChoice
    from specrank.decode.loading.model_spec import Models
    from specrank.experiments.tree_config.configure import TreeConfigSettings, tree_config
    from specrank.engines.vllm.token_trees import vllm_chain
    from specrank.rerankers.loader import load_reranker

    torch.set_num_threads(args.threads)
    target = load_target("smollm2")
    drafter = load_drafter("eagle3:default", target)
    reranker = load_reranker(args.reranker)
    choices = tuple(ChainChoice(k, int(reranker.topk_), 1) for k in ks)
    run = TreeConfigSettings(args.prompts, 0.0, args.max_new_tokens, 0, reranker=args.reranker, repeats=1,
                             bootstrap=args.bootstrap, chain_choices=choices, limit=args.limit,
                             trees=tuple(vllm_chain(k) for k in ks))
    table = tree_config(Models(target, drafter), run, out=Path(args.work) / "tree-config", reranker=reranker).choices
    out = {}
    for k in ks:
        rows = table[table["num_speculative_tokens"] == k].set_index("rule")
        out[str(k)] = {f"{rule}_{c}": float(rows.loc[rule, c]) for rule in ("draft", "reranked")
                       for c in ("length", "length_low", "length_high", "gain", "gain_low", "gain_high")}
    return out


def parse_args(argv=None):
    from specrank.decode.prompts import default_prompts_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reranker", default="reranker:default",
                        help="a first-step reranker (format-2 directory or zip; default: the shipped one, greedy)")
    parser.add_argument("--prompts", default=str(default_prompts_path()))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--ks", default="1,2,3,4", help="num_speculative_tokens (default 1,2,3,4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--bootstrap", type=int, default=2000)
    engine_arguments(parser, "vllm_reranker", threads=1)
    parser.add_argument("--spec-bench", type=int, default=46,
                        help="unseen Spec-Bench prompts joining --prompts (default 46; 0: none)")
    parser.add_argument("--predict-ks", default="3",
                        help="the ks tree-config predicts, on --prompts alone (default 3; empty: none)")
    parser.add_argument("--no-sampled", dest="sampled", action="store_false",
                        help="skip T = 1 (the prompts in one seeded batch, head alone and with the plugin)")
    parser.add_argument("--sampled-reranker", default=None,
                        help="the T = 1 reranker (default: the shipped first-step reranker for sampling)")
    return parser.parse_args(argv)


def setting_row(args, prep: dict, k: int, given: int) -> dict:
    """One k: the head alone against the plugin, greedy (interleaved, on every prompt and on the given ones), the
    plugin's ms a step, and at T = 1 unless ``--no-sampled``."""
    from specrank.rerankers.defaults import shipped_first_step_dir

    run = engine_run(args, prep, k, args.reranker)
    head, with_plugin = per_prompt(run, "off"), per_prompt(run, "on")
    row = compare(head, with_plugin, args.bootstrap)
    row["given_prompts"] = compare(subset(head, given), subset(with_plugin, given), args.bootstrap)
    steps = with_plugin["drafts"].sum() + len(prep["prompts"])  # every verify step, and each prompt's
    timing = run["plugin"] or {"calls": 0, "seconds": 0.0}  # first draft step (after its prefill)
    row["plugin_ms_per_step"] = 1000 * timing["seconds"] / max(steps, 1)
    if args.sampled:
        sampled_reranker = str(shipped_first_step_dir("sampling")) if args.sampled_reranker is None else (
            args.sampled_reranker)
        row["t1"] = sampled_compare(sampled_run(args, prep, k, None), sampled_run(args, prep, k, sampled_reranker),
                                    args.bootstrap)
    return row


def add_predictions(args, settings: dict) -> None:
    """tree-config's prediction beside each ``--predict-ks`` setting, and whether the gain measured on the given
    prompts lies inside it."""
    ks = [int(v) for v in args.predict_ks.split(",") if v]
    for k, p in (predicted(args, ks) if ks else {}).items():
        row = settings[k]
        row["predicted"] = p  # on the given prompts: compared with the gain measured on them
        gain = row["given_prompts"]["acceptance_gain"]
        row["gain_inside_prediction"] = p["reranked_gain_low"] <= gain <= p["reranked_gain_high"]


def summary(args, settings: dict, plain: list, prep: dict, given: int, measured: str) -> dict:
    """The results' figures: every setting, the best k with the plugin and the fastest with the head alone."""
    best = max(settings, key=lambda k: settings[k]["speed_ratio"])
    fastest_head = max(settings, key=lambda k: settings[k]["head_tokens_per_s"])
    plain_speed = sum(r["tokens"] for r in plain) / sum(r["seconds"] for r in plain)
    return {"settings": settings, "best_k": int(best), "fastest_head_k": int(fastest_head),
            "plain_tokens_per_s": plain_speed,
            "plugin_best_over_fastest_head": settings[best]["plugin_tokens_per_s"] / settings[fastest_head][
                "head_tokens_per_s"],
            "prompts": len(prep["prompts"]), "given_prompts": given, "prompt_file": measured,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads, "reranker": args.reranker,
            "goal_speed_ratio": GOAL_SPEED, "goal_ms_per_step": GOAL_MS}


def goals_met(figures: dict) -> bool:
    """Text identical everywhere; at the best k the plugin's speed ratio >= the goal with its interval above 1; the
    plugin within its ms a step everywhere."""
    settings, b = figures["settings"], figures["settings"][str(figures["best_k"])]
    return (all(s["identical_text"] for s in settings.values()) and b["speed_ratio_interval"][0] > 1.0
            and b["speed_ratio"] >= GOAL_SPEED and max(s["plugin_ms_per_step"] for s in settings.values()) <= GOAL_MS)


def main(argv=None) -> int:
    args = parse_args(argv)

    from specrank.decode.prompts import read_prompts
    from specrank.rerankers.defaults import champion_name, shipped_first_step_dir
    from specrank.rerankers.loader import load_reranker
    from specrank.workflow.champion import check_unseen_prompts

    if champion_name(args.reranker) == "default":  # the plugin's reranker:default, named by its file
        args.reranker = str(shipped_first_step_dir("greedy"))
    measured = prompt_set(args)
    check_unseen_prompts(load_reranker(args.reranker), read_prompts(measured), source=args.reranker)
    given = len(read_prompts(args.prompts, limit=args.limit))  # the first prompts measured: tree-config's
    prep = prepare_vllm(argparse.Namespace(**{**vars(args), "prompts": measured, "limit": None}))
    plain = engine_run(args, prep, 0, None)["speed"]  # no drafter: tokens and seconds only
    settings = {str(k): setting_row(args, prep, k, given) for k in (int(v) for v in args.ks.split(","))}
    add_predictions(args, settings)
    figures = summary(args, settings, plain, prep, given, measured)
    write_results(args.name, figures)
    print(json.dumps(figures, indent=2))
    return 0 if goals_met(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
