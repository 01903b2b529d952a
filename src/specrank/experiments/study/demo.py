"""``specrank demo``: the whole offline pipeline on the embedded default, end to end.

decode (sampling at T = 1 and greedy) -> featurize -> cross-fit rerankers -> evaluate with
prompt-bootstrap intervals -> MLflow, then a table of the scores at B = 8 and 59. The demo logs to its own
store (``<out>/mlflow.db``) and experiment; each temperature is one pipeline run, the headline (a few
metrics, the headline table, report.html, the champion's link), whose nested runs are the stages. The
reranker (isotonic, per-depth, Base, Rows) with the lowest cross-fitted held-out error is refitted on all
prompts and registered as ``models:/demo-<t>@champion``.
Every stage is a call of ``specrank.workflow`` (record, featurize, cross_fit, evaluate), so the demo doubles
as a worked example of the API; rerunning it resumes the recording's finished shards. It closes with a short
online check: draft selection against the shipped champion (``reranker:default``) in the decoding loop, on bundled
prompts it did not record.
"""

from __future__ import annotations

import os
from pathlib import Path

from specrank.commands.args import (DRAFTER_SPECS, add_device_arguments, add_drafter_arguments, add_target_argument,
                                    add_tracking_arguments, at_least, model_spec, parse_temperatures)
from specrank.commands import tracked
from specrank.commands.decode import add_seen_prompts_argument
from specrank.decode.config import DecodeConfig
from specrank.decode.core import parse_device
from specrank.decode.loading.drafters import check_unseen, parse_drafter_spec
from specrank.decode.loading.eagle3 import default_head_dir, has_default_head
from specrank.decode.loading.targets import check_target_spec
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.evaluation.names import of_kind
from specrank.evaluation.report import headline_table
from specrank.law import Law
from specrank.outputs import check_output_dir
from specrank.rerankers.defaults import DEFAULT, DEFAULT_DRAFTER, DefaultRerankerError, load_default_reranker
from specrank.workflow import Tracking, cross_fit, evaluate, featurize, record
from specrank.experiments.online.run import compare_online
from specrank.workflow.recording import decode_metrics
from specrank.workflow.stages import timed

RERANKERS = of_kind("control", "reranker")
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
    parser.add_argument("--no-online", action="store_true",
                        help="skip the closing online check of draft selection against the shipped champion")


# Sized so the whole demo (two decodes, both temperatures) stays a short first run on 2 CPU cores; a round of
# the 710-candidate pool costs about twice as much with early-exit:8 as with the shipped EAGLE-3 head, so the
# fallback decodes fewer prompts. The demo prints its own time; `specrank study` is the run at scale.
DEMO_SIZE = {"eagle3:default": (32, 14)}
# The closing online check: short enough to keep the demo a first run, long enough to see the champion act.
ONLINE_PROMPTS, ONLINE_TOKENS, ONLINE_TEMPERATURE, ONLINE_BUDGET = 12, 32, 1.0, 8
FALLBACK_SIZE = (24, 14)


def default_drafter() -> str:
    """``eagle3:default`` (the shipped head, or the cache's), else ``early-exit:8`` (said on stdout) in a checkout
    whose head was removed."""
    if has_default_head():
        return "eagle3:default"
    print(f"No trained EAGLE-3 head in {default_head_dir()} (`make drafter` trains one): "
          "drafting with early-exit:8.")
    return "early-exit:8"


