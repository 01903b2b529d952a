"""Put first-step rerankers into the package as the vLLM plugin's ``reranker:default``: one per law, a pointwise
LightGBM over the ``first_step`` features (what a chain engine knows at its first draft step, as the engine sees
them), fitted on fans of every third Spec-Bench prompt (none bundled with the evaluation prompts), 64 tokens each,
with a model card naming those prompts by sha256.

    .venv/bin/python scripts/ship_first_step.py --work runs/ship-first-step     # records the fans, then fits

The fans are recorded under ``--work`` (resumed when rerun); each zip is written atomically.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from specrank.decode import load_drafter, load_target
from specrank.decode.prompts import prompt_digest, read_prompts, spec_bench_path, spec_bench_text
from specrank.decode.strategies.static_tree import StaticTreeSelection
from specrank.experiments.tree_config.chain_choice import ChainChoice
from specrank.experiments.tree_config.configure import TreeConfigRun, record_pool
from specrank.featurize.engine import engine_visible
from specrank.featurize.storage import featurize_run
from specrank.law import Law
from specrank.rerankers import GBMReranker
from specrank.rerankers.defaults import shipped_first_step_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(spec_bench_path())[::3]
    prompts_path = work / "prompts.jsonl"
    if not prompts_path.is_file():
        prompts_path.write_text(spec_bench_text(prompts))
    target = load_target("smollm2")
    drafter = load_drafter("eagle3:default", target)
    choice = ChainChoice(1, 10, 1)
    for t in (float(v) for v in args.temperatures.split(",")):
        run = TreeConfigRun(str(prompts_path), t, 64, 0)
        run_dir = record_pool(target, drafter, run, run.choice_config(choice), work / f"fan-t{t:g}",
                              StaticTreeSelection(choice.chain))
        features = engine_visible(featurize_run(run_dir))
        model = GBMReranker(features="first_step", n_jobs=args.threads).fit(features)
        model.card_ = {"reranker": "first_step", "temperature": t, "data": "spec_bench.jsonl (every third prompt)",
                       "rounds": int(features["round"].size // 10), "prompts": len(prompts),
                       "command": "python scripts/ship_first_step.py " + " ".join(sys.argv[1:]),
                       "training_prompts": sorted({prompt_digest(p.text) for p in prompts})}
        print(model.save(shipped_first_step_dir(Law(t).name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
