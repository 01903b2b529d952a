"""The study: the workflow at the scale that can answer whether the rerankers help.

For each temperature: record prompts until a round target is met, featurize, cross-fit the isotonic, Base and
Rows rerankers, evaluate every score offline, then gather the figures at B = 8 and 59
(``specrank.experiments.study.tables``) into ``OUT/results.json``, ``OUT/results.md`` and ``OUT/learning-curve.png``.

The prompts are decoded in a fixed, seeded order; the first call decodes 24 of them, and each later call as
many more as the rounds per prompt so far say the round target needs (whole shards, at most ``chunk``), until
the target is met. The same call always decodes the same prompts, so a study interrupted anywhere and rerun
gives the same results. Each stage after recording is redone only when its input changed (digests in
``OUT/<temperature>/stages.json``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import subprocess
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from specrank.atomic import atomic_write, write_json_atomic
from specrank.decode.config import DecodeConfig, check_temperature
from specrank.decode.loading.drafters import check_unseen
from specrank.decode.loading.model_spec import ModelSpec
from specrank.decode.loading.targets import DEFAULT_TARGET, load_target_tokenizer
from specrank.decode.prompts import encode_prompt, read_prompts, spec_bench_path, spec_bench_text
from specrank.decode.runs.shards import SHARD, done_prompts
from specrank.errors import require
from specrank.evaluation import load_rounds, read_predictions
from specrank.experiments.online.run import OnlineComparison, Protocol, compare_online, kept_worker
from specrank.experiments.study.tables import RERANKERS, learning_curve_figure, render_results, temperature_results
from specrank.featurize import read_features
from specrank.featurize.storage import read_rounds_table
from specrank.files import directory_hash, file_hash, read_json
from specrank.law import Law
from specrank.layout import RunLayout, StudyLayout
from specrank.outputs import check_output_dir
from specrank.rerankers import GBMReranker, load_reranker, save_reranker
from specrank.rerankers.defaults import cached_reranker_dir, champion_for
from specrank.workflow.champion import choose_champion, fit_champion, model_card
from specrank.workflow.evaluation import evaluate
from specrank.workflow.features import Features, featurize
from specrank.workflow.recording import record
from specrank.workflow.rerankers import Rerankers, cross_fit
from specrank.workflow.stages import Stages, timed
from specrank.workflow.tracking import Tracking

FIRST_CHUNK = 24  # prompts of the first decoding call, whose rounds per prompt size the next calls
CHUNK = 120  # the most prompts one decoding call adds
SHARD_SIZE = 4
# Sized for a 2-core machine: 10,000 rounds at T = 1 and 4,000 greedy with the shipped head on Spec-Bench fit in
# a 150-minute run on 2 Ray workers of one thread each (the default run's own time: docs/results/study.json,
# timing).
DEFAULT_ROUNDS = 10_000
DEFAULT_GREEDY_ROUNDS = 4_000
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_ONLINE_PROMPTS = 100  # unseen prompts of the online goal cell (first sampled temperature, B = 8)
DEFAULT_ONLINE_OTHER_PROMPTS = 40  # of the other cells (other temperatures, B = 59)
ONLINE_BUDGETS = (8, 59)
ONLINE_STRATEGIES = ("draft", "reranked", "root", "root_draw")
GPU_ROUND_MS = 14.5  # an SGLang round of an 8B target on an H200: the round a reranker's cost is weighed against
EXPERIMENT = "specrank-study"
log = logging.getLogger(__name__)


class StudyDirError(ValueError):
    """The study directory holds another study."""


@dataclass
class StudyResult:
    """A study directory: ``results.json`` (``results``, every figure), ``results.md``, ``learning-curve.png`` and
    one folder per temperature (its recording, features, cross-fitted rerankers and evaluation)."""

    path: Path
    results: dict = field(repr=False)
    links: list[str] = field(default_factory=list)  # where a tracked study's MLflow runs are (empty: untracked)

    @classmethod
    def open(cls, path) -> StudyResult:
        """The finished study in directory ``path``."""
        path = Path(path)
        results = StudyLayout(path).results
        if not results.is_file():
            raise FileNotFoundError(f"{path}: no finished study (no results.json)")
        return cls(path, json.loads(results.read_text(encoding="utf-8")))

    def headline(self) -> list[str]:
        """One line per temperature and budget: the Rows share of root's gain and Rows - Base."""
        lines = []
        for t, r in self.results["temperatures"].items():
            for b, f in r["budgets"].items():
                rows, rb = f["scores"]["rows"]["root_share"], f["rows_minus_base"]["gain_pct_of_draft"]
                lines.append(f"T={t} B={b}: {r['rounds']} rounds; Rows share of root's gain {rows[0]:.1f}% "
                             f"[{rows[1]:.1f}, {rows[2]:.1f}]; Rows - Base {rb[0]:+.2f}% of draft "
                             f"[{rb[1]:+.2f}, {rb[2]:+.2f}]")
        return lines


