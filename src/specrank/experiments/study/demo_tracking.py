"""What ``specrank demo`` logs beyond its stages: one pipeline run per temperature (its stages nest under it)
with the headline of what the stages returned, the experiment's description and the links to print."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from specrank.tracking.lineage import log_dataset, rounds_dataset
from specrank.experiments.study.tracking import demo_description, describe_experiment, log_pipeline
from specrank.tracking.runs import experiment_run, log_params, run_page, runs_page
from specrank.tracking.uri import tracking_store


@contextmanager
def pipeline_run(experiment: str, uri: str, name: str, temp: float, drafter: str):
    """The parent run of one temperature's stages (each stage's run nests under it), its parameters logged as
    soon as it opens."""
    note = (f"The demo pipeline at T = {temp:g} with drafter {drafter}: its nested runs are the stages "
            "decode -> featurize -> train -> evaluate, linked by the datasets each logs.")
    with experiment_run(experiment, run_name=f"demo-{name}", tracking_uri=uri, tags={"specrank.stage": "pipeline"},
                        description=note) as active:
        log_params({"stage": "pipeline", "temperature": float(temp), "drafter": drafter, "store": uri})
        yield active


def summarize_pipeline(evaluation, run_dir: Path, rerankers, decode: dict, name: str, drafter: str,
                       temp: float) -> str:
    """The pipeline run's headline (``log_pipeline``), from what the stages returned (``decode``: the recording's
    metrics) and the recorded rounds in ``run_dir``; returns the champion's load URI."""
    log_dataset(rounds_dataset(run_dir), "pipeline")
    title = (f"**Demo pipeline {name}**: T = {temp:g}, drafter {drafter}; nested runs decode -> featurize -> train -> "
             "evaluate.")
    log_pipeline(evaluation, evaluation.path / "report.html",
                 {**rerankers.heldout, "n_prompts": evaluation.meta.get("prompts")}, decode, rerankers.registered,
                 title)
    return f"models:/demo-{name}@champion"


def finish(uri: str, experiment: str, experiment_id: str, champions: dict[str, str], drafter: str,
           pipelines: dict[str, str]) -> list[str]:
    """Describe the experiment; the lines that tell the user where everything is (every link opens the Runs view)."""
    with tracking_store(uri):
        describe_experiment(experiment_id, demo_description(uri, champions, drafter))
    lines = [f"Champion {model}: specrank.tracking.resolve_reranker(\"{load}\", tracking_uri=\"{uri}\")"
             for model, load in champions.items()]
    lines += [f"MLflow store: {uri} (experiment {experiment!r})", f"Browse the runs: mlflow ui --backend-store-uri {uri}",
              f"  then open {runs_page(experiment_id)}"]
    lines += [f"  headline of {run_name}: {run_page(experiment_id, run_id)}" for run_name, run_id in pipelines.items()]
    return lines
