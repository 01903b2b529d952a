"""One SGLang engine setting, decoded in SGLang's own environment (``.venv-sglang``; ``bench_sglang.py --part engine``
runs it as a subprocess and reads its JSON). It imports SGLang only, and only when it runs.

    SGLANG_USE_CPU_ENGINE=1 .venv-sglang/bin/python src/specrank/engines/sglang/runner.py REQUEST.json OUT.json

REQUEST: {"model", "head" (null: plain decoding), "topk", "num_steps", "num_draft_tokens", "dtype",
"attention_backend", "max_new_tokens", "temperature", "prompts": [{"id", "ids", "seed"}]}, and "seeded" (default
true: a request at T > 0 carries its prompt's seed as SGLang's sampling_seed). The plugin is on when
the environment names ``SPECRANK_RERANKER`` (SGLang loads it from its ``sglang.srt.plugins`` entry point in the
scheduler process). Every prompt goes alone, after one warm-up request, so a step's time is one request's.
OUT: {"sglang", "rows": [{"id", "output_ids", "seconds", "verify_ct", "correct_drafts", "completion_tokens"}]}.
Bad input: one line naming it, exit 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

if not __package__:
    # Run by path, Python puts this folder first on the path, where layout.py, hooks.py and the other modules here
    # would shadow any top-level modules of those names in SGLang's processes; the src/ folder instead.
    sys.path[0] = str(Path(__file__).resolve().parents[3])

KEYS = ("model", "head", "topk", "num_steps", "num_draft_tokens", "dtype", "attention_backend", "max_new_tokens",
        "temperature", "prompts")


def engine(req: dict):
    import sglang

    kwargs = dict(model_path=req["model"], device="cpu", dtype=req["dtype"], attention_backend=req["attention_backend"],
                  skip_tokenizer_init=True, disable_cuda_graph=True, disable_radix_cache=True, random_seed=0,
                  max_total_tokens=8192, max_running_requests=1, log_level="error")
    if req["head"]:
        kwargs.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=req["head"],
                      speculative_num_steps=req["num_steps"], speculative_eagle_topk=req["topk"],
                      speculative_num_draft_tokens=req["num_draft_tokens"])
    return sglang.Engine(**kwargs), sglang.__version__


def decode(llm, req: dict, prompt: dict, max_new_tokens: int) -> dict:
    params = {"temperature": float(req["temperature"]), "max_new_tokens": max_new_tokens, "ignore_eos": False}
    if req["temperature"] > 0 and req.get("seeded", True):
        params["sampling_seed"] = int(prompt["seed"])
    start = time.perf_counter()
    out = llm.generate(input_ids=prompt["ids"], sampling_params=params)
    seconds = time.perf_counter() - start
    meta = out["meta_info"]
    return {"id": prompt["id"], "output_ids": list(out["output_ids"]), "seconds": seconds,
            "completion_tokens": int(meta["completion_tokens"]), "verify_ct": int(meta.get("spec_verify_ct", 0)),
            "correct_drafts": int(meta.get("spec_num_correct_drafts", 0))}


def main(argv) -> int:
    if len(argv) != 2:
        print("usage: runner.py REQUEST.json OUT.json", file=sys.stderr)
        return 2
    try:
        req = json.loads(Path(argv[0]).read_text())
        missing = [k for k in KEYS if k not in req]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
    except (OSError, ValueError) as exc:
        print(f"{argv[0]}: {exc}", file=sys.stderr)
        return 2
    llm, version = engine(req)
    try:
        decode(llm, req, req["prompts"][0], 8)  # warm-up: the first request's one-time costs
        rows = [decode(llm, req, p, req["max_new_tokens"]) for p in req["prompts"]]
    finally:
        llm.shutdown()
    text = json.dumps({"sglang": version, "plugin": os.environ.get("SPECRANK_RERANKER", ""), "rows": rows})
    tmp = Path(argv[1]).with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
