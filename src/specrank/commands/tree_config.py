"""``specrank tree-config``: score a grid of SGLang / EAGLE / vLLM tree settings (vLLM chains and static trees)
exactly on recorded rounds,
time the drafter and the target on ``--device``, rank the settings by predicted tokens/s and print the flags
of the best one (docs/tree-config.md)."""

from __future__ import annotations

import json
from pathlib import Path

from specrank.commands.args import add_model_arguments, add_tracking_arguments, at_least
from specrank.decode.prompts import default_prompts_path
from specrank.law import Law

HELP = "exact acceptance length and predicted tokens/s of SGLang / EAGLE / vLLM tree settings, and the best flags"
RERANKER_CROSS_FIT = "cross-fit"
RECORDING_SHARD = 4  # prompts a recording shard holds


def int_list(flag: str, low: int = 1):
    """An argparse type: a comma list of integers >= ``low`` (the error names ``flag``)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in str(text).split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"{flag}: expected a comma list of integers, got {text!r}") from None
        if not values or min(values) < low:
            raise ValueError(f"{flag}: expected integers >= {low}, got {text!r}")
        return sorted(set(values))

    return parse


def add_arguments(parser) -> None:
    add_model_arguments(parser, drafter="eagle3:default",
                        device="torch device the models run on and the cost model is timed on (default cpu)")
    parser.add_argument("--prompts", default=None, help="JSONL prompts (default: the bundled held-out set)")
    parser.add_argument("--limit", type=at_least(1), default=16, help="the first N prompts (default 16)")
    parser.add_argument("--allow-training-prompts", action="store_true",
                        help="score a head on prompts it was trained on (refused by default)")
    parser.add_argument("--topk", default="1,2,4,8", help="SGLang --speculative-eagle-topk values (default 1,2,4,8)")
    parser.add_argument("--num-steps", default="2,3,4,5,6",
                        help="SGLang --speculative-num-steps values, the tree depth (default 2,3,4,5,6)")
    parser.add_argument("--num-draft-tokens", default="4,8,16,32",
                        help="SGLang --speculative-num-draft-tokens values, root included (default 4,8,16,32);"
                             " topk 1 is a chain of num_steps + 1")
    parser.add_argument("--eagle", action="append", default=[], metavar="TOP_K,DEPTH,TOTAL_TOKEN",
                        help="also score EAGLE's EaModel setting (repeatable)")
    parser.add_argument("--vllm-tokens", default=None,
                        help="also score vLLM chains of these num_speculative_tokens (comma list)")
    parser.add_argument("--vllm-tree", action="append", default=[], metavar="TREE",
                        help="also score vLLM's static tree, written as its speculative_token_tree, e.g."
                             " \"[(0,), (1,), (0, 0), (1, 0)]\" (repeatable; recorded in a pool that expands every"
                             " node to its depth)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=48, help="tokens per prompt (default 48)")
    parser.add_argument("--seed", type=int, default=0, help="run seed; every recording decodes every prompt with it")
    parser.add_argument("--reranker", default=RERANKER_CROSS_FIT,
                        help="the reranker compared at each n: 'cross-fit' (default: a rows GBM cross-fitted on"
                             " each recording by prompt halves), 'none', or a saved reranker / MLflow model URI"
                             " (used on recordings of its topk)")
    parser.add_argument("--repeats", type=at_least(1), default=5, help="timed repeats of each pool and pass (default 5)")
    parser.add_argument("--bootstrap", type=at_least(1), default=2000, help="paired prompt-bootstrap resamples")
    parser.add_argument("--out", required=True,
                        help="output directory (recordings, tables, figures, heads); rerun the same command to resume")
    add_tracking_arguments(parser, run_name="tree-config")


def grid_of(args) -> list:
    """Every setting the arguments name, checked (one line naming the flag) before any model loads."""
    from specrank.evaluation.tree_config import (
        TreeConfigError, eagle_setting, setting_order, tree_grid, vllm_chain, vllm_tree,
    )

    topks = int_list("--topk")(args.topk)
    steps = int_list("--num-steps")(args.num_steps)
    tokens = int_list("--num-draft-tokens", 2)(args.num_draft_tokens)
    try:
        settings = set(tree_grid(topks, steps, tokens))
    except TreeConfigError as exc:
        raise TreeConfigError(f"--num-draft-tokens {args.num_draft_tokens}: {exc}") from None
    for text in args.eagle:
        values = _triple(text)
        try:
            settings.add(eagle_setting(*values))
        except TreeConfigError as exc:
            raise TreeConfigError(f"--eagle {text}: {exc}") from None
    if args.vllm_tokens:
        settings.update(vllm_chain(t) for t in int_list("--vllm-tokens")(args.vllm_tokens))
    for text in args.vllm_tree:
        try:
            settings.add(vllm_tree(text))
        except TreeConfigError as exc:
            raise TreeConfigError(f"--vllm-tree {text}: {exc}") from None
    return sorted(settings, key=setting_order)


def _triple(text: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise ValueError(f"--eagle: expected TOP_K,DEPTH,TOTAL_TOKEN, got {text!r}")
    return values


def _reranker(args):
    """None (cross-fit or none) or the loaded reranker, refused before any model loads."""
    if args.reranker in (RERANKER_CROSS_FIT, "none"):
        return None
    from specrank.tracking import resolve_reranker

    return resolve_reranker(args.reranker, tracking_uri=args.tracking_uri)


def run(args) -> int:
    import torch
    from transformers.utils import logging as hf_logging

    from specrank.decode import load_drafter, load_target
    from specrank.decode.config import check_temperature
    from specrank.decode.loading.drafters import check_unseen, parse_drafter_spec
    from specrank.decode.loading.targets import check_target_spec, parse_device
    from specrank.decode.prompts import read_prompts
    from specrank.outputs import check_output_dir, staged

    check_output_dir(args.out)
    settings = grid_of(args)
    check_temperature(args.temperature, "--temperature")
    reranker = _reranker(args)
    prompts = read_prompts(args.prompts or default_prompts_path(), limit=args.limit)
    parse_device(args.device)
    check_target_spec(args.target)
    parse_drafter_spec(args.drafter, args.eagle3_layers, args.specforge_norm_output)
    check_unseen(args.drafter, prompts, args.allow_training_prompts)
    check_recordings(args, settings)
    uri = None
    if not args.no_tracking:
        from specrank.tracking import check_tracking_uri, resolve_tracking_uri

        uri = check_tracking_uri(resolve_tracking_uri(args.tracking_uri))
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    target = load_target(args.target, args.device, args.dtype, args.graphs)
    drafter = load_drafter(args.drafter, target, args.eagle3_layers, args.specforge_norm_output)
    with staged(args.out) as stage:  # the outputs appear only once MLflow has them too
        result = tree_config(target, drafter, prompts, settings, args, reranker, stage)
        _write(result, stage)
        if uri is not None:
            _track(args, uri, result, target, drafter)
    _print(result, Path(args.out))
    return 0


def tree_config(target, drafter, prompts, settings, args, reranker, out: Path) -> dict:
    """Record the pools the grid needs, score every setting, time the cost model; the result's tables and notes."""
    from specrank.decode.prompts import encode_prompts
    from specrank.decode.runs.cost import measure_cost
    from specrank.evaluation.tree_config import (
        position_table, recording_plan, reliability_table, score_setting, setting_table,
    )

    recordings, scores, reliability = {}, [], []
    for name, rec in recording_plan(settings).items():
        print(f"recording {name}: {len(prompts)} prompts, {args.max_new_tokens} tokens each", flush=True)
        # Recordings go straight to --out (not the stage): a run stopped midway keeps its finished shards, and the
        # same command resumes them (record_run refuses a recording of another configuration).
        run_dir = _record(target, drafter, prompts, args, rec, Path(args.out) / "recordings" / name)
        rounds = _load(run_dir)
        factor, note = _first_factor(rounds, run_dir, args, reranker)
        recordings[name] = {"topk": rec.topk, "depth": rec.depth, "expand": rec.expand, "budget": rec.budget,
                            "rounds": rounds.n_rounds, "reranker": note}
        for s in rec.settings:
            scores.append(score_setting(rounds.pool, rounds.law, s, factor, name))
        part = reliability_table(rounds.pool, rounds.law)
        reliability.append(part.assign(recording=name))
    config_ids = encode_prompts(target, prompts[:1], _config(args, _shape(None), 1))[0]
    cost = measure_cost(target, drafter, config_ids, settings, args.repeats)
    cost.host = _host_seconds(target, drafter, config_ids, settings, cost, args)
    costs = {s.label: cost.round_seconds(s) for s in settings}
    import pandas as pd

    table = setting_table(scores, costs, args.bootstrap, args.seed)
    rel = pd.concat(reliability, ignore_index=True)
    rel = rel.assign(q_sum=rel["edges"] * rel["draft_probability"].fillna(0.0),
                     a_sum=rel["edges"] * rel["target_acceptance"].fillna(0.0))
    pooled = rel.groupby(["bin_low", "bin_high"], as_index=False)[["edges", "q_sum", "a_sum"]].sum()
    edges = pooled["edges"].where(pooled["edges"] > 0)
    pooled = pooled.assign(draft_probability=pooled["q_sum"] / edges, target_acceptance=pooled["a_sum"] / edges)
    pooled = pooled.drop(columns=["q_sum", "a_sum"])
    heads = _export_heads(args.drafter, out / "heads")
    return {"table": table, "positions": position_table(scores), "reliability": pooled,
            "cost": pd.DataFrame(cost.rows()), "recordings": recordings, "heads": heads,
            "law": Law(args.temperature).name, "out": Path(args.out)}


