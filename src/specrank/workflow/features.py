"""Featurizing a recording: one row per (round, first-level candidate) with every feature of docs/design.md, and
optionally one row per pool edge (per-depth calibration's input)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specrank.featurize import edges_run, featurize_run, read_features, write_features
from specrank.layout import RunLayout
from specrank.outputs import check_distinct, check_output_file, restoring_files
from specrank.workflow.recording import Recording
from specrank.workflow.tracking import Tracking


@dataclass
class Features:
    """A features table (Parquet) and, when written, the edges table beside it; ``summary`` is the one-line
    account of the call that wrote them."""

    path: Path
    edges_path: Path | None = None
    summary: str = ""

    @classmethod
    def open(cls, path, edges=None) -> Features:
        """The features table at ``path`` (and the edges table at ``edges``)."""
        for what, p in (("features", path), ("edges", edges)):
            if p is not None and not Path(p).is_file():
                raise FileNotFoundError(f"{what} table {p}: no such file")
        return cls(Path(path), None if edges is None else Path(edges))

    def table(self) -> pd.DataFrame:
        return read_features(self.path)

    def edges(self) -> pd.DataFrame | None:
        return None if self.edges_path is None else read_features(self.edges_path)


def featurize(recording: Recording | str | Path, *, out=None, edges_out=None,
              tracking: Tracking | None = None) -> Features:
    """The features of ``recording`` written to ``out`` (default: ``features.parquet`` in its run directory) and,
    with ``edges_out``, its pool edges; both are computed before either is written."""
    run_dir = recording.path if isinstance(recording, Recording) else Path(recording)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"no run directory {run_dir}")
    out = check_output_file(out or RunLayout(run_dir).features)
    edges_out = check_output_file(edges_out, "--edges-out") if edges_out else None
    run_files = sorted(run_dir.glob("*.json")) + sorted(Path(run_dir, "rounds").glob("*"))
    check_distinct({"--out": out, "--edges-out": edges_out},
                   {f"run file {p.relative_to(run_dir)}": p for p in run_files})
    tracking = tracking.checked() if tracking is not None else None  # an unreachable store fails before any output
    started = time.time()  # the featurize run's start (its MLflow run is logged once the files are written)
    df = featurize_run(run_dir)
    edges = edges_run(run_dir) if edges_out else None
    with restoring_files([out, edges_out]):  # a store that refuses the run leaves the files as they were
        write_features(df, out)
        if edges_out:
            write_features(edges, edges_out)
        if tracking is not None:
            from specrank.tracking.featurize import log_featurize  # MLflow loads only for a tracked stage

            log_featurize(tracking.uri, tracking.experiment, tracking.run_name, run_dir, out, df, started=started)
    meta = df.attrs["specrank"]
    summary = f"{out}: {len(df)} candidate rows, {df.prompt_id.nunique()} prompts, {meta['label_kind']} labels"
    if edges_out:
        summary += f"\n{edges_out}: {len(edges)} pool edges"
    return Features(out, edges_out, summary)