@dataclass(frozen=True)
class StudySettings:
    """What a study records and fits: ``rounds`` at each sampling temperature of ``temperatures`` and
    ``greedy_rounds`` greedily (None: every prompt, in one decoding call), ``max_new_tokens`` a prompt, decoding
    calls of at most ``chunk`` prompts, from the first ``limit`` prompts of the file (None: all of them);
    ``bootstrap`` resamples, ``tune_trials`` Optuna trials per fold of Base and Rows (0: untuned, with
    ``n_estimators`` boosting iterations; None: the rerankers' default), ``seed`` for the prompt order, decoding
    and bootstrap; with ``online``, ``online_prompts`` never recorded decode in the loop at ``online_budgets``
    (``online_other_prompts`` of them outside the first sampled temperature's B = 8). Written whole into
    ``results.json``."""

    temperatures: tuple[float, ...] = (1.0, 0.0)
    rounds: int | None = DEFAULT_ROUNDS
    greedy_rounds: int | None = DEFAULT_GREEDY_ROUNDS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    chunk: int = CHUNK
    bootstrap: int = 2000
    tune_trials: int = 4
    n_estimators: int | None = None
    seed: int = 0
    online: bool = True
    online_prompts: int = DEFAULT_ONLINE_PROMPTS
    online_other_prompts: int = DEFAULT_ONLINE_OTHER_PROMPTS
    online_budgets: tuple[int, ...] = ONLINE_BUDGETS
    limit: int | None = None

    def __post_init__(self):
        for name in ("rounds", "greedy_rounds", "max_new_tokens", "chunk", "bootstrap", "online_prompts",
                     "online_other_prompts", "limit"):
            value = getattr(self, name)
            if value is None and name in ("rounds", "greedy_rounds", "limit"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"study setting {name} must be an integer >= 1, got {value!r}")
        if not set(self.online_budgets) <= set(ONLINE_BUDGETS):
            raise ValueError(f"online budgets must be among {ONLINE_BUDGETS}, got {self.online_budgets}")
        for t in self.temperatures:
            check_temperature(t)

    @property
    def trees(self) -> int:
        """Base and Rows' boosting iterations when untuned (``n_estimators``, else the rerankers' default)."""
        return self.n_estimators or GBMReranker().n_estimators

    def written(self, reserved: int) -> dict:
        """The settings as ``results.json`` keeps them: every field, the online ones as the study ran them
        (``reserved`` prompts kept unseen), and the round targets by law."""
        return {**asdict(self), "temperatures": list(self.temperatures), "online_prompts": reserved,
                "online_other_prompts": min(self.online_other_prompts, reserved),
                "online_budgets": list(self.online_budgets) if reserved else [],
                "n_estimators": self.trees,
                "rounds_target": {"sampled": self.rounds, "greedy": self.greedy_rounds}}


