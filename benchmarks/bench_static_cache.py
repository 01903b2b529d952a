"""Benchmark the drafter's KV cache: Hugging Face's DynamicCache (what the drafters use) against a StaticCache
preallocated to the longest context (target-row reuse, arXiv 2610.29210, App. D.14, runs target and drafter with a
static cache and CUDA graphs; this measures what the static cache alone gives in eager mode).

The static variant writes each forward's keys and values in place at the cache's length and rewinds a pool's
tree by moving that length back; every forward attends over the whole preallocated buffer under the same mask
padded with -inf. Both drafters grow pools along the same committed context (the root and one accepted token per
round), pools are checked to hold the same candidates, and the milliseconds per pool are compared.

    python benchmarks/bench_static_cache.py                    # early-exit:8 on SmolLM2-135M, 1 thread
    python benchmarks/bench_static_cache.py --rounds 40 --prompt-tokens 400 --max-len 1024
    python benchmarks/bench_static_cache.py --rounds 8 --max-len 320 --profile   # + the top ops of drafting

Prints one JSON object (no goal: the static cache is optional; the number decides whether it is worth adding).

Measured (2-core machine under load ~12, one thread, 8 pools each, same pools both ways): static
over dynamic 0.85x (context 200, --max-len 1024), 0.96x (context 800, --max-len 1024), 1.07x (context 200,
--max-len 320): no gain beyond the noise. A profile of drafting (--profile) puts 81% of its time in the
weight matmuls (aten::mm), 4% in attention and ~1% in the dynamic cache's concatenations, so in eager mode a
static cache cannot pay; its value in the paper's runs comes with the CUDA graphs it enables. The drafters
keep the DynamicCache.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from record import write_results  # benchmarks/record.py, beside this script


def static_drafter(drafter, max_len: int):
    """``drafter`` (a causal LM drafter) with a StaticCache of ``max_len`` positions instead of a DynamicCache."""
    import torch
    from transformers import StaticCache

    from specrank.decode.loading.standalone import CausalLMDrafter

    class StaticCacheDrafter(CausalLMDrafter):
        def _new_cache(self):
            return StaticCache(config=self.model.config, max_cache_len=max_len)

        def _forward(self, ids, positions, mask, last_only: bool = False):
            pad = max_len - mask.shape[1]  # columns past the cache length: never attended
            if pad < 0:
                raise ValueError(f"--max-len {max_len} is shorter than context + pool tree ({mask.shape[1]})")
            return super()._forward(ids, positions, torch.nn.functional.pad(mask, (0, pad), value=float("-inf")),
                                    last_only)

        def _rewind(self) -> None:
            for layer in self.cache.layers:
                if getattr(layer, "is_initialized", False):
                    layer.cumulative_length.fill_(self.committed)

    return StaticCacheDrafter(drafter.model, drafter.vocab_size, drafter.spec + "+static")


def time_pools(drafter, prompt, rounds: int, shape):
    """(pools, seconds per pool) along one committed context: each round commits the root and its best child."""
    drafter.start(prompt[:-1])
    root, pools, seconds = prompt[-1], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        pool = drafter.grow_pool(root, shape)
        seconds.append(time.perf_counter() - start)
        pools.append(pool)
        drafter.commit([root, int(pool.token[0])])
        root = int(pool.token[pool.parent == 0][0])  # the best child of the committed token
    return pools, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="early-exit:8")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--max-len", type=int, default=1024, help="static cache length (the longest context)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="also print where the dynamic drafter's time goes")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from specrank.decode import PoolShape, load_drafter, load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    dynamic = load_drafter(args.drafter, target)
    static = static_drafter(dynamic, args.max_len)
    prompt = torch.randint(100, target.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0))
    shape = PoolShape()
    time_pools(dynamic, prompt.tolist(), 1, shape)  # warm-up
    result = {}
    for name, drafter in (("dynamic", dynamic), ("static", static)):
        pools, seconds = time_pools(drafter, prompt.tolist(), args.rounds, shape)
        result[name] = {"ms_per_pool_median": 1000 * float(np.median(seconds)),
                        "ms_per_pool_mean": 1000 * float(np.mean(seconds))}
        result[name]["pools"] = pools
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            time_pools(dynamic, prompt.tolist(), 3, shape)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8), file=sys.stderr)
    same = all(np.array_equal(a.token, b.token) and np.array_equal(a.parent, b.parent)
               for a, b in zip(result["dynamic"].pop("pools"), result["static"].pop("pools")))
    ratio = result["dynamic"]["ms_per_pool_median"] / result["static"]["ms_per_pool_median"]
    figures = {"target": args.target, "drafter": args.drafter, "threads": args.threads,
               "context": [args.prompt_tokens, args.prompt_tokens + 2 * args.rounds], "max_len": args.max_len,
               **result, "same_pools": same, "static_speedup_median": ratio}
    print(json.dumps(figures, indent=2))
    write_results("bench_static_cache", figures)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
