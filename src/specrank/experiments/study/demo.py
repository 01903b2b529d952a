"""``specrank demo``: the study at a first run's size, on the embedded default.

The demo is a preset of ``specrank.experiments.study.study_run.study``, not a loop of its own: the first 32 bundled prompts
(24 without the EAGLE-3 head), 14 tokens each, every one recorded at T = 1 and greedily; featurized, cross-fitted,
evaluated with prompt-bootstrap intervals, the champion chosen by the study's rule and refitted on every prompt, all
logged to the demo's own MLflow store (``<out>/mlflow.db``, pipeline runs ``demo-t1`` and ``demo-greedy``, the
champions registered as ``models:/demo-<t>@champion``). It closes with a short online check: draft selection against
the shipped champion (``reranker:default``) in the decoding loop, on bundled prompts it did not record. Rerunning it
resumes where it stopped.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from specrank.commands import tracked
from specrank.commands.args import (
    DRAFTER_SPECS,
    add_device_arguments,
    add_drafter_arguments,
    add_target_argument,
    add_tracking_arguments,
    at_least,
    model_spec,
    parse_temperatures,
)
from specrank.commands.decode import add_seen_prompts_argument
from specrank.decode.config import DecodeConfig
from specrank.decode.core import parse_device
from specrank.decode.loading.drafters import parse_drafter_spec
from specrank.decode.loading.eagle3_named_heads import default_head_dir, has_default_head
from specrank.decode.loading.target_spec import check_target_spec
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.evaluation.names import full_label
from specrank.experiments.online.comparison import OnlineSettings, compare_online
from specrank.experiments.study.study_run import study
from specrank.experiments.study.study_settings import StudySettings
from specrank.experiments.study.results_page import scores_table, temperature_name
from specrank.outputs import check_output_dir
from specrank.rerankers.defaults import DEFAULT, DEFAULT_DRAFTER, DefaultRerankerError, load_default_reranker
from specrank.workflow import Tracking
from specrank.workflow.stages import timed

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


def settings(args, drafter: str) -> StudySettings:
    """The demo's study: every one of its prompts recorded (no round target), no online phase of its own (the
    closing check uses the shipped champion)."""
    limit, max_new_tokens = DEMO_SIZE.get(drafter, FALLBACK_SIZE)
    return StudySettings(temperatures=tuple(parse_temperatures(args.temperatures)), rounds=None, greedy_rounds=None,
                         max_new_tokens=args.max_new_tokens or max_new_tokens, bootstrap=args.bootstrap,
                         tune_trials=args.tune_trials, online=False, limit=args.limit or limit,
                         prompts=str(default_prompts_path()))


def run(args) -> int:
    parse_temperatures(args.temperatures)
    root = check_output_dir(args.out or default_out())
    parse_device(args.device)
    check_target_spec(args.target)
    if args.drafter:
        parse_drafter_spec(args.drafter, args.eagle3_layers, args.specforge_norm_output)
    if args.tracking_uri is not None:
        tracked.checked_uri(args.tracking_uri)
    drafter = args.drafter or default_drafter()
    preset = settings(args, drafter)
    # One folder per drafter, so switching drafters never meets another drafter's resumable runs.
    out = root.resolve() / drafter.replace(":", "-").replace("/", "_")
    # The demo's own store, beside its runs: ad-hoc runs elsewhere stay out of it.
    tracking = Tracking(args.tracking_uri or f"sqlite:///{root.resolve() / 'mlflow.db'}", args.experiment, "demo")
    result = study(model_spec(args, drafter), preset, out=out,
                   allow_training_prompts=args.allow_training_prompts, tracking=tracking,
                   command=shlex.join(["specrank", "demo", *getattr(args, "argv", [])]))
    for t, r in result.results["temperatures"].items():
        print(f"\n## {temperature_name(t)}: expected accepted draft tokens per round, held out (95% prompt-bootstrap "
              f"intervals); champion {full_label(r['champion']['reranker'])}")
        for b, figures in r["budgets"].items():
            print(f"\n### B = {b}\n")
            print("\n".join(scores_table(b, figures, champion=r["champion"]["reranker"])))
    print(f"\nDrafter: {drafter}. Reports: {out}/*/evaluation/report.md (and report.html); the study's figures: "
          f"{out / 'results.md'}")
    for line in result.links:
        print(line)
    if not args.no_online:
        online_check(args, drafter, out / "online", preset.limit)
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
        settings = OnlineSettings(unseen, ("draft", "reranked"), config=config)
        comparison = compare_online(model_spec(args, drafter), settings, reranker=champion, reranker_source=DEFAULT, out=out, progress=True)
    gain = comparison.realized_gain("reranked")
    print(f"\n## Online: the shipped champion against draft selection ({len(unseen)} unseen prompts, "
          f"{ONLINE_TOKENS} tokens each)\n")
    for line in comparison.summary():
        print(line)
    print(f"realized gain in accepted draft tokens a round: {gain[0]:+.3f} [{gain[1]:+.3f}, {gain[2]:+.3f}] "
          "(a short check: `specrank study` measures it on 100 prompts)")
