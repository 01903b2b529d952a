"""Greedy identity on long prompts: specrank's decoder against Hugging Face ``generate`` on a plain load of the same
weights, on Spec-Bench prompts longer than the target's sliding window.

    python benchmarks/bench_target_exact.py --target gemma3-270m       # 5 prompts past Gemma 3's window of 512

The reference loads the target's converted directory with ``AutoModelForCausalLM`` as a user would (its default
attention, its own sliding-window masks) and decodes greedily; specrank decodes the same token ids with every
strategy given. A prompt is identical when both emit the same tokens (up to and including an end-of-sequence
token). The control decodes the first prompt with the windows dropped (one mask for every layer), which must
differ where the prompt crosses the window. Writes ``benchmarks/results/target_exact_<target>.json``; exits 1
unless every prompt is identical and the control differs.
"""

from __future__ import annotations

import argparse
import sys
import time

from harness import cpu_model, write_results  # benchmarks/harness.py, beside this script


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="gemma3-270m")
    parser.add_argument("--drafter", default="early-exit:6")
    parser.add_argument("--prompts", type=int, default=5, help="how many Spec-Bench prompts")
    parser.add_argument("--min-tokens", type=int, default=None,
                        help="only prompts longer than this (default: the target's sliding window)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--strategies", default="draft,root", help="comma-separated lossless strategies")
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from specrank.decode import load_drafter, load_target
    from specrank.decode.loading.target_spec import resolve_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    drafter = load_drafter(args.drafter, target)
    window = target.layout.window
    floor = args.min_tokens if args.min_tokens is not None else (window or 0)
    chosen = long_prompts(target, floor, args.prompts)
    reference_model = AutoModelForCausalLM.from_pretrained(resolve_target(args.target), dtype=torch.float32).eval()
    rows, references, strategies = [], [], args.strategies.split(",")
    for prompt_id, task, ids in chosen:
        row, reference = prompt_row(args, target, drafter, reference_model, strategies, prompt_id, task, ids)
        rows.append(row)
        references.append(reference)
    control = None if not chosen or window is None else windows_dropped(args, target, drafter, strategies[0], chosen,
                                                                          references)
    identical = sum(all(r[s]["identical"] for s in strategies) for r in rows)
    met = identical == len(rows) == args.prompts and (control is None or control["differs"])
    figures = {"target": args.target, "drafter": args.drafter, "sliding_window": window, "min_tokens": floor,
               "max_new_tokens": args.max_new_tokens, "budget": args.budget, "strategies": strategies,
               "cpu_model": cpu_model(), "identical_prompts": identical, "prompts": rows, "control": control,
               "goal": f"{args.prompts}/{args.prompts} identical, control differs", "met": met}
    path = write_results(f"target_exact_{args.target.replace('/', '_')}", figures)
    print(f"{identical}/{len(rows)} prompts identical (goal {args.prompts}/{args.prompts}): "
          f"{'met' if met else 'MISSED'}; {path}")
    return 0 if met else 1


def long_prompts(target, floor: int, n: int) -> list[tuple]:
    """The first ``n`` Spec-Bench prompts longer than ``floor`` target tokens: (id, task, token ids)."""
    from specrank.decode.prompts import encode_prompt, read_prompts, spec_bench_path

    chosen = []
    for p in read_prompts(spec_bench_path()):
        ids = encode_prompt(target.tokenizer, p.text)
        if len(ids) > floor:
            chosen.append((p.prompt_id, p.task, ids))
        if len(chosen) == n:
            break
    return chosen


def prompt_row(args, target, drafter, reference_model, strategies, prompt_id: str, task: str, ids) -> tuple[dict, list]:
    """One prompt: the reference's greedy output, then each strategy's against it; (its row, the reference)."""
    import torch

    from specrank.decode import Decoder
    from specrank.decode.engine.prompt import eos_token_ids, final_output

    start = time.perf_counter()
    with torch.no_grad():
        ref = reference_model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False)
    reference = final_output(ref[0, len(ids):].tolist(), eos_token_ids(target), args.max_new_tokens)
    row = {"prompt_id": prompt_id, "task": task, "prompt_tokens": len(ids), "reference_s":
           round(time.perf_counter() - start, 2), "reference_text": target.tokenizer.decode(reference)}
    for strategy in strategies:
        start = time.perf_counter()
        out = Decoder(target, drafter, strategy, budget=args.budget).generate(
            ids, max_new_tokens=args.max_new_tokens, temperature=0)
        row[strategy] = {"identical": out.tokens == reference, "seconds": round(time.perf_counter() - start, 2),
                         "tokens_per_target_pass": round(out.stats.tokens / max(out.stats.passes, 1), 3),
                         "first_difference": next((i for i, (a, b) in enumerate(zip(out.tokens, reference))
                                                   if a != b), None)}
    print(f"{prompt_id} ({len(ids)} tokens): " + ", ".join(
        f"{s} {'identical' if row[s]['identical'] else 'DIFFERENT'}" for s in strategies), flush=True)
    return row, reference


def windows_dropped(args, target, drafter, strategy: str, chosen, references) -> dict:
    """The control: the first prompt decoded with the sliding windows dropped (one mask for every layer), which
    must differ from the reference where the prompt crosses the window."""
    from specrank.decode import Decoder
    from specrank.decode.attention import AttentionLayout

    layout, target.layout = target.layout, AttentionLayout()
    try:
        out = Decoder(target, drafter, strategy, budget=args.budget).generate(
            chosen[0][2], max_new_tokens=args.max_new_tokens, temperature=0)
    finally:
        target.layout = layout
    control = {"prompt_id": chosen[0][0], "differs": out.tokens != references[0],
               "text": target.tokenizer.decode(out.tokens)}
    print(f"control (windows dropped) on {control['prompt_id']}: "
          f"{'differs, as it must' if control['differs'] else 'IDENTICAL: the check cannot fail'}")
    return control


if __name__ == "__main__":
    sys.exit(main())
