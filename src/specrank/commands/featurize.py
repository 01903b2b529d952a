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

    if not Path(args.run_dir).is_dir():
        raise FileNotFoundError(f"no run directory {args.run_dir}")
    out = Path(args.out or Path(args.run_dir, "features.parquet"))
    df = featurize_run(args.run_dir)
    write_features(df, out)
    meta = df.attrs["specrank"]
    print(f"{out}: {len(df)} candidate rows, {df.prompt_id.nunique()} prompts, {meta['label_kind']} labels")
    if args.edges_out:
        edges = edges_run(args.run_dir)
        write_features(edges, args.edges_out)
        print(f"{args.edges_out}: {len(edges)} pool edges")
    return 0
