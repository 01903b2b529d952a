"""``specrank study``: the demo's pipeline at the scale that can answer whether the rerankers help.

For each temperature (default 1 and greedy): decode prompts (default: Spec-Bench's 480 questions, none of which
the shipped head trained on) until a round target is met, featurize, cross-fit the isotonic, Base and Rows
rerankers, evaluate every rule offline, then gather the figures at B = 8 and 59 (``specrank.evaluation.study``)
into ``OUT/results.json``, ``OUT/results.md`` and ``OUT/learning-curve.png``.

The prompts are decoded in a fixed, seeded order; the first call decodes 24 of them, and each later call as
many more as the rounds per prompt so far say the round target needs (whole shards, at most ``--chunk``), until
the target is met. The same command always decodes the same prompts, so a run interrupted anywhere and rerun
gives the same results. Each stage after decoding is redone only when its
input changed (digests in ``OUT/<temperature>/stages.json``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import time
from contextlib import nullcontext
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from specrank.atomic import atomic_write, write_json_atomic
from specrank.commands.args import (add_model_arguments, add_tracking_arguments, at_least, parse_temperatures,
                                    tracking_asked)
from specrank.commands.decode import add_seen_prompts_argument
from specrank.commands.timing import timed
from specrank.decode.prompts import encode_prompt, read_prompts, spec_bench_path
from specrank.errors import optional, require
from specrank.featurize import read_features
from specrank.featurize.storage import read_rounds_table
from specrank.law import GREEDY, Law
from specrank.outputs import check_output_dir
from specrank.rerankers import GBMReranker
from specrank.scale import add_worker_arguments, preflight, workers_from_args
from specrank.workflow import Features, Rerankers, Tracking, cross_fit, evaluate, featurize, record

HELP = "the pipeline at scale (decode to a round target, featurize, cross-fit, evaluate) -> one results JSON"
FIRST_CHUNK = 24  # prompts of the first decoding call, whose rounds per prompt size the next calls
CHUNK = 120  # the most prompts one decoding call adds
SHARD_SIZE = 4
# Sized for a 2-core machine: 10,000 rounds at T = 1 and 4,000 greedy with the shipped head on Spec-Bench fit in
# a 150-minute run on 2 Ray workers of one thread each (the default run's own time: docs/results/study.json,
# timing).
DEFAULT_ROUNDS = 10_000
DEFAULT_GREEDY_ROUNDS = 4_000
DEFAULT_MAX_NEW_TOKENS = 64
EXPERIMENT = "specrank-study"


class StudyDirError(ValueError):
    """The study directory holds another study."""


def add_arguments(parser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="study directory (rerun the same command to resume)")
    add_model_arguments(parser, drafter="eagle3:default", threads="torch CPU threads (per worker with --workers)")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="JSONL prompts (Spec-Bench or HumanEval form; default: the bundled Spec-Bench questions)")
    parser.add_argument("--rounds", type=at_least(1), default=DEFAULT_ROUNDS,
                        help=f"rounds to record at each sampling temperature (default {DEFAULT_ROUNDS})")
    parser.add_argument("--greedy-rounds", type=at_least(1), default=DEFAULT_GREEDY_ROUNDS,
                        help=f"rounds to record greedily (default {DEFAULT_GREEDY_ROUNDS})")
    parser.add_argument("--temperatures", default="1,0", help="comma-separated temperatures (default 1,0)")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"tokens per prompt (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--chunk", type=at_least(1), default=CHUNK,
                        help=f"the most prompts one decoding call adds (default {CHUNK}); the first call decodes "
                             f"{FIRST_CHUNK} (or fewer, with a smaller --chunk)")
    parser.add_argument("--bootstrap", type=at_least(1), default=2000, help="paired prompt-bootstrap resamples")
    parser.add_argument("--tune-trials", type=at_least(0), default=4,
                        help="Optuna trials per fold of Base and Rows (default 4)")
    trees = GBMReranker().n_estimators
    parser.add_argument("--n-estimators", type=at_least(1), default=trees,
                        help=f"boosting iterations of Base and Rows when not tuned (default {trees}, the rerankers' "
                             "default; the paper's: 400)")
    parser.add_argument("--seed", type=int, default=0, help="prompt order, decoding and bootstrap seed (default 0)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar while decoding (none is drawn when stderr is not a terminal)")
    add_worker_arguments(parser)
    add_seen_prompts_argument(parser)
    add_tracking_arguments(parser, store="sqlite:///OUT/mlflow.db, the study's own store", experiment=EXPERIMENT,
                           no_tracking="write the study directory only, log nothing (also what happens, said in one "
                                       "line, when MLflow is not installed and no tracking option was given)")


def run(args) -> int:
    from specrank.decode.core import parse_device
    from specrank.decode.loading.drafters import check_unseen, parse_drafter_spec
    from specrank.decode.loading.targets import DEFAULT_TARGET, check_target_spec

    started = time.perf_counter()
    temperatures = parse_temperatures(args.temperatures)
    out = check_output_dir(args.out).resolve()
    parse_device(args.device)
    check_target_spec(args.target)
    if args.target == DEFAULT_TARGET or args.target.endswith(".gguf"):  # converted when its tokenizer first loads
        require("gguf", f"--target {args.target} (a GGUF model)")
    parse_drafter_spec(args.drafter, args.eagle3_layers)
    workers = workers_from_args(args)  # --workers / --ray-address refused here, before anything loads
    if workers is not None:
        preflight(workers)  # Ray installed, a cluster's address answering
    prompts_path = args.prompts or spec_bench_path()
    prompts = read_prompts(prompts_path)
    seen = check_unseen(args.drafter, prompts, args.allow_training_prompts)
    if args.tune_trials:
        require("optuna", f"--tune-trials {args.tune_trials} (tuning Base and Rows; 0 fits them untuned)")
    uri = None
    if not args.no_tracking and optional("mlflow", tracking_asked(args, EXPERIMENT),
                                         "specrank study: MLflow is not installed, so the study logs nothing to it "
                                         "(as with --no-tracking)"):
        from specrank.tracking import check_tracking_uri, resolve_tracking_uri

        uri = resolve_tracking_uri(args.tracking_uri or f"sqlite:///{out / 'mlflow.db'}")
        if args.tracking_uri or out.is_dir():  # the study's own store is created with its directory
            uri = check_tracking_uri(uri)
    kept, skipped = fitting_prompts(args.target, prompts, args.max_new_tokens)
    study_prompts = write_study_prompts(out, kept, args.seed)
    print(f"{len(kept)} of {len(prompts)} prompts fit the target's context ({skipped} too long, skipped)"
          + (f"; the drafter trained on {seen} of them (--allow-training-prompts)" if seen else ""), flush=True)
    results = {
        "command": shlex.join(["specrank", "study", *getattr(args, "argv", [])]),
        "commit": source_commit(),
        "machine": machine(args),
        "target": args.target,
        "drafter": args.drafter,
        "prompts": {"file": Path(prompts_path).name, "available": len(prompts), "skipped_too_long": skipped,
                    "drafter_trained_on": seen},
        "settings": {"max_new_tokens": args.max_new_tokens, "bootstrap": args.bootstrap,
                     "tune_trials": args.tune_trials, "n_estimators": args.n_estimators, "chunk": args.chunk, "seed": args.seed,
                     "rounds_target": {"sampled": args.rounds, "greedy": args.greedy_rounds}},
        "temperatures": {},
        "timing": {},
    }
    for temp in temperatures:
        name = GREEDY if Law(temp).greedy else f"t{temp:g}"
        goal = args.greedy_rounds if Law(temp).greedy else args.rounds
        stage_start = time.perf_counter()
        with _pipeline_run(uri, args.experiment, name, temp, args.drafter):
            run_dir = out / name
            decoded = decode_until(args, workers, study_prompts, len(kept), run_dir, temp, goal)
            figures = analyse(args, run_dir, uri, name)
            figures["prompts_decoded"] = decoded
            results["temperatures"][f"{temp:g}"] = figures
            results["settings"]["pool_size"] = figures["pool_size"]
            results["timing"][name] = round(time.perf_counter() - stage_start, 1)
            if uri is not None:
                _log_pipeline(figures)
    results["timing"]["total_s"] = round(time.perf_counter() - started, 1)
    write_results(out, results)
    print(f"\nresults: {out / 'results.json'}, {out / 'results.md'}")
    for t, r in results["temperatures"].items():
        for b, f in r["budgets"].items():
            rows, rb = f["rules"]["rows"], f["rows_minus_base"]
            print(f"T={t} B={b}: {r['rounds']} rounds; Rows share of root's gain {rows['root_share'][0]:.1f}% "
                  f"[{rows['root_share'][1]:.1f}, {rows['root_share'][2]:.1f}]; Rows - Base "
                  f"{rb['gain_pct_of_draft'][0]:+.2f}% of draft [{rb['gain_pct_of_draft'][1]:+.2f}, "
                  f"{rb['gain_pct_of_draft'][2]:+.2f}]")
    return 0


def fitting_prompts(target: str, prompts, max_new_tokens: int, depth: int = 8) -> tuple[list, int]:
    """(the prompts whose chat-encoded length leaves room for ``max_new_tokens`` and a pool of ``depth`` in the
    target's context, how many were skipped); only the tokenizer loads."""
    from specrank.decode.loading.targets import load_target_tokenizer

    tokenizer, context = load_target_tokenizer(target)
    if context is None:
        return list(prompts), 0
    kept = [p for p in prompts if len(encode_prompt(tokenizer, p.text)) + max_new_tokens + depth <= context]
    return kept, len(prompts) - len(kept)


def write_study_prompts(out: Path, prompts, seed: int) -> Path:
    """``OUT/prompts.jsonl``: ``prompts`` in a seeded order (any prefix mixes the tasks), in Spec-Bench form; an
    existing file must hold exactly these lines (the same study), else the study is refused."""
    order = np.random.default_rng(seed).permutation(len(prompts))
    lines = [json.dumps({"question_id": prompts[i].prompt_id, "category": prompts[i].task,
                         "turns": [prompts[i].text]}, ensure_ascii=False) for i in order]
    text = "\n".join(lines) + "\n"
    path = out / "prompts.jsonl"
    if path.is_file():
        if path.read_text(encoding="utf-8") != text:
            raise StudyDirError(f"{out} holds another study (its prompts.jsonl differs); use a new --out")
        return path
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda p: Path(p).write_text(text, encoding="utf-8"))
    return path


