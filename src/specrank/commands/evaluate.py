"""``specrank evaluate``: every selection rule on a run's recorded rounds -> tables, report, figures, MLflow."""

from __future__ import annotations

import time
from pathlib import Path

from specrank.commands.args import add_tracking_arguments, at_least
from specrank.featurize import featurize_rounds, read_manifest
from specrank.featurize.arrays import label_kind
from specrank.featurize.features import required_columns
from specrank.featurize.storage import check_same_rounds, rounds_digest
from specrank.files import read_schema, read_table
from specrank.outputs import check_distinct, check_output_dir, staged
from specrank.rerankers import load_reranker

HELP = "Evaluate every selection rule offline on a run's recorded rounds, with paired prompt-bootstrap intervals."


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (manifest.json + rounds/*.parquet)")
    parser.add_argument("--predictions", required=True,
                        help="cross-fitted predictions (Parquet or CSV): prompt_id, task, round, cand"
                             " + one column per reranker")
    parser.add_argument("--out", required=True, help="output directory for tables, report.md and figures/")
    parser.add_argument("--budgets", type=at_least(1), nargs="+", default=None,
                        help="budgets B to evaluate (default: the sweep 2..200 up to the pool size)")
    parser.add_argument("--bootstrap", type=at_least(1), default=2000,
                        help="paired prompt-bootstrap resamples (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    add_tracking_arguments(parser, run_name="evaluate-<run dir name>")
    parser.add_argument("--models", default=None,
                        help="models/ directory of 'specrank train' (NAME-foldF): log each as an MLflow model"
                             " in its fold's nested run")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="also load pickled (format 1) --models: this runs code from the files, trust them first")
    parser.add_argument("--model-prefix", default=None,
                        help="logged models are named PREFIX-NAME-foldF (default: the run name)")


def run(args) -> int:
    from specrank.evaluation import evaluate_run, save_evaluation, write_report
    from specrank.evaluation.figures import FIGURES

    run_dir, predictions = Path(args.run_dir), Path(args.predictions)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    if not predictions.is_file():
        raise FileNotFoundError(f"predictions file {predictions} does not exist")
    out = check_output_dir(args.out)
    check_distinct({"--out": out}, {"run directory": run_dir, "--predictions": predictions, "--models": args.models})
    models = _read_models(args.models, args.trust_pickle) if args.models else {}
    _check_models_rounds(models, args.models, run_dir)
    uri = None
    if not args.no_tracking:
        from specrank.tracking import check_tracking_uri, resolve_tracking_uri

        uri = check_tracking_uri(resolve_tracking_uri(args.tracking_uri))  # before any work: no partial output
    started = time.time()  # the evaluate run's start: the work's, not its logging's
    evaluation = evaluate_run(run_dir, predictions, budgets=args.budgets, n_boot=args.bootstrap, seed=args.seed)
    with staged(out) as stage:  # the local outputs appear only once MLflow has them too
        save_evaluation(evaluation, stage)
        report = write_report(evaluation, stage)
        if uri is not None:
            figures = {name: stage / "figures" / f"{name}.png" for name in FIGURES}  # the files just written
            html = (stage / "report.html").read_text()
            for key, model_uri in _track(args, uri, evaluation, figures, report, html, run_dir, predictions,
                                         models, started).items():
                print(f"model {key}: {model_uri}")
    s = evaluation.summary
    for b in evaluation.meta["headline_budgets"]:
        root = s[(s["score"] == "root") & (s["budget"] == b)].iloc[0]
        print(f"B={b}: draft {s[(s['score'] == 'draft') & (s['budget'] == b)]['mean'].iloc[0]:.3f}, "
              f"root gain {root['gain']:+.3f} [{root['gain_low']:+.3f}, {root['gain_high']:+.3f}]")
    print(f"{evaluation.meta['rounds']} rounds, {evaluation.meta['prompts']} prompts -> {args.out}/report.md"
          + (f" (MLflow: {uri})" if uri else ""))
    return 0


def _check_models_rounds(models: dict, models_dir, run_dir: Path) -> None:
    """Refuse models fitted on other rounds than the run's (models that record none are not refused)."""
    recorded = {f"{name}-fold{fold}": getattr(m, "rounds_digest_", None)
                for fold, named in models.items() for name, m in named.items()}
    if any(recorded.values()):  # hashing the shards only when there is a digest to compare with
        digest = rounds_digest(run_dir)
        for key, value in recorded.items():
            check_same_rounds(f"--models {models_dir}: {key}", value, digest, f"run directory {run_dir} holds rounds")


def _read_models(models_dir, trust_pickle: bool = False) -> dict[str, dict]:
    """{fold: {name: reranker}} from the ``NAME-foldF`` rerankers of ``specrank train``'s models/ (format 2)."""
    if not Path(models_dir).is_dir():
        raise FileNotFoundError(f"--models {models_dir}: no such directory")
    entries = sorted(p for p in Path(models_dir).glob("*-fold*") if not p.name.startswith("."))
    if not entries:
        raise FileNotFoundError(f"--models {models_dir}: no NAME-foldF models")
    models: dict[str, dict] = {}
    for entry in entries:
        name, fold = entry.name.split(".")[0].rsplit("-fold", 1)
        models.setdefault(fold, {})[name] = load_reranker(entry, trust_pickle=trust_pickle)
    return models


def _example(run_dir: Path):
    """Features of a few rounds of the first shard: the input example and signature of logged rerankers."""
    manifest = read_manifest(run_dir)
    shard = sorted(Path(run_dir, "rounds").glob("*.parquet"))[0]
    columns = required_columns(read_schema(shard).names, label_kind(manifest), False)
    return featurize_rounds(read_table(shard, columns=columns).slice(0, 4), manifest, labels=False)


def _track(args, uri, evaluation, figures, report, html: str, run_dir: Path, predictions: Path,
           models: dict, started: float) -> dict:
    from specrank import tracking
    from specrank.tracking.evaluation import evaluation_note, link_evaluated_models, log_evaluation
    from specrank.tracking.lineage import file_dataset, log_dataset, rounds_dataset

    meta = evaluation.meta
    params = {
        "stage": "evaluate",
        "run_dir": str(run_dir.resolve()),
        "run_dir_sha256": tracking.directory_hash(run_dir),
        "predictions": str(predictions.resolve()),
        "predictions_sha256": tracking.file_hash(predictions),
        "manifest": evaluation_manifest(run_dir),
        "evaluation": {k: meta[k] for k in ("law", "rounds", "prompts", "pool_size", "topk", "budgets",
                                            "rerankers", "bootstrap", "seed", "level")},
    }
    run_name = args.run_name or f"evaluate-{run_dir.resolve().name}"
    note = evaluation_note(evaluation, f"Offline evaluation of {run_dir.resolve().name}")
    with tracking.experiment_run(args.experiment, run_name=run_name, tracking_uri=uri,
                                 tags={"specrank.stage": "evaluate"}, description=note, span=(started, None)):
        tracking.log_params(params)
        log_dataset(rounds_dataset(run_dir), "evaluation")
        predictions_dataset = file_dataset(predictions)
        log_dataset(predictions_dataset, "evaluation")
        link_evaluated_models(predictions_dataset.digest)
        return log_evaluation(evaluation, figures, report, models, _example(run_dir) if models else None,
                              report_html=html, model_prefix=args.model_prefix or run_name,
                              span=(started, None))


def evaluation_manifest(run_dir: Path) -> dict:
    """The run's manifest without bulky entries (prompt lists), for MLflow parameters."""
    return {k: v for k, v in read_manifest(run_dir).items() if not isinstance(v, list) or len(v) <= 32}