def study(models: ModelSpec, prompts=None, *, out, settings: StudySettings = StudySettings(), workers=None,
          allow_training_prompts: bool = False, progress: bool = True, tracking: Tracking | None = None,
          command: str = "") -> StudyResult:
    """Run (or resume) the study of ``models`` (a ``ModelSpec``: the workers and the online phase load the models
    from it) on ``prompts`` (a JSONL file; default: the bundled Spec-Bench questions) in directory ``out``, with
    ``settings``.

    ``workers`` (``scale.Workers``) decodes on Ray workers. With ``tracking``, each temperature is one pipeline run
    (``<tracking.run_name or "study">-<temperature>``) whose nested runs are the stages, and the champion is
    registered from it (``experiments.study.tracking``). Every input is checked before a model loads.

    Each temperature's champion (``workflow.champion``) is refitted on all its rounds and saved in
    ``OUT/<temperature>/champion``. With ``settings.online``, the last ``online_prompts`` prompts of the study's
    order are never recorded: draft selection, the champion, root and root-draw selection decode them in the loop
    at each budget (``online_prompts`` of them at the first sampled temperature and B = 8, the cell the study's
    online goal reads; ``online_other_prompts`` elsewhere), beside the offline prediction for the same score.
    """
    out = check_output_dir(out).resolve()
    plan = plan_study(models, prompts, out, settings, allow_training_prompts)
    tracking = tracking.checked() if tracking is not None else None  # its own store may live in ``out``
    results = {
        "command": command,
        "commit": source_commit(),
        "machine": machine(models.device, workers),
        "target": models.target,
        "drafter": models.drafter,
        "prompts": {"file": Path(plan.prompts_path).name, "available": plan.available,
                    "skipped_too_long": plan.available - plan.kept, "drafter_trained_on": plan.seen},
        "settings": settings.written(plan.reserved),
        "temperatures": {},
        "timing": {},
    }
    recorder = Recorder(models, workers, allow_training_prompts, progress)
    pipelines, champions = {}, {}
    with timed(None) as total:
        for temp in settings.temperatures:
            name = _pipeline_name(tracking, temp)
            with timed(None) as stage, _pipeline_run(tracking, name, temp, models.drafter) as run:
                figures = temperature_stage(plan, temp, recorder, tracking, command, default=prompts is None)
                results["temperatures"][f"{temp:g}"] = figures
                results["settings"]["pool_size"] = figures["pool_size"]
                if tracking is not None:
                    pipelines[name] = run.info.run_id
                    champions[name] = _log_temperature(figures, plan.out / Law(temp).folder, name, temp,
                                                       models.drafter)
            results["timing"][Law(temp).folder] = round(stage.seconds, 1)
    results["timing"]["total_s"] = round(total.seconds, 1)
    write_results(out, results)
    links = _finish(tracking, pipelines, champions) if tracking is not None else []
    return StudyResult(out, results, links)


@dataclass(frozen=True)
class StudyPlan:
    """What a study decodes, fixed before any model loads: its models and settings, the prompts file and how many
    of its prompts there are, fit the target (``kept``) and were the drafter's training prompts (``seen``), the
    study's own ordered copy (``OUT/prompts.jsonl``) and how many at its end the online phase keeps unseen."""

    out: Path
    models: ModelSpec
    settings: StudySettings
    prompts_path: Path
    available: int
    kept: int
    seen: int
    study_prompts: Path
    reserved: int

    @property
    def goal_temperature(self) -> float | None:
        """The first sampled temperature: its B = 8 cell is the online goal's (greedy alone: none)."""
        return next((t for t in self.settings.temperatures if not Law(t).greedy), None)


def plan_study(models: ModelSpec, prompts, out: Path, settings: StudySettings,
               allow_training_prompts: bool) -> StudyPlan:
    """Check every input (nothing loads but the tokenizer), write ``OUT/prompts.jsonl`` and say how many prompts
    fit the target's context."""
    models.check()
    prompts_path = prompts or spec_bench_path()
    prompt_list = read_prompts(prompts_path, settings.limit)
    seen = check_unseen(models.drafter, prompt_list, allow_training_prompts)
    if settings.tune_trials:
        require("optuna", f"--tune-trials {settings.tune_trials} (tuning Base and Rows; 0 fits them untuned)")
    kept, skipped = fitting_prompts(models.target, prompt_list, settings.max_new_tokens)
    study_prompts = write_study_prompts(out, kept, settings.seed)
    reserved = online_reserve(len(kept), settings.online_prompts) if settings.online else 0
    log.info(f"{len(kept)} of {len(prompt_list)} prompts fit the target's context ({skipped} too long, skipped)"
             + (f"; the drafter trained on {seen} of them (--allow-training-prompts)" if seen else ""))
    return StudyPlan(out, models, settings, Path(prompts_path), len(prompt_list), len(kept), seen, study_prompts,
                     reserved)


