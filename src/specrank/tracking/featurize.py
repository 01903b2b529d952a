"""``specrank featurize`` in MLflow: the rounds it read and the features it wrote, as datasets, with their sizes."""

from __future__ import annotations

from pathlib import Path

from specrank.markdown import markdown_table
from specrank.tracking.lineage import file_dataset, log_dataset, rounds_dataset
from specrank.tracking.runs import experiment_run, log_metrics, log_params


def log_featurize(uri: str, experiment: str, run_name: str | None, run_dir, features_path, features,
                  started: float | None = None) -> str:
    """One run for one ``specrank featurize`` that began at ``started`` (epoch seconds; default: now); returns
    its id."""
    meta = features.attrs.get("specrank", {})
    metrics = {"n_candidates": len(features), "n_rounds": len(features.drop_duplicates(["prompt_id", "round"])),
               "n_prompts": features["prompt_id"].nunique()}
    if "label" in features:
        metrics["label_mean"] = float(features["label"].mean())
    note = (f"Features of {Path(run_dir).resolve().name}: one row per (round, first-level candidate), "
            f"{meta.get('label_kind', '?')} labels (the target's first factor of each candidate).\n\n"
            + markdown_table(["metric", "value"], [[k, f"{v:g}"] for k, v in metrics.items()]))
    name = run_name or f"featurize-{Path(run_dir).resolve().name}"
    with experiment_run(experiment, run_name=name, tracking_uri=uri, tags={"specrank.stage": "featurize"},
                        description=note, span=None if started is None else (started, None)) as run:
        log_params({"stage": "featurize", "run_dir": str(Path(run_dir).resolve()),
                    "features": str(Path(features_path).resolve()), "meta": meta})
        log_metrics(metrics)
        log_dataset(rounds_dataset(run_dir), "input")
        log_dataset(file_dataset(features_path), "output")
        return run.info.run_id
