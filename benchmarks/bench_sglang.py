"""Benchmark specrank's SGLang plugin (docs/sglang.md): SGLang's own tree against the plugin's, predicted and measured.

    src/specrank/engines/sglang/build_cpu.sh /path/to/sglang          # .venv-sglang, from an SGLang checkout
    python benchmarks/bench_sglang.py --part predict                  # tree-config, no engine needed
    flock /work/cpu.lock python benchmarks/bench_sglang.py --part engine   # SGLang itself, on a quiet machine

Settings: SGLang's default shape for a Llama target, (num_steps, topk, num_draft_tokens) = (5, 4, 8) from
``_auto_choose_speculative_params`` (``arg_groups/speculative_hook.py``), and the champion's topk 10 at B = 8 (3, 10,
9); each greedy and at T = 1 (``specrank.engines.sglang.engine_runs`` holds them, and reads the engine's runs). The champion
``reranker:default`` is trained for topk 10. At topk 4 the plugin runs the champion's kind (``rows+per_depth``)
refitted, per law, on topk-4 pools of the champion's own training prompts, as the engine sees them
(``featurize.engine``: no prompt rows, task unknown): recorded by tree-config at SGLang's default shape and saved to
``WORK/reranker-k4-t{T}`` (reused when there). tree-config scores it on the held-out prompts and SGLang loads it by path
(``SPECRANK_RERANKER``). Prompts: the bundled held-out set (``--limit``, at least 40), none of the head's or the
champion's training prompts (checked by digest); or, with ``--prompts``, the first ``--limit`` of another set in a
study's seeded order, less those the head or either champion trained on (``--prompts spec-bench``: the bundled
Spec-Bench questions, of which the champions learned from a few dozen), and with ``--max-prompt-tokens`` of at most that
many target tokens.
``--gain-only`` decodes only what the plugin's gain needs: SGLang's tree and the plugin (no plain decoding), at the
champion's setting unless ``--settings`` names others.

``--part predict`` runs ``specrank tree-config`` per setting and temperature and reports draft and plugin acceptance
lengths with paired prompt-bootstrap intervals. ``--part engine`` checks that the engine environment
(``--engine-python``) imports SGLang with its CPU kernels and that this CPU has what the ``intel_amx`` backend (the
only CPU backend with tree verify) executes; where either is missing it records what failed instead of measuring.
``--part predict --engine-results NAME`` checks an earlier engine run on the same prompts against this prediction.
Writes ``benchmarks/results/sglang.json`` (with ``lscpu``'s model name). Exits 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from harness import ROOT, cpu_model, write_results  # benchmarks/harness.py, beside this script

from specrank.engines.sglang import cpu_shims, runner
from specrank.engines.sglang.engine_runs import (ENGINE_KEYS, SETTINGS, TOPK4, chosen_settings, engine_figures,
                                             inside_predicted, paired_gain)
from specrank.engines.sglang.engine_runs import earlier_engine as earlier_figures

MIN_PROMPTS = 40


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_prompt_arguments(parser)
    add_engine_arguments(parser)
    return checked(parser, parser.parse_args(argv))


def add_prompt_arguments(parser) -> None:
    """What is decoded and predicted: the part, the pair, the prompts, the settings, the results' name."""
    parser.add_argument("--part", choices=("predict", "engine", "all"), default="all")
    parser.add_argument("--target", default="smollm2")
    parser.add_argument("--drafter", default="eagle3:default")
    parser.add_argument("--limit", type=int, default=MIN_PROMPTS, help=f"held-out prompts (at least {MIN_PROMPTS})")
    parser.add_argument("--prompts", default=None,
                        help="JSONL prompts (Spec-Bench or HumanEval form), or 'spec-bench': the first --limit in a"
                             " study's seeded order that neither the head nor a champion trained on (default: the"
                             " bundled held-out set)")
    parser.add_argument("--max-prompt-tokens", type=int, default=None,
                        help="with --prompts: leave out prompts longer than this many target tokens (Spec-Bench's"
                             " summarization and RAG questions run to 600-800: each engine step costs about twice)")
    parser.add_argument("--settings", default=None,
                        help=f"comma list among {', '.join(SETTINGS)} (default: both; champion_b8 with --gain-only)")
    parser.add_argument("--gain-only", action="store_true",
                        help="predict and decode only SGLang's tree and the plugin (no plain decoding); without"
                             " --settings, at the champion's setting only")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench-sglang"))
    parser.add_argument("--engine-results", default=None, metavar="NAME",
                        help="with --part predict: the engine figures of an earlier --part engine run on the same"
                             " prompts (benchmarks/results/NAME.json), each measured gain checked against this"
                             " prediction")
    parser.add_argument("--name", default="sglang", help="the results file, benchmarks/results/NAME.json")