def temperature_stage(plan: StudyPlan, temp: float, recorder: Recorder, tracking: Tracking | None, command: str,
                      default: bool) -> dict:
    """One temperature of the study: record to its round target, analyse, choose and refit the champion (installed
    as ``reranker:NAME`` for a named pair on the default prompts), then the online phase; its figures."""
    s, models = plan.settings, plan.models
    run_dir = StudyLayout(plan.out).run(temp).root
    goal = s.greedy_rounds if Law(temp).greedy else s.rounds
    pipeline = _pipeline_name(tracking, temp)
    figures = carried_figures(run_dir, s)
    if figures is not None and tracking is not None:
        raise StudyDirError(f"{run_dir}: a carried temperature (its recording is not here) has nothing to log to "
                            "MLflow; rerun with --no-tracking")
    if figures is None:
        decode = Tracking.stage(tracking.uri, tracking.experiment, pipeline, "decode") if tracking else None
        decoded = recorder.until(plan.study_prompts, plan.kept - plan.reserved, run_dir, temp, goal, s, decode)
        figures = analyse(run_dir, tracking, pipeline, s, models.threads)
        figures["prompts_decoded"] = decoded
        recorded = read_prompts(plan.study_prompts, limit=decoded)
        figures["champion"] = champion_stage(run_dir, figures, recorded, temp, s, models.threads,
                                             prompts_path=plan.prompts_path, command=command)
        write_json_atomic(RunLayout(run_dir).figures, {"settings": offline_settings(s), "figures": figures})
    named = champion_for(models.drafter, models.target)
    if named is not None and default:
        install_champion(RunLayout(run_dir).champion, temp, named)
    if plan.reserved:
        other = min(s.online_other_prompts, plan.reserved)
        goal_prompts = plan.reserved if temp == plan.goal_temperature else other
        figures["online"] = online_stage(run_dir, figures, read_prompts(plan.study_prompts)[-plan.reserved:], temp,
                                         models, s, goal_prompts=goal_prompts, other_prompts=other,
                                         progress=recorder.progress)
    return figures


def offline_settings(settings: StudySettings) -> dict:
    """The settings a temperature's offline figures depend on (every one but the online phase's)."""
    return {k: v for k, v in asdict(settings).items() if not k.startswith("online") and k != "temperatures"}


def carried_figures(run_dir: Path, settings: StudySettings) -> dict | None:
    """A carried temperature's offline figures: ``run_dir/figures.json`` and its champion kept without the recording
    they came from (``rounds/``: gone, as on another machine), made with these settings; None otherwise (the
    temperature is recorded and analysed as usual)."""
    run = RunLayout(run_dir)
    path = run.figures
    if run.rounds.is_dir() or not path.is_file() or not run.champion.exists():
        return None
    kept = read_json(path, "a study's carried figures")
    if kept.get("settings") != offline_settings(settings):
        raise StudyDirError(f"{path}: carried figures of other settings ({kept.get('settings')}); use a new --out")
    log.info(f"\n{run_dir.name}: its recording is not here; its offline figures and champion are carried ({path})")
    return kept["figures"]