def check_recordings(args, settings) -> None:
    """Before any model loads: a recording already in --out (a run being resumed) must be of this command's pool,
    budget, law, seed and prompts (the models' hashes are compared once they are loaded)."""
    from specrank.decode.runs.manifest import config_manifest
    from specrank.decode.runs.shards import check_same_run
    from specrank.evaluation.tree_config import recording_plan

    prompts = args.prompts or default_prompts_path()
    for name, rec in recording_plan(settings).items():
        check_same_run(Path(args.out) / "recordings" / name,
                       config_manifest(_config(args, _shape(rec), rec.budget), prompts, RECORDING_SHARD),
                       partial=True)


def _shape(rec):
    """The planned recording's pool (a one-node pool for None)."""
    from specrank.decode import PoolShape

    return PoolShape(1, 1, 1) if rec is None else PoolShape(rec.topk, rec.depth, rec.expand)


def _config(args, shape, budget: int):
    from specrank.decode import DecodeConfig

    return DecodeConfig(shape, budget, 0, args.temperature, args.max_new_tokens, args.seed)


def _record(target, drafter, prompts, args, rec, run_dir: Path) -> Path:
    """One recording of a planned pool: every prompt under the same seed, every pool edge scored."""
    from specrank.decode.runs import build_manifest, record_run

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    config = _config(args, _shape(rec), rec.budget)
    manifest = build_manifest(target, drafter, config, args.prompts or default_prompts_path(), RECORDING_SHARD)
    record_run(target, drafter, prompts, run_dir, config, manifest, shard_size=RECORDING_SHARD)
    return run_dir


