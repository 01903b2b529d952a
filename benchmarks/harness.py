"""What the benchmarks share, beside each of them in this folder (``from harness import ...``).

The results file every benchmark writes: ``benchmarks/results/NAME.json`` with the command, the commit, the
machine (``lscpu``'s CPU model among it), the date and the figures, so a number quoted in the docs names the file it
comes from (docs/benchmarks.md). ``SPECRANK_BENCH_RESULTS`` moves the directory (the tests point it at a temporary
one, so a tiny-shape run never overwrites a real result).

Besides: timing (``best_ms``), the GBM size option (``gbm_size``), a drafter's greedy tokens per target pass over a
prompt set (``greedy_decode``), and the vLLM benchmarks' shared options, prompt set and runs of
``specrank.engines.vllm.runner`` in vLLM's own environment.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from specrank.atomic import atomic_write

ROOT = Path(__file__).resolve().parent.parent


def results_dir() -> Path:
    return Path(os.environ.get("SPECRANK_BENCH_RESULTS", ROOT / "benchmarks" / "results"))


def commit() -> str:
    """The checkout's commit, ``+dirty`` when tracked files outside ``benchmarks/results`` changed (a benchmark that
    writes its results file after each part must not call its own later writes dirty); ``unknown`` outside a git
    checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def cpu_model() -> str:
    """The CPU's model as ``lscpu`` names it (this machine's kind varies: an AVX2 EPYC or an AVX-512/AMX Xeon, and
    timings differ between them), ``unknown`` where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name:")),
                "unknown")


def machine() -> dict:
    info = {"platform": platform.platform(), "processor": platform.machine(), "cpu_model": cpu_model(),
            "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def write_results(name: str, figures, argv=None) -> Path:
    """Write ``figures`` (JSON-serializable) as ``results_dir()/NAME.json`` atomically; return the path."""
    argv = sys.argv if argv is None else argv
    record = {"command": "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(argv[0], ROOT), *argv[1:]]),
              "commit": commit(), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "figures": figures}
    text = json.dumps(record, indent=2, default=float) + "\n"
    return atomic_write(results_dir() / f"{name}.json", lambda tmp: Path(tmp).write_text(text))


# --- timing and options ------------------------------------------------------------------------------------------


def best_ms(fn, repeat: int = 200) -> float:
    """Median milliseconds of ``fn()`` over ``repeat`` calls, after one warm-up call."""
    import numpy as np

    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def gbm_size(text: str) -> dict:
    """``TREESxLEAVES@RATE`` -> GBMReranker parameters."""
    match = re.fullmatch(r"(\d+)x(\d+)@([0-9.]+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not TREESxLEAVES@RATE (e.g. 400x63@0.05)")
    return {"n_estimators": int(match[1]), "num_leaves": int(match[2]), "learning_rate": float(match[3])}


def greedy_decode(target, drafter, prompts, max_new_tokens: int, budget: int = 59) -> dict:
    """Tokens per target pass and first-token agreement (drafter top-1 = target root argmax)."""
    import numpy as np

    from specrank.decode import DecodeConfig
    from specrank.decode.engine.timer import Timer
    from specrank.decode.prompts import encode_prompt
    from specrank.decode.runs import record_prompt

    config, timer, records = DecodeConfig(budget=budget, max_new_tokens=max_new_tokens), Timer(), []
    for p in prompts:
        records += record_prompt(target, drafter, encode_prompt(target.tokenizer, p.text), config, p.prompt_id,
                                 p.task, timer=timer)[1]
    accepted = np.array([r["accepted"] for r in records])
    agree = np.array([r["token"][0] == r["root_argmax"] for r in records])
    return {
        "rounds": len(records),
        "tokens_per_pass": float(accepted.mean() + 1),
        "first_token_agreement": float(agree.mean()),
        "draft_ms_per_round": 1000 * timer.draft / max(1, timer.rounds),
        "target_ms_per_round": 1000 * timer.target / max(1, timer.rounds),
    }


# --- vLLM, in its own environment -----------------------------------------------------------------------------------


def engine_arguments(parser, name: str, threads: int) -> None:
    """The options every vLLM benchmark here shares: vLLM's interpreter, threads, the work directory, the results'
    name."""
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--engine-python", default=str(ROOT / ".venv-vllm/bin/python"))
    parser.add_argument("--work", default=str(ROOT / f"runs/bench-{name.replace('_', '-')}"))
    parser.add_argument("--name", default=name)


def prepare_vllm(args) -> dict:
    """The converted target, the head exported for vLLM (fp32) and the encoded prompts."""
    from specrank.decode.loading.drafters import check_unseen, head_directory
    from specrank.decode.loading.eagle3_export import export_head
    from specrank.decode.loading.target_spec import resolve_target
    from specrank.decode.loading.targets import load_target_tokenizer
    from specrank.decode.prompts import encode_prompt, read_prompts

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(args.prompts, limit=args.limit)
    check_unseen("eagle3:default", prompts)
    model, exported = resolve_target("smollm2"), work / "head-vllm"
    if not (exported / "config.json").is_file():
        export_head(head_directory("eagle3:default"), exported, "vllm", "fp32", str(model))
    tokenizer, _ = load_target_tokenizer("smollm2")
    return {"model": str(model), "head": str(exported),
            "prompts": [{"id": p.prompt_id, "ids": encode_prompt(tokenizer, p.text), "seed": 0} for p in prompts]}


def vllm_run(args, name: str, request: dict, reranker: str | None, env: dict) -> dict:
    """``request`` decoded by ``specrank.engines.vllm.runner`` in vLLM's environment, the plugin on with
    ``reranker``; ``env``: the plugin's settings. Its JSON."""
    from specrank.engines.vllm import runner

    work = Path(args.work)
    (work / f"{name}.request.json").write_text(json.dumps(request))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "OMP_NUM_THREADS": str(args.threads), "TQDM_DISABLE": "1", **env}
    env.pop("PYTHONPATH", None)
    env.pop("SPECRANK_RERANKER", None)
    if reranker:
        env["SPECRANK_RERANKER"] = str(Path(reranker).resolve())
    with open(work / f"{name}.log", "w") as log:
        rc = subprocess.run([args.engine_python, runner.__file__, str(work / f"{name}.request.json"),
                             str(work / f"{name}.json")], env=env, stdout=log, stderr=subprocess.STDOUT,
                            timeout=7200).returncode
    if rc != 0:
        sys.exit(f"vLLM run {name} failed (exit {rc}); see {work / f'{name}.log'}")
    return json.loads((work / f"{name}.json").read_text())