def online_reserve(n_prompts: int, online_prompts: int) -> int:
    """How many prompts at the end of the study's order the online phase keeps unseen: ``online_prompts``, at most a
    quarter of the prompts (said in one line when lowered)."""
    reserved = min(online_prompts, n_prompts // 4)
    if reserved < online_prompts:
        log.info(f"online phase: {reserved} prompts kept unseen (of {online_prompts} asked: at most a quarter of the "
                 f"{n_prompts} prompts)")
    return reserved


def champion_stage(run_dir: Path, figures: dict, recorded, temp: float, settings: StudySettings,
                   threads: int | None, *, prompts_path, command: str) -> dict:
    """Choose the champion from ``figures``, refit it on every round of ``run_dir`` and save it with its card in
    ``run_dir/champion`` (redone only when the features or the choice changed); returns the choice and its path."""
    choice = choose_champion(figures)
    run = RunLayout(run_dir)
    features, path = run.features, run.champion

    def fit_and_save():
        model = fit_champion(choice["reranker"], run_dir, read_features(features), tune_trials=settings.tune_trials,
                             seed=settings.seed, n_jobs=threads, gbm={"n_estimators": settings.trees})
        model.card_ = model_card(choice["reranker"], choice, figures, recorded, data=Path(prompts_path).name,
                                 command=command, temperature=temp)
        model.save(path)
        log.info(f"champion {choice['reranker']} (mean gain over draft {choice['mean_gain_pct']:+.2f}% of draft's value) -> {path}")

    Stages(run.stages).run("champion", f"{file_hash(features)}:{choice['reranker']}", path / "reranker.json",
                                        fit_and_save, clear=path)
    return {**choice, "path": str(path.relative_to(run_dir.parent))}


def install_champion(path: Path, temp: float, name: str = "default") -> Path:
    """Copy a named pair's study champion into the cache, where ``reranker:NAME`` finds it before the shipped one
    (as a head ``make drafter`` trains into the cache wins over the shipped head)."""
    target = cached_reranker_dir(Law(temp).name, name)
    with timed(f"install: the champion as reranker:{name} ({Law(temp).name}), outside --out -> {target}"):
        target.parent.mkdir(parents=True, exist_ok=True)
        return save_reranker(load_reranker(path), target)


def online_stage(run_dir: Path, figures: dict, unseen, temp: float, models: ModelSpec, settings: StudySettings, *,
                 goal_prompts: int, other_prompts: int, progress: bool = True) -> dict:
    """Draft, the champion, root and root-draw selection decoded in the loop on ``unseen`` prompts at each of the
    online budgets (``goal_prompts`` of them at B = 8, ``other_prompts`` at the others), each beside the
    offline prediction for the same score; the tables are kept in ``run_dir/online/B<budget>``."""
    run = RunLayout(run_dir)
    champion = load_reranker(run.champion)
    name = figures["champion"]["reranker"]
    loaded = models.load()
    pipelined = ("root_draw",) if loaded.drafter.hidden_layers is None else ()
    out = {"reranker": name, "root_draw_pipelined": bool(pipelined), "budgets": {}}
    folders = {budget: run.online(budget) for budget in settings.online_budgets}
    todo = [b for b, folder in folders.items() if not (folder / "online_speed.parquet").is_file()]
    with kept_worker(loaded, bool(pipelined and todo)):  # one worker for every budget
        for budget, folder in folders.items():
            n = goal_prompts if budget == ONLINE_BUDGETS[0] else other_prompts
            if budget not in todo:
                comparison = OnlineComparison.open(folder)
            else:
                config = DecodeConfig(budget=budget, extra=0, temperature=temp,
                                      max_new_tokens=settings.max_new_tokens, seed=settings.seed)
                with timed(f"online: {n} unseen prompts at T = {temp:g}, B = {budget} -> {folder}"):
                    comparison = compare_online(loaded, unseen[:n], strategies=ONLINE_STRATEGIES, reranker=champion,
                                                reranker_source=str(run.champion), config=config,
                                                protocol=Protocol(bootstrap=settings.bootstrap, pipeline=pipelined),
                                                out=folder, progress=progress)
            out["budgets"][str(budget)] = online_figures(comparison, figures["budgets"].get(str(budget)), name,
                                                         n, settings.bootstrap, settings.seed)
    return out


def online_figures(comparison: OnlineComparison, offline: dict | None, champion: str, prompts: int, bootstrap: int,
                   seed: int) -> dict:
    """Per strategy: realized and expected accepted draft tokens a round, the realized gain and tokens/s ratio
    over draft; the offline prediction for the same score (``champion``: the reranked strategy's); the break-even gain on a ``GPU_ROUND_MS`` round."""
    strategies = {}
    per_round = comparison.tables["online_strategies"].set_index("strategy")
    for name in comparison.tables["online_strategies"]["strategy"]:
        entry = {"realized": comparison.realized(name), "expected": comparison.expected(name),
                 "speed": comparison.speed(name)}
        if name != comparison.base:
            entry["realized_gain"] = comparison.realized_gain(name, bootstrap, seed)
        strategies[name] = entry
    figures = {"prompts": prompts, "strategies": strategies}
    if offline is not None:
        offline_score = {"reranked": champion, "root": "root", "draft": "draft"}
        figures["offline"] = {s: offline["scores"][r] for s, r in offline_score.items() if r in offline["scores"]}
    r = per_round.loc["reranked"]
    rerank_ms = 1000.0 * float(r["rerank_s"]) / max(float(r["rounds"]), 1.0)
    draft = strategies["draft"]["realized"][0]
    # A reranker that costs c ms a round pays on a t ms round once it adds (1 + a) c / t accepted tokens a round.
    figures["break_even"] = {"rerank_ms": rerank_ms, "round_ms": GPU_ROUND_MS,
                             "gain": (1.0 + draft) * rerank_ms / GPU_ROUND_MS}
    return figures


def fitting_prompts(target: str, prompts, max_new_tokens: int, depth: int = 8) -> tuple[list, int]:
    """(the prompts whose chat-encoded length leaves room for ``max_new_tokens`` and a pool of ``depth`` in the
    target's context, how many were skipped); only the tokenizer loads."""
    tokenizer, context = load_target_tokenizer(target)
    if context is None:
        return list(prompts), 0
    kept = [p for p in prompts if len(encode_prompt(tokenizer, p.text)) + max_new_tokens + depth <= context]
    return kept, len(prompts) - len(kept)


def study_order(prompts, seed: int) -> list:
    """``prompts`` in a study's seeded order (any prefix mixes the tasks)."""
    return [prompts[i] for i in np.random.default_rng(seed).permutation(len(prompts))]


def unseen_prompts(target: str = DEFAULT_TARGET, prompts=None, *, online_prompts: int = DEFAULT_ONLINE_PROMPTS,
                   max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, seed: int = 0) -> list:
    """The prompts a study with these settings never records and decodes in its online phase: the last
    ``online_reserve`` of its order of the prompts that fit ``target`` (``prompts``: a JSONL file, default
    Spec-Bench). Only the tokenizer loads."""
    kept, _ = fitting_prompts(target, read_prompts(prompts or spec_bench_path()), max_new_tokens)
    reserved = online_reserve(len(kept), online_prompts)
    return study_order(kept, seed)[len(kept) - reserved:]


def write_study_prompts(out: Path, prompts, seed: int) -> Path:
    """``OUT/prompts.jsonl``: ``prompts`` in the study's order (``study_order``), in Spec-Bench form; an
    existing file must hold exactly these lines (the same study), else the study is refused."""
    text = spec_bench_text(study_order(prompts, seed))
    path = StudyLayout(out).prompts
    if path.is_file():
        if path.read_text(encoding="utf-8") != text:
            raise StudyDirError(f"{out} holds another study (its prompts.jsonl differs); use a new --out")
        return path
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda p: Path(p).write_text(text, encoding="utf-8"))
    return path


