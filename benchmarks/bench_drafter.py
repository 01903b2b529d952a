"""Trained EAGLE-3 head benchmark: agreement against training minutes, drafting-step
cost against a target step, and greedy decoding at B = 59 on the held-out prompts.

Goals for SmolLM2-135M on held-out prompts of the bundled set, from <= 30 minutes of training
on 2 CPU cores: top-1 first-token agreement >= 0.5, >= 2.0 tokens per target pass at B = 59
(greedy), a 10-node drafting step under a fifth of a target decode step.

    specrank drafter train --out HEAD ...   # first (see README / Makefile `drafter`)
    python benchmarks/bench_drafter.py --head HEAD [--max-new-tokens 128] [--limit N] [--figure curve.png]

It also prints the head's agreement binned by the target's top-1 probability on the held-out
rows and on the rows of as many training prompts (``--no-diagnostics`` skips this): what the head learnt
shows on both, what it memorised only on the training rows.
"""

from __future__ import annotations

from harness import greedy_decode, write_results  # benchmarks/harness.py, beside this script
import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch


def agreement_curve(history: list[dict]) -> list[tuple[float, int, list[float]]]:
    """(minutes, step, held-out top-1 per unrolled step) at every evaluation of the training run."""
    rows = []
    for h in history:
        steps = sorted(k for k in h if k.startswith("heldout_top1_step"))
        if steps:
            rows.append((h["minutes"], h["step"], [h[k] for k in steps]))
    return rows


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def step_costs(target, drafter, prompt_ids, nodes: int = 10, repeats: int = 20) -> tuple[float, float]:
    """Median ms of one drafting step over ``nodes`` tree nodes and of one target decode step."""
    from specrank.decode.core import causal_mask

    ids = torch.as_tensor(prompt_ids)
    n = len(ids) - 1
    cache = target.new_cache()
    _, hidden = target.forward(ids[:-1], torch.arange(n), causal_mask(n, 0), cache, drafter.hidden_layers)
    drafter.start(ids[:-1], hidden)
    root = drafter._draft_root(int(ids[-1]))
    tokens = torch.full((nodes,), int(ids[-1]))
    positions = torch.full((nodes,), root.position + 1)
    mask = torch.cat([torch.zeros(nodes, root.visible), torch.full((nodes, nodes), float("-inf")).fill_diagonal_(0)], 1)
    feed = root.feed[None].repeat(nodes, 1)

    def draft_step():
        drafter._draft_step(tokens, positions, mask, feed)
        drafter.cache.crop(root.visible)  # back to the context and the root

    def target_step():
        target.forward(ids[-1:], torch.tensor([n]), torch.zeros(1, n + 1), cache, drafter.hidden_layers)
        target.commit(cache, n, torch.zeros(0, dtype=torch.long))

    return median_ms(draft_step, repeats), median_ms(target_step, repeats)


def plot_curve(curve, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for j in range(len(curve[0][2])):
        ax.plot([c[0] for c in curve], [c[2][j] for c in curve], marker="o", label=f"unrolled step {j}")
    ax.set_xlabel("training minutes")
    ax.set_ylabel("held-out top-1 agreement")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_diagnostics(target, drafter, summary: dict, held: set[str]) -> None:
    """Agreement by target confidence on the held-out rows and on the sequences of as many training
    prompts, drawn at random (every sample of each, like the held-out rows)."""
    from specrank.drafter_training.data import load_corpus
    from specrank.drafter_training.diagnostics import agreement_by_confidence, first_token_rows, format_table

    corpus = load_corpus(*summary["params"]["data_dir"].split(","))
    held_slices = corpus.sequences(lambda pid: pid in held)
    train_ids = sorted({pid for pid, _ in corpus.docs} - held)
    drawn = {train_ids[i] for i in np.random.default_rng(0).choice(len(train_ids), min(len(held), len(train_ids)), replace=False)}
    train_slices = corpus.sequences(lambda pid: pid in drawn)
    lm_head = target.model.get_output_embeddings()
    for title, slices in (("held-out response rows", held_slices), ("training response rows", train_slices)):
        rows = first_token_rows(drafter.head, corpus, slices, drafter.draft_to_target, lm_head)
        print(format_table(f"{title} ({len(slices)} sequences)", agreement_by_confidence(rows)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, required=True, help="directory written by `specrank drafter train`")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--prompts", type=Path, default=None, help="default: the bundled set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="decode only the first N held-out prompts")
    parser.add_argument("--figure", type=Path, default=None, help="write the agreement curve as an image")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-diagnostics", action="store_true", help="skip the agreement-by-confidence tables")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from specrank.decode.loading.eagle3 import load_eagle3
    from specrank.decode.loading.targets import load_target
    from specrank.decode.prompts import default_prompts_path, encode_prompt, read_prompts

    summary = json.loads((args.head / "training.json").read_text())
    held = set(summary["params"]["heldout_prompts"].split(","))
    curve = agreement_curve(summary["history"])
    print("minutes  step  held-out top-1 per unrolled step")
    for minutes, step, top1 in curve:
        print(f"{minutes:7.2f} {step:5d}  " + "  ".join(f"{a:.3f}" for a in top1))
    if args.figure and curve:
        plot_curve(curve, args.figure)

    target = load_target(args.target)
    drafter = load_eagle3(args.head, target)
    if not args.no_diagnostics:
        print_diagnostics(target, drafter, summary, held)
    prompts = [p for p in read_prompts(args.prompts or default_prompts_path()) if p.prompt_id in held][: args.limit]
    draft_ms, target_ms = step_costs(target, drafter, encode_prompt(target.tokenizer, prompts[0].text))
    print(f"10-node drafting step {draft_ms:.1f} ms, target decode step {target_ms:.1f} ms "
          f"(ratio {draft_ms / target_ms:.3f}; goal < 0.2)")
    decode = greedy_decode(target, drafter, prompts, args.max_new_tokens)
    print(f"greedy B=59 on {len(prompts)} held-out prompts ({decode['rounds']} rounds): "
          f"{decode['tokens_per_pass']:.3f} tokens/pass (goal >= 2.0), first-token agreement "
          f"{decode['first_token_agreement']:.3f} (goal >= 0.5); per round draft {decode['draft_ms_per_round']:.0f} ms, "
          f"target {decode['target_ms_per_round']:.0f} ms")
    write_results("bench_drafter", {"draft_step_ms": draft_ms, "target_step_ms": target_ms,
                                    "step_ratio": draft_ms / target_ms, "goal_step_ratio": 0.2,
                                    "held_out_prompts": len(prompts), **decode,
                                    "goal_tokens_per_pass": 2.0, "goal_first_token_agreement": 0.5})


if __name__ == "__main__":
    main()
