"""``specrank demo``: the whole offline pipeline on the embedded default, end to end.

decode (sampling at T = 1 and greedy) -> featurize -> cross-fit rerankers -> evaluate with
prompt-bootstrap intervals -> MLflow, then a table of the scores at B = 8 and 59. The demo logs to its own
store (``<out>/mlflow.db``) and experiment; each temperature is one pipeline run, the headline (a few
metrics, the headline table, report.html, the champion's link), whose nested runs are the stages. The
reranker (isotonic, per-depth, Base, Rows) with the lowest cross-fitted held-out error is refitted on all
prompts and registered as ``models:/demo-<t>@champion``.
Every stage is a call of ``specrank.workflow`` (record, featurize, cross_fit, evaluate), so the demo doubles
as a worked example of the API; rerunning it resumes the recording's finished shards.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from specrank.commands.args import (DRAFTER_SPECS, add_device_arguments, add_drafter_arguments, add_target_argument,
                                    add_tracking_arguments, at_least, parse_temperatures)
from specrank.commands.decode import add_seen_prompts_argument
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.law import GREEDY, Law
from specrank.outputs import check_output_dir
from specrank.workflow import Tracking, cross_fit, evaluate, featurize, record
from specrank.workflow.recording import decode_metrics
from specrank.workflow.stages import timed

RERANKERS = ("isotonic", "per_depth", "base", "rows")
MIN_PROMPTS = 4  # two cross-fitting halves, each split again in two for the hyper-parameter search


def default_out() -> Path:
    """``$SPECRANK_CACHE/demo`` (default ``~/.cache/specrank/demo``)."""
    return Path(os.environ.get("SPECRANK_CACHE", Path.home() / ".cache" / "specrank")) / "demo"


def add_arguments(parser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="demo directory (default ~/.cache/specrank/demo)")
    add_target_argument(parser)
    add_drafter_arguments(parser, help=DRAFTER_SPECS + " (default: eagle3:default, the head that ships in the package"
                                       " or the one `make drafter` trained into the cache)")
    parser.add_argument("--limit", type=at_least(MIN_PROMPTS), default=None,
                        help="prompts of the bundled set to decode (default 32 with the EAGLE-3 head, 24 without;"
                             f" at least {MIN_PROMPTS}: tuning inside each cross-fitting half needs two prompts)")
    parser.add_argument("--max-new-tokens", type=at_least(1), default=None,
                        help="tokens per prompt (default 14 with the EAGLE-3 head, 14 without)")
    parser.add_argument("--temperatures", default="1,0", help="comma-separated temperatures (default 1,0)")
    parser.add_argument("--bootstrap", type=at_least(1), default=2000)
    parser.add_argument("--tune-trials", type=at_least(0), default=12,
                        help="Optuna trials per fold of Base and Rows (default 12)")
    add_tracking_arguments(parser, store="the demo's own store, sqlite:///OUT/mlflow.db", experiment="specrank-demo",
                           run_name=None, no_tracking=None)
    add_device_arguments(parser, dtype=False, threads=None)
    add_seen_prompts_argument(parser)


# Sized so the whole demo (two decodes, both temperatures) stays a short first run on 2 CPU cores; a round of
# the 710-candidate pool costs about twice as much with early-exit:8 as with the shipped EAGLE-3 head, so the
# fallback decodes fewer prompts. The demo prints its own time; `specrank study` is the run at scale.
DEMO_SIZE = {"eagle3:default": (32, 14)}
FALLBACK_SIZE = (24, 14)


def default_drafter() -> str:
    """``eagle3:default`` (the shipped head, or the cache's), else ``early-exit:8`` (said on stdout) in a checkout
    whose head was removed."""
    from specrank.decode.loading.eagle3 import default_head_dir, has_default_head

    if has_default_head():
        return "eagle3:default"
    print(f"No trained EAGLE-3 head in {default_head_dir()} (`make drafter` trains one): "
          "drafting with early-exit:8.")
    return "early-exit:8"


def run(args) -> int:
    from specrank.decode.core import parse_device
    from specrank.decode.loading.drafters import check_unseen, parse_drafter_spec
    from specrank.decode.loading.targets import check_target_spec
    from specrank.evaluation.report import headline_table
    from specrank.tracking import check_tracking_uri, resolve_tracking_uri

    temperatures = parse_temperatures(args.temperatures)
    check_output_dir(args.out or default_out())
    parse_device(args.device)
    check_target_spec(args.target)
    if args.drafter:
        parse_drafter_spec(args.drafter, args.eagle3_layers, args.specforge_norm_output)
    if args.tracking_uri is not None:
        check_tracking_uri(resolve_tracking_uri(args.tracking_uri))
    drafter = args.drafter or default_drafter()
    limit, max_new_tokens = DEMO_SIZE.get(drafter, FALLBACK_SIZE)
    limit, max_new_tokens = args.limit or limit, args.max_new_tokens or max_new_tokens
    # One folder per drafter, so switching drafters never meets another drafter's resumable runs.
    out = (args.out or default_out()).resolve() / drafter.replace(":", "-").replace("/", "_")
    check_unseen(drafter, read_prompts(default_prompts_path(), limit), args.allow_training_prompts)
    if args.tracking_uri is None:  # the demo's own store, beside its runs: ad-hoc runs elsewhere stay out of it
        (args.out or default_out()).mkdir(parents=True, exist_ok=True)  # every input checked: nothing partial
    own_store = f"sqlite:///{(args.out or default_out()).resolve() / 'mlflow.db'}"
    uri = check_tracking_uri(resolve_tracking_uri(args.tracking_uri or own_store))
    tables, champions, experiment_id, pipelines = {}, {}, None, {}
    for temp in temperatures:
        name = GREEDY if Law(temp).greedy else f"t{temp:g}"
        run_dir = out / name

        def tracking(stage: str, name=name) -> Tracking:
            return Tracking.stage(uri, args.experiment, f"demo-{name}", stage)

        with _pipeline_run(args.experiment, uri, name, temp, drafter) as pipeline:
            experiment_id, pipelines[f"demo-{name}"] = pipeline.info.experiment_id, pipeline.info.run_id
            with timed(f"record: {limit} bundled prompts at T = {temp:g} -> {run_dir}"):
                recording = record(args.target, drafter, out=run_dir, temperature=temp, limit=limit,
                                   max_new_tokens=max_new_tokens, device=args.device, graphs=args.graphs,
                                   eagle3_layers=args.eagle3_layers,
                                   specforge_norm_output=args.specforge_norm_output,
                                   allow_training_prompts=args.allow_training_prompts, tracking=tracking("decode"))
                print(recording.summary, flush=True)
            with timed(f"featurize: {run_dir}"):
                features = featurize(recording, edges_out=run_dir / "edges.parquet", tracking=tracking("featurize"))
                print(features.summary, flush=True)
            with timed(f"cross-fit: {', '.join(RERANKERS)}"):
                rerankers = cross_fit(features, rerankers=RERANKERS, out=run_dir / "rerankers",
                                      tune_trials=args.tune_trials, tracking=tracking("train"),
                                      model_prefix=f"demo-{name}", register=f"demo-{name}")
            with timed(f"evaluate: {run_dir / 'evaluation'}"):
                evaluation = evaluate(recording, rerankers, out=run_dir / "evaluation", bootstrap=args.bootstrap,
                                      tracking=tracking("evaluate"))
            champions[f"demo-{name}"] = _summarize_pipeline(evaluation, recording, rerankers, name, drafter, temp)
        tables[name] = headline_table(evaluation.summary, evaluation.meta["headline_budgets"])
    for name, table in tables.items():
        print(f"\n## {name}: expected accepted draft tokens per round (held-out, 95% prompt-bootstrap intervals)\n")
        print(table)
    print(f"\nDrafter: {drafter}. Reports: {out}/*/evaluation/report.md (and report.html)")
    from specrank.tracking.pipeline import demo_description, describe_experiment
    from specrank.tracking.runs import run_page, runs_page
    from specrank.tracking.uri import tracking_store

    with tracking_store(uri):
        describe_experiment(experiment_id, demo_description(uri, champions, drafter))
    for model, load in champions.items():
        print(f"Champion {model}: specrank.tracking.resolve_reranker(\"{load}\", tracking_uri=\"{uri}\")")
    print(f"MLflow store: {uri} (experiment {args.experiment!r})\n"
          f"Browse the runs: mlflow ui --backend-store-uri {uri}\n  then open {runs_page(experiment_id)}")
    for run_name, run_id in pipelines.items():
        print(f"  headline of {run_name}: {run_page(experiment_id, run_id)}")
    return 0


def _pipeline_run(experiment: str, uri: str, name: str, temp: float, drafter: str):
    """The parent run of one temperature's stages (each stage's run nests under it)."""
    from specrank.tracking import experiment_run

    note = (f"The demo pipeline at T = {temp:g} with drafter {drafter}: its nested runs are the stages "
            "decode -> featurize -> train -> evaluate, linked by the datasets each logs.")
    return _with_params(experiment_run(experiment, run_name=f"demo-{name}", tracking_uri=uri,
                                       tags={"specrank.stage": "pipeline"}, description=note),
                        {"stage": "pipeline", "temperature": float(temp), "drafter": drafter, "store": uri})


@contextmanager
def _with_params(run, params: dict):
    """``run`` with ``params`` logged as soon as it opens."""
    from specrank.tracking import log_params

    with run as active:
        log_params(params)
        yield active


def _summarize_pipeline(evaluation, recording, rerankers, name: str, drafter: str, temp: float) -> str:
    """The pipeline run's headline (``specrank.tracking.pipeline.log_pipeline``), from what the stages returned,
    and the recorded rounds; returns the champion's load URI."""
    from specrank.tracking.lineage import log_dataset, rounds_dataset
    from specrank.tracking.pipeline import log_pipeline

    log_dataset(rounds_dataset(recording.path), "pipeline")
    title = f"**Demo pipeline {name}**: T = {temp:g}, drafter {drafter}; nested runs decode -> featurize -> train -> evaluate."
    log_pipeline(evaluation, evaluation.path / "report.html",
                 {**rerankers.heldout, "n_prompts": evaluation.meta.get("prompts")}, decode_metrics(recording),
                 rerankers.registered, title)
    return f"models:/demo-{name}@champion"
