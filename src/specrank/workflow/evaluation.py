"""Evaluating every selection score offline on a recording's rounds with held-out predictions: tables, report,
figures, paired prompt-bootstrap intervals."""

from __future__ import annotations

import time
from pathlib import Path

from specrank.evaluation import Evaluation, evaluate_run, save_evaluation, write_report
from specrank.evaluation.figures import FIGURES
from specrank.featurize import featurize_rounds, read_manifest
from specrank.featurize.arrays import label_kind
from specrank.featurize.features import required_columns
from specrank.featurize.storage import check_same_rounds, rounds_digest
from specrank.files import read_schema, read_table
from specrank.outputs import check_distinct, check_output_dir, staged
from specrank.rerankers import load_reranker
from specrank.workflow.rerankers import Rerankers
from specrank.workflow.recording import Recording
from specrank.workflow.tracking import Tracking


def evaluate(recording: Recording | str | Path, rerankers: Rerankers | str | Path, *, out, budgets=None,
             bootstrap: int = 2000, seed: int = 0, models=None,
             tracking: Tracking | None = None, model_prefix: str | None = None) -> Evaluation:
    """Every score on ``recording``'s rounds with the held-out first factors of ``rerankers`` (or of a predictions
    file), written to ``out`` (tables, ``report.md``, ``report.html``, figures) only once complete.

    ``budgets`` default to the sweep 2..200 up to the pool size; ``bootstrap`` resamples prompts with ``seed``.
    With ``tracking``, the run is logged, and so is each fold model of ``models`` (a ``models/`` folder).
    """
    run_dir = recording.path if isinstance(recording, Recording) else Path(recording)
    predictions = rerankers.predictions_path if isinstance(rerankers, Rerankers) else Path(rerankers)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    if not predictions.is_file():
        raise FileNotFoundError(f"predictions file {predictions} does not exist")
    out = check_output_dir(out)
    check_distinct({"--out": out}, {"run directory": run_dir, "--predictions": predictions, "--models": models})
    fold_models = read_fold_models(models) if models else {}
    _check_models_rounds(fold_models, models, run_dir)
    tracking = tracking.checked() if tracking is not None else None  # before any work: no partial output
    started = time.time()  # the evaluate run's start: the work's, not its logging's
    evaluation = evaluate_run(run_dir, predictions, budgets=budgets, n_boot=bootstrap, seed=seed)
    with staged(out) as stage:  # the local outputs appear only once MLflow has them too
        save_evaluation(evaluation, stage)
        report = write_report(evaluation, stage)
        if tracking is not None:
            figures = {name: stage / "figures" / f"{name}.png" for name in FIGURES}  # the files just written
            html = (stage / "report.html").read_text()
            evaluation.logged_models = _log(tracking, evaluation, figures, report, html, run_dir, predictions,
                                            fold_models, started, model_prefix)
    evaluation.path = out
    return evaluation


def _check_models_rounds(models: dict, models_dir, run_dir: Path) -> None:
    """Refuse models fitted on other rounds than the run's (models that record none are not refused)."""
    recorded = {f"{name}-fold{fold}": getattr(m, "rounds_digest_", None)
                for fold, named in models.items() for name, m in named.items()}
    if any(recorded.values()):  # hashing the shards only when there is a digest to compare with
        digest = rounds_digest(run_dir)
        for key, value in recorded.items():
            check_same_rounds(f"--models {models_dir}: {key}", value, digest, f"run directory {run_dir} holds rounds")


def read_fold_models(models_dir) -> dict[str, dict]:
    """{fold: {name: reranker}} from the ``NAME-foldF`` rerankers of a ``models/`` folder (format 2)."""
    if not Path(models_dir).is_dir():
        raise FileNotFoundError(f"--models {models_dir}: no such directory")
    entries = sorted(p for p in Path(models_dir).glob("*-fold*") if not p.name.startswith("."))
    if not entries:
        raise FileNotFoundError(f"--models {models_dir}: no NAME-foldF models")
    models: dict[str, dict] = {}
    for entry in entries:
        name, fold = entry.name.split(".")[0].rsplit("-fold", 1)
        models.setdefault(fold, {})[name] = load_reranker(entry)
    return models


def _example(run_dir: Path):
    """Features of a few rounds of the first shard: the input example and signature of logged rerankers."""
    manifest = read_manifest(run_dir)
    shard = sorted(Path(run_dir, "rounds").glob("*.parquet"))[0]
    columns = required_columns(read_schema(shard).names, label_kind(manifest), False)
    return featurize_rounds(read_table(shard, columns=columns).slice(0, 4), manifest, labels=False)


def evaluation_manifest(run_dir: Path) -> dict:
    """The run's manifest without bulky entries (prompt lists), for MLflow parameters."""
    return {k: v for k, v in read_manifest(run_dir).items() if not isinstance(v, list) or len(v) <= 32}


def _log(tracking: Tracking, evaluation, figures, report, html: str, run_dir: Path, predictions: Path,
         models: dict, started: float, model_prefix: str | None) -> dict:
    # MLflow loads only for a tracked stage
    from specrank import tracking as mlflow_tracking
    from specrank.tracking.evaluation import evaluation_note, link_evaluated_models, log_evaluation  # MLflow too
    from specrank.tracking.lineage import file_dataset, log_dataset, rounds_dataset  # MLflow too

    meta = evaluation.meta
    params = {
        "stage": "evaluate",
        "run_dir": str(run_dir.resolve()),
        "run_dir_sha256": mlflow_tracking.directory_hash(run_dir),
        "predictions": str(predictions.resolve()),
        "predictions_sha256": mlflow_tracking.file_hash(predictions),
        "manifest": evaluation_manifest(run_dir),
        "evaluation": {k: meta[k] for k in ("law", "rounds", "prompts", "pool_size", "topk", "budgets",
                                            "scores", "bootstrap", "seed", "level")},  # scores: per_depth too
    }
    run_name = tracking.run_name or f"evaluate-{run_dir.resolve().name}"
    note = evaluation_note(evaluation, f"Offline evaluation of {run_dir.resolve().name}")
    with mlflow_tracking.experiment_run(tracking.experiment, run_name=run_name, tracking_uri=tracking.uri,
                                        tags={"specrank.stage": "evaluate"}, description=note, span=(started, None)):
        mlflow_tracking.log_params(params)
        log_dataset(rounds_dataset(run_dir), "evaluation")
        predictions_dataset = file_dataset(predictions)
        log_dataset(predictions_dataset, "evaluation")
        link_evaluated_models(predictions_dataset.digest)
        return log_evaluation(evaluation, figures, report, models, _example(run_dir) if models else None,
                              report_html=html, model_prefix=model_prefix or run_name, span=(started, None))