def add_engine_arguments(parser) -> None:
    """How SGLang's CPU engine runs: its environment, dtypes, backend, threads, temperatures and shims."""
    parser.add_argument("--engine-python", default=str(ROOT / ".venv-sglang" / "bin" / "python"))
    parser.add_argument("--dtype", default="bfloat16", help="the engine's dtype (the intel_amx kernels: bf16/fp16)")
    parser.add_argument("--dtype-head", default="bf16", help="the exported head's dtype")
    parser.add_argument("--attention-backend", default="intel_amx")
    parser.add_argument("--threads", type=int, default=2, help="the engine's OpenMP threads (default 2)")
    parser.add_argument("--engine-temperatures", default="0",
                        help="temperatures decoded in the engine (default 0: SGLang v0.5.18's CPU engine verifies"
                             " greedily at every temperature, eagle_sample; see --sampling-verify)")
    parser.add_argument("--sampling-verify", action="store_true",
                        help="verify at T > 0 in the CPU engine with SGLang's tree sampling kernel ported to torch"
                             " (src/specrank/engines/sglang/cpu_shims/tree_sampling.py); the plugin then uses the"
                             " champion of each engine temperature")
    parser.add_argument("--amx-override", action="store_true",
                        help="on a CPU with AVX-512 BF16 and no AMX, run SGLang's AMX path anyway"
                             " (src/specrank/engines/sglang/cpu_shims): without it SGLang falls back to an attention"
                             " backend with no EAGLE")


def checked(parser, args):
    """``args`` with ``--settings`` resolved to a list; bad input exits 2 in one line."""
    try:
        settings = chosen_settings(args.settings, args.gain_only)
    except ValueError as exc:
        parser.exit(2, f"--settings {args.settings}: {exc}\n")
    args.settings = settings
    if args.limit < MIN_PROMPTS:
        parser.exit(2, f"--limit {args.limit}: the goal needs at least {MIN_PROMPTS} prompts\n")
    if args.prompts not in (None, "spec-bench") and not Path(args.prompts).is_file():
        parser.exit(2, f"--prompts {args.prompts}: no such file\n")
    if args.engine_results is not None and args.part != "predict":
        parser.exit(2, f"--engine-results {args.engine_results}: only with --part predict (the other parts decode"
                       " their own)\n")
    if args.max_prompt_tokens is not None and (args.prompts is None or args.max_prompt_tokens < 1):
        parser.exit(2, f"--max-prompt-tokens {args.max_prompt_tokens}: a positive length, with --prompts\n")
    return args


def refuse(message: str) -> None:
    """Bad input: one line on stderr, exit status 2."""
    print(message, file=sys.stderr)
    sys.exit(2)


def held_out(args) -> tuple[list, Path]:
    """The prompts to decode (``specrank.experiments.held_out``; a refusal exits 2) and the file tree-config reads
    them from: the bundled held-out set's, or, with ``--prompts``, ``WORK/held-out.jsonl`` (the caller writes it)."""
    from specrank.decode.prompts import default_prompts_path
    from specrank.experiments.held_out import HeldOutError, held_out_prompts

    try:
        prompts = held_out_prompts(args.drafter, args.limit, args.prompts, target=args.target,
                                   max_prompt_tokens=args.max_prompt_tokens)
    except HeldOutError as exc:
        refuse(str(exc))
    return prompts, default_prompts_path() if args.prompts is None else Path(args.work) / "held-out.jsonl"


def tree_config(args, name: str, temperature: float, prompts_file: Path, limit: int, reranker: str, out: Path):
    """``specrank tree-config`` on one setting (recording, or resuming, its pool in ``out``); exits on failure."""
    from specrank.cli import main as cli

    topk, steps, n, _ = SETTINGS[name]
    argv = ["tree-config", "--target", args.target, "--drafter", args.drafter, "--prompts", str(prompts_file),
            "--limit", str(limit), "--max-new-tokens", str(args.max_new_tokens),
            "--temperature", f"{temperature:g}", "--topk", str(topk), "--num-steps", str(steps),
            "--num-draft-tokens", str(n), "--reranker", reranker, "--repeats", "1", "--out", str(out),
            "--no-tracking", "--no-progress"]
    if cli(argv) != 0:
        sys.exit(f"tree-config {name} at T = {temperature:g} failed")