def _load(run_dir):
    from specrank.evaluation.data import load_rounds

    rounds = load_rounds(run_dir)
    rounds.pool.prompt_id = rounds.prompt_id  # the bootstrap resamples prompts
    return rounds


def _first_factor(rounds, run_dir, args, reranker):
    """(N, topk) first-factor predictions of the compared reranker on this recording, or None, and a note."""
    import numpy as np
    import pandas as pd

    from specrank import schema
    from specrank.evaluation.data import align_predictions
    from specrank.featurize.storage import featurize_run

    if args.reranker == "none":
        return None, "none"
    if rounds.topk == 1:
        return None, "none: a chain has one first-level candidate, nothing to rerank"
    if len(np.unique(rounds.prompt_id)) < 2:
        return None, "skipped: cross-fitting needs two prompts"
    features = featurize_run(run_dir)
    if reranker is None:
        from specrank.rerankers import GBMReranker
        from specrank.rerankers.crossfit import cross_fit

        model = GBMReranker(features="rows", n_estimators=100, num_leaves=15, min_child_samples=10, n_jobs=1)
        predictions, note = cross_fit(model, features).predictions, "rows GBM cross-fitted by prompt halves"
    elif int(getattr(reranker, "topk_", -1)) != rounds.topk:
        return None, f"skipped: the reranker was trained on topk {getattr(reranker, 'topk_', '?')} pools"
    else:
        predictions, note = reranker.predict_first_factor(features), args.reranker
    frame = pd.DataFrame({**{k: features[k] for k in schema.FEATURE_KEYS}, "reranked": np.asarray(predictions)})
    return align_predictions(rounds, frame)["reranked"], note


