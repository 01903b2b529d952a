"""``specrank drafter``: drafter tools (``fit-exit-head`` fits an early-exit drafter's linear head;
``train``, from ``specrank.commands.drafter_train``, trains an EAGLE-3-format head; ``export`` writes
an EAGLE-3 head for SGLang, vLLM or EAGLE)."""

from __future__ import annotations

import sys
from pathlib import Path

from specrank.commands.args import (add_device_arguments, add_target_argument, at_least,
                                    finite_float)
from specrank.commands.drafter_train import add_train_parser
from specrank.outputs import check_distinct, check_output_file

HELP = ("Drafter tools: fit-exit-head fits a linear exit head for an early-exit drafter; train trains an EAGLE-3 "
        "head; export writes an EAGLE-3 head for SGLang, vLLM or EAGLE.")
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
    from specrank.decode.loading.eagle3 import default_head_dir
    from specrank.decode.loading.eagle3_export import CONVENTION_NOTE, export_head

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


def text_windows(tokenizer, files, window: int, max_tokens: int) -> list[list[int]]:
    """Token windows of ``window`` ids over the concatenated files, at most ``max_tokens`` ids in all."""
    if window < 2 or max_tokens < 2:
        raise ValueError("--window and --max-tokens must be at least 2")
    ids: list[int] = []
    for path in files:
        ids += tokenizer(path.read_text(), add_special_tokens=False)["input_ids"]
    ids = ids[:max_tokens]
    windows = [ids[i : i + window] for i in range(0, len(ids), window)]
    return [w for w in windows if len(w) >= 2]


def run_fit_exit_head(args) -> int:

    from transformers.utils import logging as hf_logging

    from specrank.decode.core import parse_device
    from specrank.decode.loading.early_exit import (
        exit_agreement,
        exit_regression_data,
        save_exit_head,
        solve_exit_head,
    )
    from specrank.decode.loading.targets import (
        check_target_spec,
        load_target,
        parse_dtype,
        target_config,
        target_tokenizer,
        weight_files,
    )

    missing = [str(p) for p in args.text if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"--text: text file not found: {missing[0]}")
    check_output_file(args.out)
    parse_device(args.device)
    parse_dtype(args.dtype)
    path = check_target_spec(args.target)
    weights = weight_files(path) if path is not None and path.is_dir() else []
    check_distinct({"--out": args.out}, {**{f"--text {p}": p for p in args.text},
                                        **{f"target weights {p.name}": p for p in weights}})
    hf_logging.disable_progress_bar()  # a refusal below is the only line on stderr
    num_layers = target_config(args.target)["num_hidden_layers"]
    if not 1 <= args.layers < num_layers:
        raise ValueError(f"--layers must be in 1..{num_layers - 1} (the target has {num_layers}), got {args.layers}")
    windows = text_windows(target_tokenizer(args.target), args.text, args.window, args.max_tokens)
    n_held = int(round(len(windows) * args.holdout)) if len(windows) > 1 else 0
    if len(windows) - n_held < 1:
        raise ValueError(f"--text: not enough text: need at least one window of 2 tokens to fit on "
                         f"({', '.join(str(p) for p in args.text)})")
    target = load_target(args.target, args.device, args.dtype, args.graphs)
    x, y = exit_regression_data(target, args.layers, windows[: len(windows) - n_held])
    head = solve_exit_head(target, x, y, args.ridge)
    save_exit_head(args.out, head, args.layers, target)
    print(f"fitted exit head at {args.layers} layers on {len(x)} positions -> {args.out}")
    if n_held:
        hx, hy = exit_regression_data(target, args.layers, windows[len(windows) - n_held :])
        before, after = exit_agreement(target, None, hx, hy), exit_agreement(target, head, hx, hy)
        print(f"held-out top-1 agreement with the target ({len(hx)} positions): {before:.3f} -> {after:.3f}")
    return 0
