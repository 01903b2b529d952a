"""``specrank tree-config``: score a grid of SGLang / EAGLE / vLLM tree settings (vLLM chains and static trees)
exactly on recorded rounds,
time the drafter and the target on ``--device``, rank the settings by predicted tokens/s and print the flags
of the best one (docs/tree-config.md)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from specrank.commands import tracked
from specrank.commands.args import add_model_arguments, add_tracking_arguments, at_least, model_spec
from specrank.decode.config import check_temperature
from specrank.decode.core import parse_device
from specrank.decode.loading.drafters import check_unseen, parse_drafter_spec
from specrank.decode.loading.target_spec import check_target_spec
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.engines.sglang.beam import eagle_setting, tree_grid
from specrank.engines.tree_settings import TreeConfigError, setting_order
from specrank.engines.vllm.metrics import (
    FIRST_WITH_TREES,
    LAST_WITH_TREES,
    parse_version,
    serves_static_trees,
    version_name,
)
from specrank.engines.vllm.token_trees import vllm_chain, vllm_tree
from specrank.experiments.tree_config.chain_choice import ChainChoice
from specrank.experiments.tree_config.configure import (
    CROSS_FIT,
    TreeConfigResult,
    TreeConfigSettings,
    check_recordings,
    tree_config,
)
from specrank.experiments.tree_config.engine_timing import check_timed_settings, parse_engine_timing
from specrank.experiments.tree_config.setting_table import summary_note, top_metrics
from specrank.outputs import check_output_dir, staged
from specrank.rerankers.defaults import champion_name, load_default_reranker


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
                             " node to its depth; vLLM 0.10.1 to 0.20.2 only: name it with --vllm-version)")
    parser.add_argument("--vllm-version", default=None, metavar="VERSION",
                        help="the vLLM release served (default: a current one, 0.21.0 or later, where vLLM PR #42121"
                             " left chains only); --vllm-tree needs a release from 0.10.1 to 0.20.2")
    parser.add_argument("--vllm-choices", type=int, default=None, metavar="K",
                        help="also score each --vllm-tokens chain (default 1,2,3,4) with its first token chosen by"
                             " specrank among the drafter's top K (2 or more): the drafter's chain, root selection,"
                             " a reranker's argmax, the best of --drafted-chains chains and a ranking reranker, each"
                             " on a fan recording of K chains (tree_config_choices.csv)")
    parser.add_argument("--drafted-chains", type=int, default=4, metavar="M",
                        help="chains drafted in one batched pass for the best_chain rule (default 4; <= K)")
    parser.add_argument("--plugin-ms", type=float, default=1.0, metavar="MS",
                        help="the plugin's cost a decode step in ms, added to a reranker's chain choice (default 1.0)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=48, help="tokens per prompt (default 48)")
    parser.add_argument("--seed", type=int, default=0, help="run seed; every recording decodes every prompt with it")
    parser.add_argument("--reranker", default=CROSS_FIT,
                        help="the reranker compared at each n: 'cross-fit' (default: a rows GBM cross-fitted on"
                             " each recording by prompt halves), 'none', reranker:default (the champion of"
                             " --temperature's law) or a saved reranker / MLflow model URI (used on recordings of its"
                             " topk); scored as specrank selects (reranked_*) and as SGLang's plugin rescores SGLang's"
                             " tree (plugin_*)")
    parser.add_argument("--repeats", type=at_least(1), default=5, help="timed repeats of each pool and pass (default 5)")
    parser.add_argument("--engine-timing", default=None, metavar="plain=MS,SETTING=MS,...",
                        help="an engine's measured ms a decode step on this machine, plain and for at least one"
                             " scored setting (kN: vLLM's chain of N tokens, or a label k{topk}-s{steps}-n{tokens}),"
                             " e.g. plain=25.7,k1=28.8, and optionally its forward pass over N tokens timed alone"
                             " (nN=MS, n1 included): adds the engine's predicted tokens/s for every setting"
                             " (engine_tokens_per_s; docs/tree-config.md, \"Predicting an engine's speed\")")
    parser.add_argument("--bootstrap", type=at_least(1), default=2000, help="paired prompt-bootstrap resamples")
    parser.add_argument("--out", required=True,
                        help="output directory (recordings, tables, figures, heads); rerun the same command to resume")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bars (none is drawn when stderr is not a terminal)")
    add_tracking_arguments(parser, run_name="tree-config")


def grid_of(args) -> list:
    """Every setting the arguments name, checked (one line naming the flag) before any model loads."""
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
    if args.vllm_version is not None:
        try:
            parse_version(args.vllm_version)
        except ValueError as exc:
            raise TreeConfigError(f"--vllm-version: {exc}") from None
    if args.vllm_tree and not (args.vllm_version and serves_static_trees(args.vllm_version)):
        # static trees were drafted only by the releases that shipped tree attention
        raise TreeConfigError(f"--vllm-tree: vLLM {args.vllm_version or '0.21.0 and later'} drafts no static tree"
                              f" (speculative_token_tree: {version_name(FIRST_WITH_TREES)} to"
                              f" {version_name(LAST_WITH_TREES)}, removed by vLLM PR #42121); serve a chain"
                              " (--vllm-tokens) or name an older release with --vllm-version")
    for text in args.vllm_tree:
        try:
            settings.add(vllm_tree(text))
        except TreeConfigError as exc:
            raise TreeConfigError(f"--vllm-tree {text}: {exc}") from None
    return sorted(settings, key=setting_order)


def choices_of(args) -> tuple[ChainChoice, ...]:
    """The chain choices ``--vllm-choices`` asks for (one per ``--vllm-tokens`` k), checked before any model
    loads."""
    if args.vllm_choices is None:
        return ()
    if not args.plugin_ms >= 0:
        raise TreeConfigError(f"--plugin-ms: expected a cost >= 0, got {args.plugin_ms!r}")
    tokens = int_list("--vllm-tokens")(args.vllm_tokens) if args.vllm_tokens else [1, 2, 3, 4]
    try:
        return tuple(ChainChoice(k, args.vllm_choices, args.drafted_chains) for k in tokens)
    except TreeConfigError as exc:
        raise TreeConfigError(f"--vllm-choices {args.vllm_choices} / --drafted-chains {args.drafted_chains}: {exc}"
                              ) from None


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
    if args.reranker in (CROSS_FIT, "none"):
        return None
    if champion_name(args.reranker):  # the champion of --temperature's law
        return load_default_reranker(args.temperature, champion_name(args.reranker))
    return tracked.resolve_reranker(args.reranker, args.tracking_uri)


def run(args) -> int:
    check_output_dir(args.out)
    settings = grid_of(args)
    choices = choices_of(args)
    check_temperature(args.temperature, "--temperature")
    timing = None if args.engine_timing is None else parse_engine_timing(args.engine_timing)
    if timing is not None:
        check_timed_settings(timing, settings)
    reranker = _reranker(args)
    prompts_path = args.prompts or default_prompts_path()
    prompts = read_prompts(prompts_path, limit=args.limit)
    parse_device(args.device)
    check_target_spec(args.target)
    parse_drafter_spec(args.drafter, args.eagle3_layers, args.specforge_norm_output)
    check_unseen(args.drafter, prompts, args.allow_training_prompts)
    run = TreeConfigSettings(str(prompts_path), args.temperature, args.max_new_tokens, args.seed, args.reranker,
                             args.repeats, args.bootstrap, progress=not args.no_progress, engine_timing=timing,
                             chain_choices=choices, plugin_ms=args.plugin_ms, limit=args.limit,
                             allow_training_prompts=args.allow_training_prompts, trees=tuple(settings))
    check_recordings(args.out, run)
    uri = tracked.tracking_uri(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    result = tree_config(model_spec(args), run, out=args.out, reranker=reranker,
                         say=lambda line: print(line, flush=True))
    with staged(args.out) as stage:  # the outputs appear only once MLflow has them too
        result.write(stage)
        if uri is not None:
            _track(args, uri, result)
    _print(result, Path(args.out))
    return 0


def _track(args, uri, result: TreeConfigResult) -> None:
    table = result.table
    params = {"stage": "tree-config", **result.models, "prompts": str(args.prompts or default_prompts_path()),
              "limit": args.limit, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
              "seed": args.seed, "device": args.device, "dtype": args.dtype, "reranker": args.reranker,
              "bootstrap": args.bootstrap, "settings": len(table),
              "recordings": json.dumps(result.recordings, default=str)}
    notes = result.summary()
    tracked.log_run(uri, args.experiment, args.run_name or "tree-config", params=params, metrics=top_metrics(table),
                    tables={"tree_config": table, "tree_config_positions": result.positions,
                            "tree_config_reliability": result.reliability, "tree_config_cost": result.cost}
                    | ({"tree_config_choices": result.choices} if result.choices is not None else {}),
                    figures=result.figures(), dicts={"summary.json": notes}, description=summary_note(notes))


def _print(result: TreeConfigResult, out: Path) -> None:
    table = result.table
    cols = [c for c in ("rank", "setting", "draft_length", "draft_low", "draft_high", "root_length",
                        "reranked_length", "plugin_length", "tokens_per_s", "engine_tokens_per_s",
                        "status") if c in table]
    print(table[cols].head(12).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    notes = result.summary()
    for name in ("best", "best_chain", "best_vllm"):
        if name in notes:
            print(f"{name.replace('_', ' ')}: {notes[name]['setting']}")
            for engine, flags in notes[name]["flags"].items():
                print(f"  {engine}: {flags}")
    choices = result.choices
    if choices is not None and len(choices):
        print("chains whose first token specrank chooses (share: % of root selection's gain at the choice):")
        cols = [c for c in ("choice", "rule", "length", "length_low", "length_high", "share_pct", "share_low",
                            "share_high", "first_acceptance", "tokens_per_s", "speed_over_draft",
                            "engine_tokens_per_s", "engine_speed_over_draft") if c in choices]
        print(choices[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"tables, figures and heads in {out}")
