"""``specrank featurize RUN_DIR``: the features table (one row per round and first-level candidate)."""

from __future__ import annotations

from specrank.commands.args import add_tracking_arguments
from specrank.workflow import Tracking, featurize



def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="run directory (manifest.json + rounds/*.parquet)")
    parser.add_argument("--out", help="features Parquet file (default: RUN_DIR/features.parquet)")
    parser.add_argument("--edges-out", help="also write one row per pool edge (for per-depth calibration)")
    add_tracking_arguments(parser, store="log nothing; 'default' is MLflow's default store", run_name="featurize-<run dir name>", no_tracking=None)


def run(args) -> int:
    tracking = Tracking.opt_in(args.tracking_uri, args.experiment, args.run_name)
    print(featurize(args.run_dir, out=args.out, edges_out=args.edges_out, tracking=tracking).summary)
    return 0
