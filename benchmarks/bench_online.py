"""Benchmark online decoding: draft, reranked and root selection side by side on the embedded default.

Trains a Rows reranker on rounds recorded (greedy, B = 8) from training prompts, then runs every rule
on held-out prompts (order rotated per prompt, after warm-up; root pass run serially) and reports
tokens/s, tokens per target pass, realized acceptance with prompt-bootstrap intervals, the reranked
decoder's realized gain over draft selection, speed ratios, and the share of round time spent on
reranker inference plus online feature computation.

    python benchmarks/bench_online.py                       # SmolLM2-135M, early-exit:8, 6 + 14 prompts
    python benchmarks/bench_online.py --prompts 3 --train-per-task 1 --max-new-tokens 16   # quick look

Prints one JSON object; exits 1 when reranker time exceeds --max-rerank-share of round time.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="early-exit:8")
    parser.add_argument("--prompts", type=int, default=6, help="held-out prompts, one per task of the bundled set")
    parser.add_argument("--train-per-task", type=int, default=2, help="training prompts per task for the reranker")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--train-tokens", type=int, default=64)
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--max-rerank-share", type=float, default=0.03)
    args = parser.parse_args(argv)

    import torch

    from specrank.decode.compare import acceptance_summary, decoder_table, realized_gain, speed_ratios
    from specrank.decode.drafters import load_drafter
    from specrank.decode.loop import DecodeConfig, decode_prompt
    from specrank.decode.models import load_target
    from specrank.decode.online import make_strategy
    from specrank.decode.online_loop import run_protocol
    from specrank.decode.prompts import default_prompts_path, encode_prompt, read_prompts
    from specrank.decode.record import rounds_table
    from specrank.featurize import featurize_rounds
    from specrank.rerankers import GBMReranker

    torch.set_num_threads(args.threads)
    target = load_target(args.target, "cpu", "float32")
    drafter = load_drafter(args.drafter, target)
    prompts = read_prompts(default_prompts_path())
    encode = lambda p: (p.prompt_id, p.task, encode_prompt(target.tokenizer, p.text))  # noqa: E731
    held_out = [encode(prompts[8 * i]) for i in range(args.prompts)]
    train = [encode(prompts[8 * t + 1 + j]) for t in range(len(prompts) // 8) for j in range(args.train_per_task)]

    record_cfg = DecodeConfig(budget=args.budget, extra=0, max_new_tokens=args.train_tokens)
    records = []
    for pid, task, ids in train:
        records += decode_prompt(target, drafter, ids, record_cfg, pid, task)[1]
    shape = record_cfg.shape
    features = featurize_rounds(rounds_table(records, shape.size, shape.topk),
                                {"temperature": 0.0, "topk": shape.topk})
    reranker = GBMReranker(features="rows", n_estimators=200, num_leaves=31, n_jobs=1).fit(features)

    config = DecodeConfig(budget=args.budget, extra=0, max_new_tokens=args.max_new_tokens)
    strategies = {"draft": make_strategy("draft"), "reranked": make_strategy("reranked", reranker, "bench"),
                  "root": make_strategy("root")}
    rounds, decodes = run_protocol(target, drafter, held_out, config, strategies, warmup=1)
    table = decoder_table(decodes).set_index("decoder")
    acc = acceptance_summary(rounds, args.bootstrap).set_index(["decoder", "statistic"])
    speed = speed_ratios(decodes, "draft", args.bootstrap).set_index("decoder")
    gain = realized_gain(rounds, "reranked", "draft", args.bootstrap)
    per_round_rerank = table.loc["reranked", "rerank_s"] / table.loc["reranked", "rounds"]
    round_time = (table.loc["reranked", "seconds"] - table.loc["reranked", "prefill_s"]) / table.loc["reranked", "rounds"]
    result = {
        "target": args.target, "drafter": args.drafter, "budget": args.budget, "threads": args.threads,
        "held_out_prompts": len(held_out), "training_rounds": len(records),
        "decoders": {d: {"tokens_per_s": float(r["tokens_per_s"]), "tokens_per_pass": float(r["tokens_per_pass"]),
                         "passes_per_round": float(r["passes"] / r["rounds"]), "rounds": int(r["rounds"]),
                         "realized": list(acc.loc[(d, "realized"), ["mean", "low", "high"]].astype(float)),
                         "speed_vs_draft": list(speed.loc[d, ["ratio", "low", "high"]].astype(float)),
                         "seconds_split": {k: float(r[k]) for k in ("prefill_s", "draft_s", "root_pass_s", "tree_pass_s",
                                                                    "rerank_s", "bookkeeping_s")}}
                     for d, r in table.iterrows()},
        "reranked_minus_draft_realized": list(gain),
        "rerank_ms_per_round": 1000 * per_round_rerank,
        "rerank_share_of_round": per_round_rerank / round_time,
    }
    print(json.dumps(result, indent=2))
    return int(result["rerank_share_of_round"] > args.max_rerank_share)


if __name__ == "__main__":
    sys.exit(main())
