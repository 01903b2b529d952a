"""``specrank decode`` in MLflow: the manifest as params; rounds, speed, acceptance and where the time went as
metrics; the prompts it read and the rounds it recorded as datasets."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq

from specrank.markdown import markdown_table
from specrank.tracking.lineage import file_dataset, log_dataset, rounds_dataset
from specrank.tracking.runs import experiment_run, log_metrics, log_params

UNITS = ("Acceptance is accepted draft tokens per round (tokens per target pass minus one); times are seconds "
         "of this invocation (a resumed run decodes only its unfinished shards); `recorded_*` count the whole "
         "run directory.")


def decode_metrics(timer, run_dir) -> dict[str, float]:
    """This invocation's rounds, tokens/s, acceptance and time split (the spans that measured something: a
    recording never reranks), and the run directory's totals. A recording drafts in its own process, so the
    drafter's own clock (``drafting``) would repeat ``time_draft_s`` and no root pass hides under it: both left out."""
    spans = {f"time_{span}_s": seconds for span, seconds in timer.split().items()
             if seconds != 0.0 and span not in ("drafting", "root_pass_hidden")}
    return _metrics(timer.rounds, timer.tokens, timer.total, {"target_passes": timer.passes, **spans}, run_dir)


def workers_decode_metrics(outcome, run_dir) -> dict[str, float]:
    """``decode_metrics`` of a run decoded on Ray workers (``scale.workers.Outcome``): tokens/s over the wall
    clock, time spans summed over the workers."""
    totals = outcome.totals()
    spans = {f"time_{k}": v for k, v in totals.items() if k.endswith("_s") and v != 0.0}
    return _metrics(totals.get("rounds", 0), totals.get("tokens", 0), max(outcome.wall, 1e-9),
                    {"target_passes": totals.get("passes", 0), "workers": len(outcome.timings),
                     "wall_s": outcome.wall, **spans}, run_dir)


def _metrics(rounds: int, tokens: int, seconds: float, more: dict, run_dir) -> dict[str, float]:
    out = {"rounds": rounds, "tokens": tokens}
    if rounds:
        out.update(accepted_per_round=tokens / rounds - 1, tokens_per_s=tokens / seconds)
    return {**{k: float(v) for k, v in {**out, **more}.items()}, **recorded_metrics(run_dir)}


def recorded_metrics(run_dir) -> dict[str, float]:
    """The whole run directory's rounds and acceptance (a resumed run's earlier shards included)."""
    shards = sorted(Path(run_dir, "rounds").glob("*.parquet"))
    if not shards:
        return {}
    accepted = [pq.read_table(f, columns=["accepted"]).column("accepted").to_numpy() for f in shards]
    total = sum(len(a) for a in accepted)
    out = {"recorded_rounds": float(total)}
    if total:
        out["recorded_accepted_per_round"] = float(sum(a.sum() for a in accepted)) / total
    return out


def log_decode(uri: str, experiment: str, run_name: str | None, run_dir, manifest: dict, metrics: dict,
               prompts) -> str:
    """One run for one ``specrank decode`` (``metrics`` from ``decode_metrics`` or ``workers_decode_metrics``),
    logged once the decoding is done: its start and end are the decoding's (its ``wall_s``, else
    ``time_total_s``, up to now), not the logging's. Returns its id."""
    shown = ("rounds", "accepted_per_round", "tokens_per_s", "time_target_s", "time_draft_s", "time_total_s",
             "recorded_rounds", "recorded_accepted_per_round")
    rows = [[k, f"{metrics[k]:.3f}"] for k in shown if k in metrics]
    note = (f"Recording of {manifest.get('target')} with drafter {manifest.get('drafter')} at T = "
            f"{manifest.get('temperature')}.\n\n" + markdown_table(["metric", "value"], rows) + "\n\n" + UNITS)
    name = run_name or f"decode-{Path(run_dir).resolve().name}"
    end = time.time()
    span = (end - metrics.get("wall_s", metrics.get("time_total_s", 0.0)), end)
    with experiment_run(experiment, run_name=name, tracking_uri=uri, tags={"specrank.stage": "decode"},
                        description=note, span=span) as run:
        log_params({"stage": "decode", "run_dir": str(Path(run_dir).resolve()), "manifest": manifest})
        log_metrics(metrics)
        log_dataset(file_dataset(prompts), "input")
        log_dataset(rounds_dataset(run_dir), "output")
        return run.info.run_id