def topk4_reranker(args, temperature: float) -> Path:
    """The plugin's reranker at SGLang's default shape for ``temperature``'s law, fitted once into
    ``WORK/reranker-k4-t{T}``: the shipped champion's kind and card fields, refitted on topk-4 pools of the
    Spec-Bench prompts that champion learned from (less any the head trained on), recorded by tree-config at that
    shape and read as the engine sees them (no prompt rows, task unknown)."""
    from specrank.decode.loading.drafters import trained_on
    from specrank.decode.prompts import prompt_digest, read_prompts, spec_bench_path
    from specrank.experiments.held_out import write_prompts
    from specrank.featurize.engine import engine_visible
    from specrank.featurize.storage import featurize_run
    from specrank.rerankers.defaults import default_reranker_dir
    from specrank.rerankers.loader import load_reranker
    from specrank.workflow.champion import fit_champion

    path = Path(args.work) / f"reranker-k4-t{temperature:g}"
    if (path / "reranker.json").is_file():
        return path
    champion = load_reranker(default_reranker_dir(temperature))
    learned = set(champion.card_["training_prompts"])
    prompts = [p for p in read_prompts(spec_bench_path()) if prompt_digest(p.text) in learned]
    prompts = [p for p in prompts if p.prompt_id not in set(trained_on(args.drafter, prompts) or ())]
    work = Path(args.work) / f"train-k4-t{temperature:g}"
    prompts_file = work / "prompts.jsonl"
    if not prompts_file.is_file():
        write_prompts(prompts_file, prompts)
    tree_config(args, "sglang_default", temperature, prompts_file, len(prompts), "none", work)
    run_dir = work / "recordings" / "topk4-depth5"
    name = champion.card_["reranker"]
    model = fit_champion(name, run_dir, engine_visible(featurize_run(run_dir)), tune_trials=0, seed=0, n_jobs=1)
    model.card_ = {"reranker": name, "temperature": float(temperature), "data": "spec_bench.jsonl",
                   "prompts": len(prompts), "topk": 4, "view": "engine",
                   "chosen_by": "the shipped champion's kind, refitted on topk-4 pools of its training prompts",
                   "command": "benchmarks/bench_sglang.py (topk4_reranker)",
                   "training_prompts": sorted(prompt_digest(p.text) for p in prompts)}
    model.save(path)
    return path


def predict(args, name: str, temperature: float, prompts_file: Path) -> dict:
    """tree-config's draft and plugin acceptance lengths for one setting and temperature."""
    import pandas as pd

    topk, steps, n, reranker = SETTINGS[name]
    if reranker == TOPK4:
        reranker = str(topk4_reranker(args, temperature))
    out = Path(args.work) / f"{name}-t{temperature:g}"
    tree_config(args, name, temperature, prompts_file, args.limit, reranker, out)
    row = pd.read_parquet(out / "tree_config_table.parquet").set_index("setting").loc[f"k{topk}-s{steps}-n{n}"]
    keys = ("draft_length", "draft_low", "draft_high", "draft_run_low", "draft_run_high", "plugin_length",
            "plugin_low", "plugin_high", "plugin_run_low", "plugin_run_high", "plugin_gain", "plugin_gain_low",
            "plugin_gain_high", "plugin_gain_run_low", "plugin_gain_run_high", "rounds")
    return {k: float(row[k]) for k in keys if k in row}


def engine_check(args) -> dict:
    """Whether SGLang's CPU engine can run here: the engine environment's imports and the CPU's ISA."""
    flags = Path("/proc/cpuinfo").read_text().split()
    out = {"amx": "amx_tile" in flags, "avx512": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags,
           "engine_python": args.engine_python}
    if not Path(args.engine_python).is_file():
        return out | {"ran": False, "failure": f"no engine environment at {args.engine_python}"
                                               " (src/specrank/engines/sglang/build_cpu.sh SGLANG_SRC)"}
    probe = subprocess.run([args.engine_python, "-c", "import sgl_kernel, sglang; print(sglang.__version__)"],
                           capture_output=True, text=True, timeout=600, env=engine_env(args, None))
    if probe.returncode != 0:
        return out | {"ran": False, "failure": probe.stderr.strip().splitlines()[-1:]}
    if not out["amx"] and not (args.amx_override and out["avx512_bf16"]):
        return out | {"ran": False, "failure": "this CPU has no AMX: SGLang v0.5.18 then serves EAGLE with no CPU"
                                               " attention backend (--amx-override runs its AMX path on AVX-512 BF16)"}
    return out | {"sglang": probe.stdout.strip(), "amx_override": bool(args.amx_override and not out["amx"])}


