"""Benchmark ``specrank tree-config``: the grid's wall time, and its predictions against specrank's online
``Decoder`` for the top 3 settings on the same held-out prompts.

    python benchmarks/bench_tree_config.py                       # SmolLM2 + the shipped head, the default grid
    python benchmarks/bench_tree_config.py --limit 2 --max-new-tokens 8 --topk 1,2 --num-steps 2,3 \\
        --num-draft-tokens 4 --repeats 1 --bootstrap 200         # a smoke run

Goals: the grid (>= 24 settings) in <= 30 minutes on 2 cores; for each of the top 3 settings the realized
acceptance length (1 + accepted draft tokens per round) inside the predicted 95% interval; the realized
speed ranking of the three equal to the predicted one. A vLLM static tree (``--vllm-tree``) is decoded online
on a pool that expands every node (``StaticTreeSelection``), so its acceptance is vLLM's but its drafting costs
more than vLLM's, which drafts only the tree. Prints one JSON object, writes
benchmarks/results/tree_config.json, exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from harness import write_results  # benchmarks/harness.py, beside this script

GOAL_MINUTES = 30.0
GOAL_SETTINGS = 24


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="eagle3:default")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--topk", default="1,2,4,8")
    parser.add_argument("--num-steps", default="2,3,4,5,6")
    parser.add_argument("--num-draft-tokens", default="4,8,16,32")
    parser.add_argument("--vllm-tree", action="append", default=[], help="also a vLLM static tree (repeatable)")
    parser.add_argument("--vllm-version", default="0.20.2",
                        help="the vLLM release a --vllm-tree is scored for (static trees: 0.10.1 to 0.20.2)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="keep the tree-config outputs here (default: a temporary dir)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "tree-config"
        grid_minutes = run_grid(args, out)
        table = __import__("pandas").read_parquet(out / "tree_config_table.parquet")
        checked = check_online(args, table)
    exact = table[table["outside"] == 0]
    top = checked["settings"]
    result = {
        "settings": int(len(table)), "exact_settings": int(len(exact)), "grid_minutes": grid_minutes,
        "goal_minutes": GOAL_MINUTES, "goal_settings": GOAL_SETTINGS, "threads": args.threads, "device": args.device,
        "prompts": args.limit, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
        "top3": top, "speed_ranking_same": checked["ranking_same"],
        "acceptance_within_interval": all(t["within_interval"] for t in top),
    }
    result["goals_met"] = bool(len(exact) >= GOAL_SETTINGS and grid_minutes <= GOAL_MINUTES
                               and result["acceptance_within_interval"] and result["speed_ranking_same"])
    text = json.dumps(result, indent=2)
    print(text)
    write_results("tree_config", result)
    return 0 if result["goals_met"] else 1


def run_grid(args, out: Path) -> float:
    from specrank.cli import main as cli

    argv = ["tree-config", "--target", args.target, "--drafter", args.drafter, "--limit", str(args.limit),
            "--max-new-tokens", str(args.max_new_tokens), "--temperature", str(args.temperature), "--topk", args.topk,
            "--num-steps", args.num_steps, "--num-draft-tokens", args.num_draft_tokens, "--repeats",
            str(args.repeats), "--bootstrap", str(args.bootstrap), "--threads", str(args.threads), "--device",
            args.device, "--out", str(out), "--no-tracking"] + [a for t in args.vllm_tree for a in ("--vllm-tree", t)] \
        + (["--vllm-version", args.vllm_version] if args.vllm_tree else [])
    start = time.perf_counter()
    rc = cli(argv)
    if rc != 0:
        sys.exit(rc)
    return (time.perf_counter() - start) / 60


def check_online(args, table) -> dict:
    """The top 3 exact settings decoded online on the same prompts (each prompt by every setting, rotated)."""
    import numpy as np
    import torch

    from specrank.decode import Decoder, PoolShape, StaticTreeSelection, load_drafter, load_target
    from specrank.decode.config import DecodeConfig
    from specrank.decode.prompts import default_prompts_path, encode_prompts, read_prompts
    from specrank.engines.tree_settings import row_setting, StaticTreeSetting
    from specrank.selection import PromptBootstrap

    def online(row):
        """The setting of a table row as specrank decodes it: a beam's draft selection, or the static tree."""
        st = row_setting(row)
        if isinstance(st, StaticTreeSetting):
            return Decoder(target, drafter, StaticTreeSelection(st.tree), budget=st.budget,
                           shape=PoolShape(*st.tree.full_pool()))
        return Decoder(target, drafter, "draft", budget=st.budget, shape=PoolShape(*st.draft_shape))

    torch.set_num_threads(args.threads)
    target = load_target(args.target, args.device, "float32")
    drafter = load_drafter(args.drafter, target)
    prompts = read_prompts(default_prompts_path(), limit=args.limit)
    top = table[table["outside"] == 0].head(3)
    decoders = {r["setting"]: online(r) for _, r in top.iterrows()}
    config = DecodeConfig(PoolShape(1, int(top["num_steps"].max()), 1), 1, 0, args.temperature, args.max_new_tokens)
    encoded = encode_prompts(target, prompts, config)
    next(iter(decoders.values())).generate(encoded[0], max_new_tokens=8, temperature=args.temperature)  # warm-up
    sums = decode_rotated(args, decoders, encoded, [p.prompt_id for p in prompts])
    boot = PromptBootstrap(np.arange(len(prompts)), n_resamples=args.bootstrap)
    cols = {f"{s}|{j}": sums[s][:, j] for s in decoders for j in range(4)}
    tot = boot.totals(cols)
    out = []
    for _, r in top.iterrows():
        s = r["setting"]
        length = tot.ratio([(f"{s}|0", 1)], [(f"{s}|1", 1)])
        speed = tot.ratio([(f"{s}|2", 1)], [(f"{s}|3", 1)])
        out.append({"setting": s, "predicted_length": float(r["draft_length"]),
                    "predicted_interval": [float(r["draft_low"]), float(r["draft_high"])],
                    "realized_length": length.point, "realized_interval": [length.low, length.high],
                    "within_interval": bool(r["draft_low"] <= length.point <= r["draft_high"]),
                    "predicted_tokens_per_s": float(r.get("tokens_per_s", float("nan"))),
                    "realized_tokens_per_s": speed.point, "realized_tokens_per_s_interval": [speed.low, speed.high]})
    predicted = [o["setting"] for o in sorted(out, key=lambda o: -o["predicted_tokens_per_s"])]
    realized = [o["setting"] for o in sorted(out, key=lambda o: -o["realized_tokens_per_s"])]
    return {"settings": out, "ranking_same": predicted == realized}


def decode_rotated(args, decoders: dict, encoded, prompt_ids) -> dict:
    """Each prompt decoded by every setting, the order rotated per prompt: per setting, per prompt, the sum of
    acceptance lengths, the rounds, the tokens and the decode seconds (prefill left out)."""
    import numpy as np

    sums = {s: np.zeros((len(encoded), 4)) for s in decoders}
    names = list(decoders)
    for i, ids in enumerate(encoded):
        for s in names[i % len(names):] + names[: i % len(names)]:
            st = decoders[s].generate(ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                      seed=0, prompt_id=prompt_ids[i]).stats
            sums[s][i] = [sum(st.accepted) + st.rounds, st.rounds, st.tokens,
                          st.seconds - st.time_split.get("prefill", 0.0)]
    return sums


if __name__ == "__main__":
    sys.exit(main())
