"""``specrank drafter train``: the subcommand's arguments and its run (registered by ``commands/drafter.py``)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from specrank.commands import tracked
from specrank.commands.args import add_device_arguments, add_target_argument, at_least
from specrank.decode.config import check_temperature
from specrank.decode.core import parse_device
from specrank.decode.loading.target_spec import check_target_spec
from specrank.decode.loading.targets import load_target
from specrank.decode.prompts import drafter_prompts_path, read_prompts
from specrank.drafter_training.data import GenerationSpec
from specrank.drafter_training.fit import fit_drafter, hidden_layers
from specrank.drafter_training.train import TrainConfig
from specrank.outputs import check_output_dir
from specrank.scale import add_worker_arguments, preflight, workers_from_args

HELP = "train an EAGLE-3-format head by self-distillation from the target (resumes in --out)"


def add_train_parser(actions) -> None:
    """Add the ``train`` action to the ``specrank drafter`` subparsers."""
    p = actions.add_parser("train", help=HELP, description=HELP)
    add_target_argument(p)
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL prompt file, split into training and held-out prompts (default: the bundled "
                        "training-only prompts, data/drafter_prompts.jsonl, which share no text with the evaluation sets)")
    p.add_argument("--limit", type=at_least(1), default=None, help="use the first N prompts of --prompts")
    p.add_argument("--out", required=True, type=Path,
                   help="head directory (the SpecForge/SGLang layout; `specrank drafter export` writes the others)"
                        " and checkpoints")
    p.add_argument("--layers", type=int, nargs=3, default=None,
                   help="target hidden_states indices (0 = embeddings; default 2, L//2, L-3)")
    p.add_argument("--samples", type=at_least(0), default=3, help="sampled continuations per prompt besides the greedy one")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the generated data")
    p.add_argument("--max-new-tokens", type=at_least(1), default=256, help="tokens generated per continuation")
    p.add_argument("--gen-batch", type=at_least(1), default=8, help="continuations generated together (one shard)")
    p.add_argument("--train-prompts", type=Path, default=None,
                   help="extra JSONL prompts used only for training (e.g. the bundled data/drafter_prompts.jsonl)")
    p.add_argument("--train-limit", type=int, default=None, help="use the first N training-only prompts")
    p.add_argument("--train-samples", type=int, default=0, help="sampled continuations per training-only prompt")
    p.add_argument("--train-max-new-tokens", type=int, default=128, help="tokens per training-only continuation")
    p.add_argument("--train-gen-batch", type=int, default=64, help="training-only continuations generated together")
    p.add_argument("--draft-vocab", type=int, default=16384, help="draft vocabulary size (most frequent target argmax)")
    p.add_argument("--heldout-per-task", type=int, default=1, help="prompts per task held out for agreement")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--unroll", type=int, default=2, help="training-time test steps")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    p.add_argument("--max-len", type=int, default=512, help="window length in tokens")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--response-only", action="store_true", help="train only on rows predicting generated tokens")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--max-minutes", type=float, default=None, help="stop training (checkpointed) after this long")
    p.add_argument("--decode-prompts", type=int, default=2, help="held-out prompts decoded at the end (0: none)")
    p.add_argument("--seed", type=int, default=0)
    add_device_arguments(p, dtype=False, threads="torch CPU threads (per worker with --workers)", graphs=False)
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite:///mlflow.db)")
    p.add_argument("--no-progress", action="store_true")

    add_worker_arguments(p)  # the self-distillation data's shards; training stays in this process
    p.set_defaults(_action=run_train)


def run_train(args) -> int:
    check_output_dir(args.out)
    check_temperature(args.temperature, "--temperature")
    tracked.checked_uri(args.tracking_uri)  # every argument is checked before the model loads
    workers = workers_from_args(args)
    if workers is not None:
        preflight(workers)  # before the target loads here
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainConfig(
        steps=args.steps, unroll=args.unroll, batch_size=args.batch_size, max_len=args.max_len, lr=args.lr,
        response_only=args.response_only,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed, max_minutes=args.max_minutes,
    )
    prompts = read_prompts(args.prompts or drafter_prompts_path(), args.limit)
    parse_device(args.device)
    check_target_spec(args.target)
    hf_logging.disable_progress_bar()  # until the checks against the target's config have passed
    layers = hidden_layers(args.target, args.layers)
    if args.draft_vocab < 1:
        raise ValueError(f"--draft-vocab must be at least 1, got {args.draft_vocab}")
    if not args.no_progress:
        hf_logging.enable_progress_bar()
    target = load_target(args.target, args.device, "float32")
    spec = GenerationSpec(layers, args.samples, args.temperature, args.max_new_tokens, args.gen_batch, args.seed)
    extra = read_prompts(args.train_prompts, args.train_limit) if args.train_prompts else []
    extra_spec = GenerationSpec(layers, args.train_samples, args.temperature, args.train_max_new_tokens,
                                args.train_gen_batch, args.seed)
    final = fit_drafter(
        target, prompts, args.out, spec, cfg, args.draft_vocab, args.heldout_per_task, args.decode_prompts,
        tracking_uri=args.tracking_uri or "", progress=not args.no_progress, extra_prompts=extra, extra_spec=extra_spec,
        workers=workers,
    )
    shown = {k: round(v, 4) for k, v in final.items() if isinstance(v, float) and not k.startswith(("loss_", "lr"))}
    print(f"EAGLE-3 head saved to {args.out} after {final['step']} steps: {shown}")
    return 0