@dataclass(frozen=True)
class Recorder:
    """How the study records: the models, the workers that decode them, and the recording's own switches."""

    models: ModelSpec
    workers: object = None
    allow_training_prompts: bool = False
    progress: bool = True

    def until(self, prompts_path: Path, n_prompts: int, run_dir: Path, temp: float, goal: int | None,
              settings: StudySettings, tracking: Tracking | None = None) -> int:
        """Record ``prompts_path`` in order until ``goal`` rounds are recorded (or the prompts run out; None: every
        prompt, in one call); return how many prompts were decoded. Each call's size comes from the rounds recorded
        so far (``next_limit``), so the same study always decodes the same prompts; prompts already recorded are
        not decoded again. With ``tracking`` (the decode stage's), the n-th decoding call is its run, with ``-n``
        added to the name after the first."""
        config = DecodeConfig(temperature=temp, max_new_tokens=settings.max_new_tokens, seed=settings.seed)
        limit, calls = 0, 0
        while limit < n_prompts:
            limit = (n_prompts if goal is None else
                     next_limit(limit, recorded_rounds(run_dir, limit), goal, n_prompts, settings.chunk))
            if not set(range(limit)) <= (done_prompts(run_dir) if run_dir.exists() else set()):
                calls += 1
                tracked = tracking if tracking is None or calls == 1 else replace(
                    tracking, run_name=f"{tracking.run_name}-{calls}")
                with timed(f"record: the first {limit} prompts at T = {temp:g} -> {run_dir}"):
                    recording = record(self.models, prompts_path, out=run_dir, config=config, limit=limit,
                                       shard_size=SHARD_SIZE, workers=self.workers,
                                       allow_training_prompts=self.allow_training_prompts, progress=self.progress,
                                       tracking=tracked)
                    log.info(recording.summary)
            if goal is not None and recorded_rounds(run_dir, limit) >= goal:
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
    total = 0
    for f in sorted(RunLayout(Path(run_dir)).rounds.glob("shard-*.parquet")):
        m = SHARD.fullmatch(f.name)
        if m and int(m.group(2)) < below:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def analyse(run_dir: Path, tracking: Tracking | None, pipeline: str, settings: StudySettings,
            threads: int | None) -> dict:
    """Featurize, cross-fit, evaluate (each redone only when its input changed; with ``tracking``, each a stage
    run of the pipeline run ``pipeline``) and the study's figures."""
    def staged(stage: str) -> Tracking | None:
        return Tracking.stage(tracking.uri, tracking.experiment, pipeline, stage) if tracking else None

    run = RunLayout(run_dir)
    features, rerankers, predictions = run.features, run.rerankers, run.predictions
    stages = Stages(run.stages)
    stages.run("featurize", directory_hash(run.rounds), features,
               lambda: log.info(featurize(run_dir, tracking=staged("featurize")).summary))
    stages.run("train", f"{file_hash(features)}:{','.join(RERANKERS)}", predictions,
               lambda: cross_fit(Features(features), rerankers=RERANKERS, out=rerankers,
                                 tune_trials=settings.tune_trials, seed=settings.seed, n_jobs=threads,
                                 gbm={"n_estimators": settings.trees},
                                 tracking=staged("train"), model_prefix=pipeline if tracking else None),
               clear=rerankers)
    stages.run("evaluate", file_hash(predictions), run.evaluation / "meta.json",
               lambda: evaluate(run_dir, predictions, out=run.evaluation, bootstrap=settings.bootstrap,
                                seed=settings.seed, tracking=staged("evaluate")),
               clear=run.evaluation)
    rounds = load_rounds(run_dir)
    table = read_rounds_table(run_dir, ["prompt_id", "round", "covered", "accepted"]).to_pandas()
    fitted = Rerankers.open(rerankers)
    fold_models = {n: fitted.models(n) for n in ("base", "rows", "ranking") if n in fitted.names}
    figures = temperature_results(rounds, read_predictions(predictions), read_features(features), table,
                                  fold_models, settings.bootstrap, settings.seed)
    figures["realized_accepted_per_round"] = float(table["accepted"].mean())
    return figures