def decode_until(args, workers, prompts_path: Path, n_prompts: int, run_dir: Path, temp: float, goal: int) -> int:
    """Decode ``prompts_path`` in order until ``goal`` rounds are recorded (or the prompts run out); return how many
    prompts were decoded. Each call's size comes from the rounds recorded so far (``next_limit``), so the same
    study always decodes the same prompts; prompts already recorded are not decoded again."""
    from specrank.decode.runs.shards import done_prompts

    limit = 0
    while limit < n_prompts:
        limit = next_limit(limit, recorded_rounds(run_dir, limit), goal, n_prompts, args.chunk)
        if not set(range(limit)) <= (done_prompts(run_dir) if run_dir.exists() else set()):
            with timed(f"record: the first {limit} prompts at T = {temp:g} -> {run_dir}"):
                recording = record(args.target, args.drafter, prompts_path, out=run_dir, temperature=temp,
                                   limit=limit, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                   device=args.device, dtype=args.dtype, graphs=args.graphs, shard_size=SHARD_SIZE,
                                   eagle3_layers=args.eagle3_layers, specforge_norm_output=args.specforge_norm_output,
                                   threads=args.threads, workers=workers,
                                   allow_training_prompts=args.allow_training_prompts,
                                   progress=not args.no_progress)
                print(recording.summary, flush=True)
        if recorded_rounds(run_dir, limit) >= goal:
            break
    return limit


