"""``specrank featurize RUN_DIR``: the features table (one row per round and first-level candidate)."""

from __future__ import annotations

import time
from pathlib import Path

from specrank.commands.args import add_tracking_arguments
from specrank.featurize import edges_run, featurize_run, write_features
from specrank.outputs import check_distinct, check_output_file, restoring_files

HELP = "Featurize a run directory: one row per (round, first-level candidate) with every feature of docs/design.md."


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="run directory (manifest.json + rounds/*.parquet)")
    parser.add_argument("--out", help="features Parquet file (default: RUN_DIR/features.parquet)")
    parser.add_argument("--edges-out", help="also write one row per pool edge (for per-depth calibration)")
    add_tracking_arguments(parser, store="log nothing; 'default' is MLflow's default store", run_name="featurize-<run dir name>", no_tracking=None)


def run(args) -> int:
    if not Path(args.run_dir).is_dir():
        raise FileNotFoundError(f"no run directory {args.run_dir}")
    out = check_output_file(args.out or Path(args.run_dir, "features.parquet"))
    edges_out = check_output_file(args.edges_out, "--edges-out") if args.edges_out else None
    run_files = sorted(Path(args.run_dir).glob("*.json")) + sorted(Path(args.run_dir, "rounds").glob("*"))
    check_distinct({"--out": out, "--edges-out": edges_out},
                   {f"run file {p.relative_to(args.run_dir)}": p for p in run_files})
    uri = None
    if args.tracking_uri is not None:
        from specrank.tracking.uri import optional_uri

        uri = optional_uri(args.tracking_uri)  # an unreachable store fails before any output
    started = time.time()  # the featurize run's start (its MLflow run is logged once the files are written)
    df = featurize_run(args.run_dir)
    edges = edges_run(args.run_dir) if edges_out else None  # both computed before either is written
    with restoring_files([out, edges_out]):  # a store that refuses the run leaves the files as they were
        write_features(df, out)
        if edges_out:
            write_features(edges, edges_out)
        if uri is not None:
            from specrank.tracking.featurize import log_featurize

            log_featurize(uri, args.experiment, args.run_name, args.run_dir, out, df, started=started)
    meta = df.attrs["specrank"]
    print(f"{out}: {len(df)} candidate rows, {df.prompt_id.nunique()} prompts, {meta['label_kind']} labels")
    if edges_out:
        print(f"{edges_out}: {len(edges)} pool edges")
    return 0