def write_results(out: Path, results: dict) -> None:
    """``results.json``, ``results.md`` and ``learning-curve.png`` in ``out`` (each written atomically)."""
    study = StudyLayout(out)
    write_json_atomic(study.results, results)
    atomic_write(study.curve, lambda p: learning_curve_figure(results, p))
    text = render_results(results, study.curve.name)
    atomic_write(study.page, lambda p: Path(p).write_text(text, encoding="utf-8"))


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


def machine(device: str, workers=None) -> str:
    """The machine in words: processor, cores, device, workers."""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
    count = getattr(workers, "n", None)
    return f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, {device}" + (
        f", {count} Ray workers" if count else "")


def _pipeline_name(tracking: Tracking | None, temp: float) -> str:
    return f"{(tracking.run_name if tracking else None) or 'study'}-{Law(temp).folder}"


def _pipeline_run(tracking: Tracking | None, name: str, temp: float, drafter: str):
    if tracking is None:
        return nullcontext()
    from specrank.experiments.study.tracking import pipeline_run  # MLflow is optional: loaded for a tracked study

    return pipeline_run(tracking, name, temp, drafter)


def _log_temperature(figures: dict, run_dir: Path, name: str, temp: float, drafter: str) -> str:
    from specrank.experiments.study.tracking import log_temperature  # MLflow, as above

    return log_temperature(figures, run_dir, name, temp, drafter)


def _finish(tracking: Tracking, pipelines: dict, champions: dict) -> list[str]:
    from specrank.experiments.study.tracking import finish  # MLflow, as above

    return finish(tracking, pipelines, champions, f"specrank {tracking.run_name or 'study'}")