def next_limit(limit: int, rounds: int, goal: int, n_prompts: int, chunk: int) -> int:
    """The next number of prompts to have decoded: ``FIRST_CHUNK`` (at most ``chunk``) to start, then as many
    more as the rounds per prompt so far say the goal needs, in whole shards, at most ``chunk`` more a call (a
    call starts the workers and loads the models, so few large calls cost less)."""
    if limit == 0:
        return min(n_prompts, FIRST_CHUNK, chunk)
    need = math.ceil((goal - rounds) * limit / max(rounds, 1))
    need = SHARD_SIZE * math.ceil(max(need, 1) / SHARD_SIZE)
    return min(n_prompts, limit + min(need, chunk))


def recorded_rounds(run_dir: Path, below: int) -> int:
    """Rounds of prompts ``0..below-1`` in the run directory's finished shards (from the Parquet footers); a shard
    of later prompts, left by an interrupted call, does not count."""
    from specrank.decode.runs.shards import SHARD

    total = 0
    for f in sorted(Path(run_dir, "rounds").glob("shard-*.parquet")):
        m = SHARD.fullmatch(f.name)
        if m and int(m.group(2)) < below:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def analyse(args, run_dir: Path, uri: str | None, name: str) -> dict:
    """Featurize, cross-fit, evaluate (each redone only when its input changed) and the study's figures."""
    from specrank.evaluation import load_rounds, read_predictions
    from specrank.evaluation.study import RERANKERS, temperature_results
    from specrank.files import directory_hash, file_hash

    def tracking(stage: str) -> Tracking | None:
        return Tracking.stage(uri, args.experiment, f"study-{name}", stage) if uri else None

    features, rerankers = run_dir / "features.parquet", run_dir / "rerankers"
    predictions = rerankers / "predictions.parquet"
    stages = _Stages(run_dir / "stages.json")
    stages.run("featurize", directory_hash(run_dir / "rounds"), features,
               lambda: print(featurize(run_dir, tracking=tracking("featurize")).summary))
    stages.run("train", file_hash(features), predictions,
               lambda: cross_fit(Features(features), rerankers=RERANKERS, out=rerankers, tune_trials=args.tune_trials,
                                 seed=args.seed, n_jobs=args.threads, gbm={"n_estimators": args.n_estimators},
                                 tracking=tracking("train"), model_prefix=f"study-{name}" if uri else None),
               clear=rerankers)
    stages.run("evaluate", file_hash(predictions), run_dir / "evaluation" / "meta.json",
               lambda: evaluate(run_dir, predictions, out=run_dir / "evaluation", bootstrap=args.bootstrap,
                                seed=args.seed, tracking=tracking("evaluate")),
               clear=run_dir / "evaluation")
    rounds = load_rounds(run_dir)
    table = read_rounds_table(run_dir, ["prompt_id", "round", "covered", "accepted"]).to_pandas()
    fitted = Rerankers.open(rerankers)
    fold_models = {n: fitted.models(n) for n in ("base", "rows")}
    figures = temperature_results(rounds, read_predictions(predictions), read_features(features), table,
                                  fold_models, args.bootstrap, args.seed)
    figures["realized_accepted_per_round"] = float(table["accepted"].mean())
    return figures


