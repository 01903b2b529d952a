"""``specrank decode``: record every verification round of a target + drafter on a prompt set."""

from __future__ import annotations

from pathlib import Path

from specrank.commands.args import (add_deprecated_alias, add_model_arguments, add_pool_arguments,
                                    add_tracking_arguments, at_least, tracking_asked)
from specrank.decode import DecodeConfig, PoolShape, load_drafter, load_target
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.errors import optional
from specrank.files import read_json
from specrank.outputs import check_output_dir, removing_new_dirs
from specrank.scale import add_worker_arguments, workers_from_args

HELP = "decode prompts with a target and a drafter, recording each round's pool and target rows"
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
    add_deprecated_alias(parser, "--verifier", "--verification-rule", "verification_rule")
    add_deprecated_alias(parser, "--decoder", "--speculation", "speculation", choices=["tree", "chain"])
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
    import torch
    from transformers.utils import logging as hf_logging

    from specrank.decode.core import parse_device
    from specrank.decode.loading.drafters import check_unseen, parse_drafter_spec
    from specrank.decode.loading.targets import check_target_spec
    from specrank.decode.runs import build_manifest, record_run
    from specrank.decode.runs.manifest import with_trained_prompts

    check_output_dir(args.out)
    workers = workers_from_args(args)
    if args.threads and workers is None:
        torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()  # weight-loading bars would bury errors and the decode bar
    prompts_path = args.prompts or default_prompts_path()
    prompts = read_prompts(prompts_path, limit=args.limit)
    config = DecodeConfig(PoolShape(args.topk, args.depth, args.expand), args.budget, args.extra,
                          args.temperature, args.max_new_tokens, args.seed)
    lossy = args.verification_rule is not None or args.speculation == "chain"
    if lossy:
        from specrank.decode.runs.chain import chain_config
        from specrank.decode.verify.lossy.adapters import TreeRuleVerifier
        from specrank.decode.verify.lossy.parse import parse_verification_rule

        rule = parse_verification_rule(args.verification_rule or "lossless")
        if args.speculation == "chain":
            config = chain_config(args.chain_length, args.temperature, args.max_new_tokens, args.seed)
        else:
            TreeRuleVerifier(rule, args.temperature)  # refuses rules without a tree form before any model loads
    parse_device(args.device)
    parse_drafter_spec(args.drafter, args.eagle3_layers, args.specforge_norm_output)  # every argument is checked before a model loads
    seen = check_unseen(args.drafter, prompts, args.allow_training_prompts)
    uri = None
    if not args.no_tracking and optional("mlflow", tracking_asked(args, EXPERIMENT),
                                         "specrank decode: MLflow is not installed, so the run logs nothing to it "
                                         "(as with --no-tracking)"):
        from specrank.tracking import check_tracking_uri, resolve_tracking_uri

        uri = check_tracking_uri(resolve_tracking_uri(args.tracking_uri))  # before any model loads
    if workers is not None:  # the workers load the models; the driver loads none
        from specrank.decode.runs.workers import Models, RunSpec, decode_on_workers, summary

        run = RunSpec(args.out, config, args.speculation if lossy else "record", args.verification_rule, seen)
        models = Models(args.target, args.drafter, args.device, args.dtype, args.eagle3_layers,
                        args.specforge_norm_output, args.graphs)
        outcome = decode_on_workers(workers, models, prompts, prompts_path, [run], args.shard_size,
                                    progress=not args.no_progress)
        print(summary(outcome, args.out))
        if uri is not None:
            from specrank.tracking.decode import log_decode, workers_decode_metrics

            manifest = read_json(Path(args.out, "manifest.json"), "run manifest")
            log_decode(uri, args.experiment, args.run_name, args.out, manifest,
                       workers_decode_metrics(outcome, args.out), prompts_path)
        return 0
    check_target_spec(args.target)
    target = load_target(args.target, args.device, args.dtype, args.graphs)
    drafter = load_drafter(args.drafter, target, args.eagle3_layers, args.specforge_norm_output)
    manifest = with_trained_prompts(build_manifest(target, drafter, config, prompts_path, args.shard_size), seen)
    with removing_new_dirs(args.out):
        if lossy:
            from specrank.decode.runs import lossy_decode_run

            timer = lossy_decode_run(target, drafter, prompts, args.out, config, manifest, rule, args.speculation,
                                     args.shard_size, progress=not args.no_progress)
        else:
            timer = record_run(target, drafter, prompts, args.out, config, manifest, args.shard_size,
                               progress=not args.no_progress)
    if timer.rounds:
        print(f"{timer.rounds} rounds, {timer.tokens / timer.rounds - 1:.2f} accepted/round, "
              f"{timer.tokens / timer.total:.1f} tokens/s -> {args.out}")
    else:
        print(f"nothing to do: every prompt is already recorded in {args.out}")
    if uri is not None:
        from specrank.tracking.decode import decode_metrics, log_decode

        log_decode(uri, args.experiment, args.run_name, args.out, manifest, decode_metrics(timer, args.out),
                   prompts_path)
    return 0

