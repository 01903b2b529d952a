"""``specrank featurize RUN_DIR``: the features table (one row per round and first-level candidate)."""

from __future__ import annotations

from pathlib import Path

HELP = "Featurize a run directory: one row per (round, first-level candidate) with every SPEC §5 feature."


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="run directory (manifest.json + rounds/*.parquet)")
    parser.add_argument("--out", help="features Parquet file (default: RUN_DIR/features.parquet)")
    parser.add_argument("--edges-out", help="also write one row per pool edge (for per-depth calibration)")


def run(args) -> int:
    from specrank.featurize import edges_run, featurize_run, write_features
    from specrank.outputs import check_output_file

    if not Path(args.run_dir).is_dir():
        raise FileNotFoundError(f"no run directory {args.run_dir}")
    out = check_output_file(args.out or Path(args.run_dir, "features.parquet"))
    edges_out = check_output_file(args.edges_out, "--edges-out") if args.edges_out else None
    df = featurize_run(args.run_dir)
    edges = edges_run(args.run_dir) if edges_out else None  # both computed before either is written
    write_features(df, out)
    meta = df.attrs["specrank"]
    print(f"{out}: {len(df)} candidate rows, {df.prompt_id.nunique()} prompts, {meta['label_kind']} labels")
    if edges_out:
        write_features(edges, edges_out)
        print(f"{edges_out}: {len(edges)} pool edges")
    return 0
