"""The vLLM plugin keeps vLLM's output law at T = 1 (docs/vllm.md, "Lossless"): one prompt decoded ``--samples``
times, seeds 0..n-1, in vLLM with the shipped head, alone, with the plugin, with the plugin drafting every first
token as the head's second choice (``specrank.engines.vllm.runner.second_choice``: every chain moved), and with the
plugin under a deliberately wrong rejection rule (the negative control: a rejected first draft token is followed by a
fresh draw from the target's whole row, ``runner.redraw_after_rejection``).

    python benchmarks/bench_vllm_law.py                 # 3,000 decodes a setting, k = 3

The law checked is that of the second and third tokens given the first (the prefill's draw, which no draft
touches) is the prompt's likeliest: they come from the first chain, drafted with no retained rows, and, after a
one-token step, from the second, drafted with them. The exact law comes from the target's rows in float32
(``specrank.decode.output_law``); cells expecting fewer than 5 are pooled. vLLM's CPU build samples T > 0
speculative rounds from garbage unless its ``expand_batch_to_tokens`` is fixed: every run here runs fixed
(the vLLM runner's ``law`` mode). Goals: p >= 0.001 without the plugin and with it (either rule),
p < 0.001 under the wrong rejection rule. Writes benchmarks/results/vllm_law.json; exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import sys

from harness import engine_arguments, prepare_vllm, vllm_run, write_results  # benchmarks/harness.py, beside this script

ALPHA = 1e-3


def settings(args) -> dict:
    """name -> (reranker or None, the vLLM runner's request fields)."""
    from specrank.rerankers.defaults import shipped_first_step_dir

    plugin = str(shipped_first_step_dir("sampling")) if args.reranker == "reranker:default" else args.reranker
    return {"head": (None, {}), "plugin": (plugin, {}), "plugin_second_choice": (plugin, {"draft_rule": "second"}),
            "plugin_wrong_rule": (plugin, {"wrong_rule": "redraw"})}


def main(argv=None) -> int:
    from specrank.decode.prompts import default_prompts_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reranker", default="reranker:default", help="the T = 1 first-step reranker")
    parser.add_argument("--prompts", default=str(default_prompts_path()))
    parser.add_argument("--prompt-id", default="qa-04",
                        help="the prompt decoded (default: a bundled one whose first token is nine times in ten the"
                             " same, and whose next two vary)")
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--k", type=int, default=3)
    engine_arguments(parser, "vllm_law", threads=1)
    args = parser.parse_args(argv)
    args.limit = None

    import torch

    from specrank.decode.loading.target_spec import resolve_target
    from specrank.decode.loading.targets import load_causal_lm
    from specrank.decode.output_law import two_token_law

    prep = prepare_vllm(args)
    prompt = next((p for p in prep["prompts"] if p["id"] == args.prompt_id), None)
    if prompt is None:
        sys.exit(f"bench_vllm_law.py: no prompt {args.prompt_id!r} in {args.prompts}")
    model, _ = load_causal_lm(resolve_target("smollm2"), "cpu", torch.float32)
    with torch.no_grad():
        first = int(model(torch.tensor([prompt["ids"]])).logits[0, -1].argmax())
    law = two_token_law(model, prompt["ids"] + [first], 1.0, threshold=5 / args.samples)
    rows = {}
    for name, (reranker, fields) in settings(args).items():
        request = {"model": prep["model"], "head": prep["head"], "k": args.k, "prompts": [prompt], "max_tokens": 3,
                   "temperatures": [1.0], "mode": "law", "samples": args.samples, "max_num_seqs": 64,
                   **fields}
        env = {"SPECRANK_TEMPERATURE": "1", "SPECRANK_VLLM_REQUESTS": "64", "SPECRANK_VLLM_ROWS": "8"}
        tokens = vllm_run(args, name, request, reranker, env)["tokens"]
        pairs = [t[1:3] for t in tokens if len(t) >= 3 and t[0] == first]
        rows[name] = {"decodes": len(tokens), "with_first_token": len(pairs), "pvalue": law.pvalue(pairs)}
    passed = all(rows[name]["pvalue"] >= ALPHA for name in ("head", "plugin", "plugin_second_choice"))
    control = rows["plugin_wrong_rule"]["pvalue"] < ALPHA
    figures = {"settings": rows, "prompt_id": prompt["id"], "first_token": first, "k": args.k,
               "samples": args.samples, "alpha": ALPHA, "reranker": args.reranker, "lossless": passed,
               "negative_control_fails": control}
    write_results(args.name, figures)
    print(json.dumps(figures, indent=2))
    return 0 if passed and control else 1


if __name__ == "__main__":
    sys.exit(main())