def engine_env(args, reranker: str | None, temperature: float = 0.0) -> dict:
    env = {"SGLANG_USE_CPU_ENGINE": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "HOME": os.environ.get("HOME", "/root"), "OMP_NUM_THREADS": str(args.threads), "TQDM_DISABLE": "1"}
    shims = cpu_shims.__path__[0]  # sitecustomize.py there: each shim behind its variable
    if args.amx_override:  # SGLang's AMX path, run by oneDNN on AVX-512
        env.update({"PYTHONPATH": shims, "SPECRANK_SGLANG_AMX_OVERRIDE": "1"})
    if args.sampling_verify:  # SGLang's tree sampling at T > 0 (tree_sampling.py)
        env.update({"PYTHONPATH": shims, "SPECRANK_SGLANG_SAMPLING_VERIFY": "1"})
    if reranker:
        env.update({"SPECRANK_RERANKER": reranker, "SPECRANK_TEMPERATURE": f"{temperature:g}"})
    return env


def engine_run(args, name: str, request: dict, reranker: str | None, law: float) -> dict:
    """One setting decoded by SGLang in its own environment (``specrank.engines.sglang.runner``): its JSON."""
    work = Path(args.work) / "engine"
    work.mkdir(parents=True, exist_ok=True)
    req, out = work / f"{name}.request.json", work / f"{name}.json"
    req.write_text(json.dumps(request))
    with open(work / f"{name}.log", "w") as log:
        rc = subprocess.run([args.engine_python, runner.__file__, str(req), str(out)],
                            env=engine_env(args, reranker, law), stdout=log, stderr=subprocess.STDOUT,
                            timeout=7200).returncode
    if rc != 0:
        tail = (work / f"{name}.log").read_text().strip().splitlines()[-3:]
        return {"failed": rc, "log": str(work / f"{name}.log"), "tail": tail}
    return json.loads(out.read_text())


def run_engine(args, prompts) -> dict:
    """SGLang plain, with its own tree and with the plugin at the champion's setting, and with its own tree at its
    default shape (the shipped champions are trained for topk 10 only), at each of ``--engine-temperatures``
    (``--gain-only``: its tree and the plugin only)."""
    from specrank.rerankers.defaults import default_reranker_dir

    check = engine_check(args)
    if "sglang" not in check:
        return check | {"ran": False}
    base, head = engine_request(args, prompts)
    out = check | {"ran": True, "dtype": args.dtype, "attention_backend": args.attention_backend,
                   "threads": args.threads, "settings": args.settings,
                   "champion": {f"t{t:g}": str(default_reranker_dir(t)) for t in (0.0, 1.0)}}
    for t in [float(x) for x in args.engine_temperatures.split(",")]:
        out[f"t{t:g}"] = engine_temperature(args, base, head, t)
    return out


def engine_request(args, prompts) -> tuple[dict, Path]:
    """The request every engine run shares (the target, the champion's shape, the prompts encoded with their
    seeds) and the head exported for SGLang into ``WORK/head-sglang`` (once)."""
    from specrank.decode.config import prompt_seed
    from specrank.decode.loading.drafters import head_directory
    from specrank.decode.loading.eagle3_export import export_head
    from specrank.decode.loading.target_spec import resolve_target
    from specrank.decode.loading.targets import load_target_tokenizer
    from specrank.decode.prompts import encode_prompt

    head = Path(args.work) / "head-sglang"
    if not (head / "config.json").is_file():
        export_head(head_directory(args.drafter), head, "sglang", args.dtype_head)
    tokenizer, _ = load_target_tokenizer(args.target)
    encoded = [{"id": p.prompt_id, "ids": encode_prompt(tokenizer, p.text), "seed": prompt_seed(0, p.prompt_id)}
               for p in prompts]
    topk, steps, n, _ = SETTINGS["champion_b8"]
    return {"model": str(resolve_target(args.target)), "topk": topk, "num_steps": steps, "num_draft_tokens": n,
            "dtype": args.dtype, "attention_backend": args.attention_backend, "max_new_tokens": args.max_new_tokens,
            "prompts": encoded}, head


