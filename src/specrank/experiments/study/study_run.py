"""The study: the workflow at the scale that can answer whether the rerankers help.

For each temperature: record prompts until a round target is met, featurize, cross-fit the isotonic, Base and
Rows rerankers, evaluate every score offline, then gather the figures at B = 8 and 59
(``specrank.experiments.study.study_tables``) into ``OUT/results.json``, ``OUT/results.md`` and ``OUT/learning-curve.png``.

The prompts are decoded in a fixed, seeded order; the first call decodes 24 of them, and each later call as
many more as the rounds per prompt so far say the round target needs (whole shards, at most ``chunk``), until
the target is met. The same call always decodes the same prompts, so a study interrupted anywhere and rerun
gives the same results. Each stage after recording is redone only when its input changed (digests in
``OUT/<temperature>/stages.json``).
"""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from specrank.atomic import atomic_write, write_json_atomic
from specrank.decode.loading.drafters import check_unseen
from specrank.decode.loading.model_spec import ModelSpec
from specrank.decode.prompts import read_prompts, spec_bench_path
from specrank.errors import require
from specrank.evaluation import load_rounds, read_predictions
from specrank.experiments.study.champion_stage import champion_stage, install_champion
from specrank.experiments.study.online_phase import online_stage
from specrank.experiments.study.provenance import machine, source_commit
from specrank.experiments.study.round_target import Recorder
from specrank.experiments.study.study_prompts import fitting_prompts, online_reserve, write_study_prompts
from specrank.experiments.study.study_settings import StudyDirError, StudySettings, offline_settings
from specrank.experiments.study.results_page import learning_curve_figure, render_results
from specrank.experiments.study.study_tables import RERANKERS, temperature_results
from specrank.featurize import read_features
from specrank.featurize.storage import read_rounds_table
from specrank.files import directory_hash, file_hash, read_json
from specrank.law import Law
from specrank.layout import RunLayout, StudyLayout
from specrank.outputs import check_output_dir
from specrank.rerankers.defaults import champion_for
from specrank.workflow.evaluation import evaluate
from specrank.workflow.features import Features, featurize
from specrank.workflow.rerankers import Rerankers, cross_fit
from specrank.workflow.stages import Stages, timed
from specrank.workflow.tracking import Tracking

log = logging.getLogger(__name__)


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


def study(models: ModelSpec, settings: StudySettings = StudySettings(), *, out, workers=None,
          allow_training_prompts: bool = False, progress: bool = True, tracking: Tracking | None = None,
          command: str = "") -> StudyResult:
    """Run (or resume) the study of ``models`` (a ``ModelSpec``: the workers and the online phase load the models
    from it) with ``settings`` (its prompts: ``settings.prompts``, default the bundled Spec-Bench questions) in
    directory ``out``.

    ``workers`` (``scale.Workers``) decodes on Ray workers. With ``tracking``, each temperature is one pipeline run
    (``<tracking.run_name or "study">-<temperature>``) whose nested runs are the stages, and the champion is
    registered from it (``experiments.study.study_tracking``). Every input is checked before a model loads.

    Each temperature's champion (``workflow.champion``) is refitted on all its rounds and saved in
    ``OUT/<temperature>/champion``. With ``settings.online``, the last ``online_prompts`` prompts of the study's
    order are never recorded: draft selection, the champion, root and root-draw selection decode them in the loop
    at each budget (``online_prompts`` of them at the first sampled temperature and B = 8, the cell the study's
    online goal reads; ``online_other_prompts`` elsewhere), beside the offline prediction for the same score.
    """
    out = check_output_dir(out).resolve()
    plan = plan_study(models, out, settings, allow_training_prompts)
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
                figures = temperature_stage(plan, temp, recorder, tracking, command, default=settings.prompts is None)
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


def plan_study(models: ModelSpec, out: Path, settings: StudySettings,
               allow_training_prompts: bool) -> StudyPlan:
    """Check every input (nothing loads but the tokenizer), write ``OUT/prompts.jsonl`` and say how many prompts
    fit the target's context."""
    models.check()
    prompts_path = settings.prompts or spec_bench_path()
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


def _pipeline_name(tracking: Tracking | None, temp: float) -> str:
    return f"{(tracking.run_name if tracking else None) or 'study'}-{Law(temp).folder}"


def _pipeline_run(tracking: Tracking | None, name: str, temp: float, drafter: str):
    if tracking is None:
        return nullcontext()
    from specrank.experiments.study.study_tracking import pipeline_run  # MLflow is optional: loaded for a tracked study

    return pipeline_run(tracking, name, temp, drafter)


def _log_temperature(figures: dict, run_dir: Path, name: str, temp: float, drafter: str) -> str:
    from specrank.experiments.study.study_tracking import log_temperature  # MLflow, as above

    return log_temperature(figures, run_dir, name, temp, drafter)


def _finish(tracking: Tracking, pipelines: dict, champions: dict) -> list[str]:
    from specrank.experiments.study.study_tracking import finish  # MLflow, as above

    return finish(tracking, pipelines, champions, f"specrank {tracking.run_name or 'study'}")