def run(args) -> int:
    from specrank.experiments.study import demo_tracking  # MLflow: loaded once the CLI has set its log level

    temperatures = parse_temperatures(args.temperatures)
    check_output_dir(args.out or default_out())
    parse_device(args.device)
    check_target_spec(args.target)
    if args.drafter:
        parse_drafter_spec(args.drafter, args.eagle3_layers, args.specforge_norm_output)
    if args.tracking_uri is not None:
        tracked.checked_uri(args.tracking_uri)
    drafter = args.drafter or default_drafter()
    limit, max_new_tokens = DEMO_SIZE.get(drafter, FALLBACK_SIZE)
    limit, max_new_tokens = args.limit or limit, args.max_new_tokens or max_new_tokens
    # One folder per drafter, so switching drafters never meets another drafter's resumable runs.
    out = (args.out or default_out()).resolve() / drafter.replace(":", "-").replace("/", "_")
    check_unseen(drafter, read_prompts(default_prompts_path(), limit), args.allow_training_prompts)
    if args.tracking_uri is None:  # the demo's own store, beside its runs: ad-hoc runs elsewhere stay out of it
        (args.out or default_out()).mkdir(parents=True, exist_ok=True)  # every input checked: nothing partial
    own_store = f"sqlite:///{(args.out or default_out()).resolve() / 'mlflow.db'}"
    uri = tracked.checked_uri(args.tracking_uri or own_store)
    models = model_spec(args, drafter)
    tables, champions, experiment_id, pipelines = {}, {}, None, {}
    for temp in temperatures:
        name = Law(temp).folder
        run_dir = out / name

        def tracking(stage: str, name=name) -> Tracking:
            return Tracking.stage(uri, args.experiment, f"demo-{name}", stage)

        with demo_tracking.pipeline_run(args.experiment, uri, name, temp, drafter) as pipeline:
            experiment_id, pipelines[f"demo-{name}"] = pipeline.info.experiment_id, pipeline.info.run_id
            with timed(f"record: {limit} bundled prompts at T = {temp:g} -> {run_dir}"):
                recording = record(models, out=run_dir, config=DecodeConfig(temperature=temp,
                                                                            max_new_tokens=max_new_tokens),
                                   limit=limit, allow_training_prompts=args.allow_training_prompts,
                                   tracking=tracking("decode"))
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
            champions[f"demo-{name}"] = demo_tracking.summarize_pipeline(
                evaluation, recording.path, rerankers, decode_metrics(recording), name, drafter, temp)
        tables[name] = headline_table(evaluation.summary, evaluation.meta["headline_budgets"])
    for name, table in tables.items():
        print(f"\n## {name}: expected accepted draft tokens per round (held-out, 95% prompt-bootstrap intervals)\n")
        print(table)
    print(f"\nDrafter: {drafter}. Reports: {out}/*/evaluation/report.md (and report.html)")
    for line in demo_tracking.finish(uri, args.experiment, experiment_id, champions, drafter, pipelines):
        print(line)
    if not args.no_online:
        online_check(args, drafter, out / "online", limit)
    return 0


def online_check(args, drafter: str, out: Path, recorded: int) -> None:
    """Draft selection against the shipped champion (``reranker:default``), in the loop, at T = 1 and B = 8 on
    bundled prompts the demo did not record (the champion learned from Spec-Bench, which shares no prompt with
    them); said in one line and skipped for a drafter the champions were not trained with."""
    if drafter != DEFAULT_DRAFTER:
        print(f"\nOnline check skipped: {DEFAULT} was trained with {DEFAULT_DRAFTER}, not {drafter}.")
        return
    try:
        champion = load_default_reranker(ONLINE_TEMPERATURE)
    except DefaultRerankerError as exc:
        print(f"\nOnline check skipped: {exc}")
        return
    unseen = read_prompts(default_prompts_path())[recorded:recorded + ONLINE_PROMPTS]
    with timed(f"online: draft against {DEFAULT} on {len(unseen)} unseen bundled prompts, T = "
               f"{ONLINE_TEMPERATURE:g}, B = {ONLINE_BUDGET} -> {out}"):
        config = DecodeConfig(budget=ONLINE_BUDGET, extra=0, temperature=ONLINE_TEMPERATURE,
                              max_new_tokens=ONLINE_TOKENS)
        comparison = compare_online(model_spec(args, drafter), unseen, strategies=("draft", "reranked"),
                                    reranker=champion, reranker_source=DEFAULT, config=config, out=out, progress=True)
    gain = comparison.realized_gain("reranked")
    print(f"\n## Online: the shipped champion against draft selection ({len(unseen)} unseen prompts, "
          f"{ONLINE_TOKENS} tokens each)\n")
    for line in comparison.summary():
        print(line)
    print(f"realized gain in accepted draft tokens a round: {gain[0]:+.3f} [{gain[1]:+.3f}, {gain[2]:+.3f}] "
          "(a short check: `specrank study` measures it on 100 prompts)")