def _host_seconds(target, drafter, prompt_ids, settings, cost, args) -> float:
    """Host seconds per round: an online decode's round time beyond its timed pool and pass (one middle setting)."""
    from specrank.decode import Decoder, PoolShape
    from specrank.evaluation.tree_config import TreeSetting

    beams = [s for s in settings if isinstance(s, TreeSetting)]  # the grid always holds beams; a static tree's
    s = beams[len(beams) // 2]  # host work is the same bookkeeping
    dec = Decoder(target, drafter, "draft", budget=s.budget, shape=PoolShape(*s.draft_shape))
    dec.generate(prompt_ids, max_new_tokens=8, temperature=args.temperature, seed=args.seed)  # warm-up
    stats = dec.generate(prompt_ids, max_new_tokens=min(32, args.max_new_tokens), temperature=args.temperature,
                         seed=args.seed).stats
    per_round = (stats.seconds - stats.time_split.get("prefill", 0.0)) / max(stats.rounds, 1)
    return max(0.0, per_round - cost.draft[s.draft_shape] - cost.verify[s.num_draft_tokens])


def _export_heads(spec: str, out: Path) -> dict:
    """The EAGLE-3 head exported for SGLang and vLLM (``drafter export``), or {} for other drafters."""
    from specrank.decode.loading.drafters import head_directory

    head = head_directory(spec)
    if head is None:
        return {}
    from specrank.decode.loading.eagle3_export import export_head

    return {fmt: str(export_head(head, out / fmt, fmt, "bf16")[0]) for fmt in ("sglang", "vllm")}


def _summary(result: dict) -> dict:
    """The best setting overall, the best chain and the best vLLM setting (a chain or a static tree), with the
    flags to paste (heads at their final place)."""
    from specrank.evaluation.tree_config import best_settings, serving_flags

    heads = {k: str(result["out"] / "heads" / k) for k in result["heads"]}
    best = best_settings(result["table"])
    summary = {"law": result["law"], "recordings": result["recordings"]}
    for name, row in best.items():
        if row is None:
            continue
        summary[name] = {"setting": row["setting"], "acceptance_length": float(row["draft_length"]),
                         "interval": [float(row["draft_low"]), float(row["draft_high"])],
                         "tokens_per_s": float(row.get("tokens_per_s", float("nan"))),
                         "flags": serving_flags(row, heads.get("sglang", "HEAD"), heads.get("vllm", "HEAD"))}
    if not heads:
        summary["heads"] = "export the head with `specrank drafter export HEAD --format sglang|vllm --out DIR`"
    return summary


def _write(result: dict, out: Path) -> None:
    from specrank.atomic import atomic_write, write_parquet_atomic
    from specrank.evaluation.tree_config import reliability_figure, tree_config_figure

    for name in ("table", "positions", "reliability", "cost"):
        write_parquet_atomic(result[name], out / f"tree_config_{name}.parquet")
    result["table"].to_csv(out / "tree_config_table.csv", index=False)
    for name, fig in (("tree_config", tree_config_figure(result["table"])),
                      ("reliability", reliability_figure(result["reliability"]))):
        atomic_write(out / f"{name}.png", lambda tmp, fig=fig: fig.savefig(tmp, format="png", dpi=120))
    text = json.dumps(_summary(result), indent=2, default=str)
    atomic_write(out / "summary.json", lambda tmp: Path(tmp).write_text(text))


def _track(args, uri, result, target, drafter) -> None:
    from specrank import tracking
    from specrank.evaluation.tree_config import reliability_figure, tree_config_figure

    table = result["table"]
    params = {"stage": "tree-config", "target": target.name, "target_sha256": target.source_hash,
              "drafter": drafter.spec, "prompts": str(args.prompts or default_prompts_path()), "limit": args.limit,
              "temperature": args.temperature, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
              "device": args.device, "dtype": args.dtype, "reranker": args.reranker, "bootstrap": args.bootstrap,
              "settings": len(table), "recordings": json.dumps(result["recordings"], default=str)}
    summary = _summary(result)
    best = table[table["outside"] == 0].head(5)
    metrics = {"settings": len(table), "flagged": int((table["outside"] > 0).sum())}
    for i, (_, r) in enumerate(best.iterrows(), start=1):
        for col in ("draft_length", "draft_low", "draft_high", "root_length", "reranked_length", "tokens_per_s"):
            if col in r and r[col] == r[col]:
                metrics[f"top{i}.{col}"] = float(r[col])
    with tracking.experiment_run(args.experiment, run_name=args.run_name or "tree-config", tracking_uri=uri,
                                 description=_note(summary)):
        tracking.log_params(params)
        tracking.log_metrics(metrics)
        tracking.log_tables({"tree_config": table, "tree_config_positions": result["positions"],
                             "tree_config_reliability": result["reliability"], "tree_config_cost": result["cost"]})
        tracking.log_figure(tree_config_figure(table), "tree_config")
        tracking.log_figure(reliability_figure(result["reliability"]), "reliability")
        import mlflow

        mlflow.log_dict(summary, "summary.json")


def _note(summary: dict) -> str:
    best = summary.get("best", {})
    lines = [f"Tree settings scored exactly on recorded rounds ({summary.get('law')}). Acceptance length = 1 +"
             " expected accepted draft tokens per round; predicted tokens/s = length / (draft + verify + host).",
             f"Best: {best.get('setting')} (length {best.get('acceptance_length', float('nan')):.3f},"
             f" {best.get('tokens_per_s', float('nan')):.1f} tokens/s)."]
    for engine, flags in best.get("flags", {}).items():
        lines.append(f"{engine}: {flags}")
    return "\n\n".join(lines)


def _print(result: dict, out: Path) -> None:
    table = result["table"]
    cols = [c for c in ("rank", "setting", "draft_length", "draft_low", "draft_high", "root_length",
                        "reranked_length", "tokens_per_s", "status") if c in table]
    print(table[cols].head(12).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    summary = _summary(result)
    for name in ("best", "best_chain", "best_vllm"):
        if name in summary:
            print(f"{name.replace('_', ' ')}: {summary[name]['setting']}")
            for engine, flags in summary[name]["flags"].items():
                print(f"  {engine}: {flags}")
    print(f"tables, figures and heads in {out}")