def engine_temperature(args, base: dict, head: Path, t: float) -> dict:
    """Every run at engine temperature ``t`` and their figures, or the runs that failed."""
    # Without --sampling-verify the CPU engine verifies greedily at every temperature (eagle_sample): the greedy
    # champion. With it, T's own; the verify coins then come from torch's generator, seeded by the engine
    # (a request's sampling_seed would hash them with a Triton kernel, which has no CPU backend).
    law, seeded = (t, False) if args.sampling_verify else (0.0, True)
    req = base | {"temperature": t, "seeded": seeded}
    runs = {} if args.gain_only else {"plain": engine_run(args, f"plain-t{t:g}", req | {"head": None}, None, t)}
    for name in args.settings:
        topk, steps, n, reranker = SETTINGS[name]
        shape = {"head": str(head), "topk": topk, "num_steps": steps, "num_draft_tokens": n}
        reranker = str(topk4_reranker(args, law)) if reranker == TOPK4 else reranker
        own, plugin = ENGINE_KEYS[name]
        runs[own] = engine_run(args, f"{own.replace('_', '-')}-t{t:g}", req | shape, None, t)
        runs[plugin] = engine_run(args, f"{plugin.replace('_', '-')}-t{t:g}", req | shape, reranker, law)
    failed = {k: v for k, v in runs.items() if "failed" in v}
    return {"failed": failed} if failed else temperature_figures(args, runs, t)


def temperature_figures(args, runs: dict, t: float) -> dict:
    """Each run's figures, and per setting the plugin's gain, speed ratio and extra ms a step over SGLang's tree."""
    plain = runs.get("plain") if t == 0 else None  # greedy identity: at T = 0, where plain decoding ran
    fig = {k: engine_figures(v, plain if k != "plain" else None) for k, v in runs.items()}
    for name in args.settings:
        own, plugin = ENGINE_KEYS[name]
        fig[f"{plugin}_gain"] = paired_gain(runs[own], runs[plugin])
        fig[f"{plugin}_speed_ratio"] = fig[plugin]["tokens_per_s"] / fig[own]["tokens_per_s"]
        fig[f"{plugin}_ms_per_step"] = fig[plugin]["ms_per_step"] - fig[own]["ms_per_step"]
    return fig


def earlier_engine(args, figures: dict) -> dict:
    """The engine figures of an earlier ``--part engine`` run (``--engine-results NAME``), refused (exit 2) unless it
    decoded the same prompts, tokens and settings."""
    try:
        return earlier_figures(ROOT / "benchmarks" / "results" / f"{args.engine_results}.json", figures)
    except ValueError as exc:
        refuse(f"--engine-results {args.engine_results}: {exc}")


def main(argv=None) -> int:
    args = parse_args(argv)
    prompts, prompts_file = held_out(args)
    settings = args.settings
    figures = {"cpu_model": cpu_model(), "prompts": len(prompts), "prompts_file": prompts_file.name,
               "prompt_ids": [p.prompt_id for p in prompts], "max_prompt_tokens": args.max_prompt_tokens,
               "max_new_tokens": args.max_new_tokens,
               "gain_only": bool(args.gain_only),
               "settings": {k: dict(zip(("topk", "num_steps", "num_draft_tokens", "reranker"), SETTINGS[k]))
                            for k in settings}}
    earlier = earlier_engine(args, figures) if args.engine_results else None  # checked before any model loads
    if args.prompts is not None:  # after every refusal: a refused run leaves nothing behind
        from specrank.experiments.held_out import write_prompts

        write_prompts(prompts_file, prompts)
    if args.part in ("predict", "all"):
        temps = [float(t) for t in args.temperatures.split(",")]
        figures["predicted"] = {f"{name}_t{t:g}": predict(args, name, t, prompts_file) for name in settings
                                for t in temps}
    if args.part in ("engine", "all"):
        figures["engine"] = run_engine(args, prompts)
    elif earlier is not None:
        figures["engine"] = earlier
    if "predicted" in figures and "engine" in figures:
        inside_predicted(figures)
    figures["sampling_verify"] = bool(args.sampling_verify)
    path = write_results(args.name, figures, argv)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
