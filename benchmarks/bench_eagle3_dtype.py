"""A trained EAGLE-3 head saved in bf16: its size against the fp32 save, and greedy tokens per
target pass at B = 59 on the held-out prompts of its training run, bf16 head against fp32 head.

Goals: the bf16 save is at most half the fp32 save's size; its tokens per pass are within 2% of the
fp32 head's. Both heads run in the float32 target (the bf16 weights are upcast on load).

    make drafter                                    # first: the default head
    python benchmarks/bench_eagle3_dtype.py --head ~/.cache/specrank/drafters/smollm2-eagle3 [--limit N]

Measured (2026-12-01, quiet 2-core CPU, 6 min; the head of `make drafter`: 1,200 steps, 18 minutes, draft
vocabulary 16,384, target hidden_states [2, 15, 27]):
    fp32 save 29.70 MiB, bf16 save 14.89 MiB: ratio 0.5014; floating-point tensors alone 0.5000
    fp32 head 2.1076 tokens/pass, bf16 head 2.1048 (353 rounds each, 7 held-out prompts): -0.13%
The files' ratio is above 0.5 by the 176 KiB of integer tables every engine reads in their own dtypes
(``d2t`` int64 (16384,), ``t2d`` bool (49152,)), which a cast to bf16 cannot halve.
"""

from __future__ import annotations

from harness import greedy_decode, write_results  # benchmarks/harness.py, beside this script
import argparse
import json
import tempfile
from pathlib import Path

import torch


def sizes(directory: Path) -> tuple[int, int]:
    """(bytes of the whole directory's head files, bytes of its floating-point tensors)."""
    from specrank.decode.loading.eagle3_formats import read_state

    files = sum((directory / n).stat().st_size for n in ("config.json", "model.safetensors") if (directory / n).exists())
    floats = sum(v.numel() * v.element_size() for v in read_state(directory).values() if v.is_floating_point())
    return files, floats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", type=Path, required=True, help="a head written by `specrank drafter train` (fp32)")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="decode only the first N held-out prompts")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from specrank.decode.loading.eagle3 import load_eagle3
    from specrank.decode.loading.eagle3_export import export_head
    from specrank.decode.loading.targets import load_target
    from specrank.decode.prompts import default_prompts_path, read_prompts

    held = set(json.loads((args.head / "training.json").read_text())["params"]["heldout_prompts"].split(","))
    prompts = [p for p in read_prompts(default_prompts_path()) if p.prompt_id in held][: args.limit]
    target = load_target(args.target)
    with tempfile.TemporaryDirectory() as tmp:
        fp32_dir, bf16_dir = Path(tmp) / "fp32", Path(tmp) / "bf16"
        export_head(args.head, fp32_dir, "sglang", "fp32")
        export_head(args.head, bf16_dir, "sglang", "bf16")
        (f32_files, f32_floats), (b16_files, b16_floats) = sizes(fp32_dir), sizes(bf16_dir)
        print(f"fp32 save {f32_files / 2**20:.2f} MiB, bf16 save {b16_files / 2**20:.2f} MiB: ratio "
              f"{b16_files / f32_files:.4f} (goal <= 0.5); floating-point tensors alone {b16_floats / f32_floats:.4f} "
              f"(d2t int64 and t2d bool keep their dtypes)")
        result = {}
        for name, directory in (("fp32", fp32_dir), ("bf16", bf16_dir)):
            result[name] = greedy_decode(target, load_eagle3(directory, target), prompts, args.max_new_tokens)
            print(f"{name} head: {result[name]['tokens_per_pass']:.4f} tokens/pass over {result[name]['rounds']} rounds "
                  f"on {len(prompts)} held-out prompts (greedy, B = 59)")
    change = result["bf16"]["tokens_per_pass"] / result["fp32"]["tokens_per_pass"] - 1
    print(f"bf16 vs fp32 tokens per pass: {100 * change:+.2f}% (goal within 2%)")
    write_results("bench_eagle3_dtype", {"fp32_mib": f32_files / 2**20, "bf16_mib": b16_files / 2**20,
                                         "size_ratio": b16_files / f32_files, "goal_size_ratio": 0.5,
                                         "decodes": result, "tokens_per_pass_change_pct": 100 * change,
                                         "goal_change_pct": 2.0})


if __name__ == "__main__":
    main()
