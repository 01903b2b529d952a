"""``specrank drafter``: drafter tools (``fit-exit-head`` fits an early-exit drafter's linear head;
``train``, from ``specrank.commands.drafter_train``, trains an EAGLE-3-format head; ``export`` writes
an EAGLE-3 head for SGLang, vLLM or EAGLE)."""

from __future__ import annotations

import sys
from pathlib import Path

from specrank.commands.args import (add_device_arguments, add_target_argument, at_least,
                                    finite_float)
from specrank.commands.drafter_train import add_train_parser
from specrank.decode.loading.eagle3_named_heads import default_head_dir
from specrank.decode.loading.eagle3_export import CONVENTION_NOTE, export_head
from specrank.decode.loading.early_exit import fit_exit_head_on_text

EXPORT_HELP = "write an EAGLE-3 head (any dialect) in the layout SGLang, vLLM or EAGLE loads, in bf16, fp16 or fp32"


def add_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="drafter_action", metavar="ACTION", required=True)
    fit = actions.add_parser("fit-exit-head", help="fit a linear exit head on text (ridge regression)")
    add_target_argument(fit)
    fit.add_argument("--layers", type=at_least(1), required=True, help="K, the number of target layers the drafter runs")
    fit.add_argument("--text", nargs="+", required=True, type=Path, help="plain-text files to fit on")
    fit.add_argument("--out", required=True, type=Path, help="output .safetensors file")
    fit.add_argument("--window", type=at_least(2), default=256, help="tokens per forward window (default 256)")
    fit.add_argument("--max-tokens", type=at_least(2), default=20_000, help="tokens of text used (default 20000)")
    fit.add_argument("--holdout", type=finite_float(0.0, 0.9), default=0.1,
                     help="share of windows held out for agreement")
    fit.add_argument("--ridge", type=finite_float(0.0), default=1e-3, help="ridge penalty per row (default 1e-3)")
    add_device_arguments(fit, threads=None)
    fit.set_defaults(_action=run_fit_exit_head)

    add_train_parser(actions)
    export = actions.add_parser("export", help=EXPORT_HELP, description=EXPORT_HELP)
    export.add_argument("head", type=Path, help="EAGLE-3 head directory (EAGLE, SpecForge/SGLang, speculators or specrank), "
                                                 "or 'default' (the head `make drafter` trains)")
    export.add_argument("--format", required=True, choices=["sglang", "vllm", "eagle"], help="the engine to load it")
    export.add_argument("--out", required=True, type=Path, help="new output directory")
    export.add_argument("--dtype", default="fp32", choices=["bf16", "fp16", "fp32"], help="weight dtype (default fp32)")
    export.add_argument("--vllm-target", default=None, help="vllm: the target's name or path recorded for vLLM "
                                                         "(default: the head's own, if it names one)")
    export.add_argument("--sglang-convention", default="current", choices=["current", "legacy"],
                        help="sglang: the SGLang layer-id convention to write for when the releases before and "
                             "after its PR #25454 differ (default current); ids both read alike are written "
                             "whenever they exist")
    export.add_argument("--specforge-norm-output", default=None, choices=["after-pr879", "before-pr879"],
                        help="a SpecForge/SGLang head whose config sets norm_output: the SpecForge that wrote it")
    export.set_defaults(_action=run_export)


def run(args) -> int:
    return args._action(args)


def run_export(args) -> int:
    head = default_head_dir() if str(args.head) == "default" else args.head
    out, notes = export_head(head, args.out, args.format, args.dtype, args.vllm_target, args.sglang_convention,
                             args.specforge_norm_output)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"exported {head} as {args.format} ({args.dtype}, {size:.1f} MiB) to {out}")
    for note in notes:
        if note.startswith(CONVENTION_NOTE):  # the one line a user must see: which SGLang the file is for
            print(note, file=sys.stderr)
        else:
            print(f"note: {note}")
    return 0


def run_fit_exit_head(args) -> int:
    fit = fit_exit_head_on_text(args.target, args.layers, args.text, args.out, window=args.window,
                                max_tokens=args.max_tokens, holdout=args.holdout, ridge=args.ridge, device=args.device,
                                dtype=args.dtype, graphs=args.graphs)
    print(f"fitted exit head at {args.layers} layers on {fit.positions} positions -> {args.out}")
    if fit.held_positions:
        print(f"held-out top-1 agreement with the target ({fit.held_positions} positions): "
              f"{fit.agreement_before:.3f} -> {fit.agreement_after:.3f}")
    return 0
