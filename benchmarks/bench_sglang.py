"""Benchmark specrank's SGLang plugin (docs/sglang.md): SGLang's own tree against the plugin's, predicted and measured.

    scripts/build_sglang_cpu.sh /path/to/sglang                       # .venv-sglang, from an SGLang checkout
    python benchmarks/bench_sglang.py --part predict                  # tree-config, no engine needed
    flock /work/cpu.lock python benchmarks/bench_sglang.py --part engine   # SGLang itself, on a quiet machine

Settings: SGLang's default shape for a Llama target, (num_steps, topk, num_draft_tokens) = (5, 4, 8) from
``_auto_choose_speculative_params`` (``arg_groups/speculative_hook.py``), and the champion's topk 10 at B = 8
(3, 10, 9); each greedy and at T = 1. The champion ``reranker:default`` is trained for topk 10: at topk 4 the plugin
is a rows GBM cross-fitted on the engine's view of the recording. Prompts: the bundled held-out set (``--limit``,
at least 40), none of the head's or the champion's training prompts (checked by digest).

``--part predict`` runs ``specrank tree-config`` per setting and temperature and reports draft and plugin acceptance
lengths with paired prompt-bootstrap intervals. ``--part engine`` checks that the engine environment
(``--engine-python``) imports SGLang with its CPU kernels and that this CPU has what the ``intel_amx`` backend (the
only CPU backend with tree verify) executes; where either is missing it records what failed instead of measuring.
Writes ``benchmarks/results/sglang.json`` (with ``lscpu``'s model name). Exits 2 on bad input.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from record import ROOT, cpu_model, write_results  # benchmarks/record.py, beside this script

SETTINGS = {"sglang_default": (4, 5, 8, "cross-fit"), "champion_b8": (10, 3, 9, "reranker:default")}
MIN_PROMPTS = 40


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--part", choices=("predict", "engine", "all"), default="all")
    parser.add_argument("--engine-python", default=str(ROOT / ".venv-sglang" / "bin" / "python"))
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="eagle3:default")
    parser.add_argument("--limit", type=int, default=MIN_PROMPTS, help=f"held-out prompts (at least {MIN_PROMPTS})")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-sglang"))
    args = parser.parse_args(argv)
    if args.limit < MIN_PROMPTS:
        parser.exit(2, f"--limit {args.limit}: the goal needs at least {MIN_PROMPTS} prompts\n")
    return args


def held_out(args) -> list:
    """The bundled prompts, refused (exit 2) when the head or the champion trained on any of them."""
    from specrank.decode.loading.drafters import check_unseen
    from specrank.decode.prompts import default_prompts_path, prompt_digest, read_prompts
    from specrank.rerankers.defaults import default_reranker_dir
    from specrank.rerankers.loader import load_reranker

    prompts = read_prompts(default_prompts_path(), limit=args.limit)
    check_unseen(args.drafter, prompts)
    for t in (0.0, 1.0):
        seen = set((getattr(load_reranker(default_reranker_dir(t)), "card_", {}) or {}).get("training_prompts", []))
        if any(prompt_digest(p.text) in seen for p in prompts):
            print(f"--limit {args.limit}: the champion at T = {t:g} trained on some of these prompts", file=sys.stderr)
            sys.exit(2)
    return prompts


def predict(args, name: str, temperature: float) -> dict:
    """tree-config's draft and plugin acceptance lengths for one setting and temperature."""
    import pandas as pd

    from specrank.cli import main as cli

    topk, steps, n, reranker = SETTINGS[name]
    out = Path(args.work) / f"{name}-t{temperature:g}"
    argv = ["tree-config", "--target", args.target, "--drafter", args.drafter, "--limit", str(args.limit),
            "--max-new-tokens", str(args.max_new_tokens), "--temperature", f"{temperature:g}", "--topk", str(topk),
            "--num-steps", str(steps), "--num-draft-tokens", str(n), "--reranker", reranker, "--repeats", "1",
            "--out", str(out), "--no-tracking", "--no-progress"]
    if cli(argv) != 0:
        sys.exit(f"tree-config {name} at T = {temperature:g} failed")
    row = pd.read_parquet(out / "tree_config_table.parquet").set_index("setting").loc[f"k{topk}-s{steps}-n{n}"]
    keys = ("draft_length", "draft_low", "draft_high", "plugin_length", "plugin_low", "plugin_high", "plugin_gain",
            "plugin_gain_low", "plugin_gain_high", "rounds")
    return {k: float(row[k]) for k in keys if k in row}


def engine_check(args) -> dict:
    """Whether SGLang's CPU engine can run here: the engine environment's imports and the CPU's AMX."""
    flags = Path("/proc/cpuinfo").read_text().split()
    out = {"amx": "amx_tile" in flags, "avx512": "avx512f" in flags, "engine_python": args.engine_python}
    if not Path(args.engine_python).is_file():
        return out | {"ran": False, "failure": f"no engine environment at {args.engine_python}"
                                               " (scripts/build_sglang_cpu.sh SGLANG_SRC)"}
    probe = subprocess.run([args.engine_python, "-c", "import sgl_kernel, sglang; print(sglang.__version__)"],
                           capture_output=True, text=True, timeout=600, env={"SGLANG_USE_CPU_ENGINE": "1",
                                                                             "PATH": "/usr/bin:/bin"})
    if probe.returncode != 0:
        return out | {"ran": False, "failure": probe.stderr.strip().splitlines()[-1:]}
    out["sglang"] = probe.stdout.strip()
    if not out["amx"]:
        return out | {"ran": False, "failure": "this CPU has no AMX, which the intel_amx backend's kernels execute"}
    return out | {"ran": False, "failure": "the engine measurement is not automated yet"}


def main(argv=None) -> int:
    args = parse_args(argv)
    prompts = held_out(args)
    figures = {"cpu_model": cpu_model(), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
               "settings": {k: dict(zip(("topk", "num_steps", "num_draft_tokens", "reranker"), v))
                            for k, v in SETTINGS.items()}}
    if args.part in ("predict", "all"):
        temps = [float(t) for t in args.temperatures.split(",")]
        figures["predicted"] = {f"{name}_t{t:g}": predict(args, name, t) for name in SETTINGS for t in temps}
    if args.part in ("engine", "all"):
        figures["engine"] = engine_check(args)
    path = write_results("sglang", figures, argv)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