class _Stages:
    """``stages.json``: the digest of the input each stage last ran on; a stage whose input is unchanged is
    skipped, one whose input changed is redone (its old output removed first)."""

    def __init__(self, path: Path):
        self.path = path
        self.done = json.loads(path.read_text()) if path.is_file() else {}

    def run(self, stage: str, digest: str, output: Path, work, clear: Path | None = None) -> None:
        if self.done.get(stage) == digest and output.exists():
            print(f"\n{stage}: its input is unchanged since it ran (skipped)", flush=True)
            return
        if clear is not None and clear.exists():
            shutil.rmtree(clear)
        with timed(f"{stage}: {self.path.parent}"):
            work()
        self.done[stage] = digest
        write_json_atomic(self.path, self.done)


def write_results(out: Path, results: dict) -> None:
    """``results.json``, ``results.md`` and ``learning-curve.png`` in ``out`` (each written atomically)."""
    from specrank.evaluation.study import learning_curve_figure, render_results

    write_json_atomic(out / "results.json", results)
    atomic_write(out / "learning-curve.png", lambda p: learning_curve_figure(results, p))
    text = render_results(results, "learning-curve.png")
    atomic_write(out / "results.md", lambda p: Path(p).write_text(text, encoding="utf-8"))


def source_commit() -> str:
    """The git commit of the package's checkout (with ``+dirty`` when it has changes), else its version."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        try:
            return f"specrank {metadata.version('specrank')}"
        except metadata.PackageNotFoundError:  # a copy of the source on PYTHONPATH, neither a checkout nor installed
            return "unknown"


def machine(args) -> str:
    """The machine in words: processor, cores, device, workers."""
    import torch

    device = args.device
    if str(device).startswith("cuda") and torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    workers = f", {args.workers} Ray workers" if args.workers else ""
    return f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, {device}{workers}"


def _pipeline_run(uri: str | None, experiment: str, name: str, temp: float, drafter: str):
    if uri is None:
        return nullcontext()
    from specrank.tracking import experiment_run

    note = (f"The study at T = {temp:g} with drafter {drafter}: its nested runs are the stages featurize -> train -> "
            "evaluate; the study's figures (results.json) are this run's metrics.")
    return experiment_run(experiment, run_name=f"study-{name}", tracking_uri=uri,
                          tags={"specrank.stage": "pipeline"}, description=note)


def _log_pipeline(figures: dict) -> None:
    from specrank.tracking.pipeline import log_headline

    log_headline(figures)
