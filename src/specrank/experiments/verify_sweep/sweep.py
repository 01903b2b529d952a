"""A grid of verification rules run with tree and chain speculation on one prompt set (``specrank
verify-sweep``): one resumable lossy run per (speculation, rule) cell under ``OUT/runs``, recorded through the
workflow's record stage, here or on Ray workers, then the sweep's table, report and trade-off figure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specrank.atomic import atomic_write, write_parquet_atomic
from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.loading.model_spec import ModelSpec
from specrank.decode.runs.chain import chain_config
from specrank.decode.runs.lossy import read_diagnostics
from specrank.decode.verify.lossy.parse import parse_verification_rule
from specrank.decode.verify.lossy.rules import RuleError
from specrank.decode.verify.lossy.tree import tree_form
from specrank.experiments.verify_sweep.sweep_tables import (
    DEFAULT_GRID,
    expand_grid,
    sweep_report,
    sweep_table,
    tradeoff_figure,
)
from specrank.outputs import removing_new_dirs
from specrank.workflow.recording import Lossy, record_cells


def grid_cells(grid, speculations) -> tuple[list[dict], list[str]]:
    """(cells {speculation, verification_rule (the spec), rule (parsed)}, skipped 'speculation spec' notes) for
    every grid combination."""
    specs = [spec for entry in grid for spec in expand_grid(entry)]
    rules = [parse_verification_rule(spec) for spec in specs]  # every entry must parse before any work
    cells, skipped = [], []
    for speculation in speculations:
        for spec, rule in zip(specs, rules, strict=True):
            try:
                if speculation == "tree":
                    tree_form(rule)
            except RuleError:
                skipped.append(f"{speculation} {spec}")
                continue
            cells.append({"speculation": speculation, "verification_rule": spec, "rule": rule})
    if not cells:
        raise ValueError("the grid has no rule the chosen speculations can run")
    return cells, skipped


def cell_dir(out: Path, cell: dict) -> Path:
    return out / "runs" / cell["speculation"] / re.sub(r"[^A-Za-z0-9_.=-]", "_", cell["verification_rule"])


@dataclass(frozen=True)
class SweepDecoding:
    """How every cell decodes: tree speculation grows ``shape`` and verifies ``budget`` (+ ``extra``) nodes, chain
    speculation drafts ``chain_length`` tokens a round; both under one law, length and seed."""

    shape: PoolShape
    budget: int
    extra: int = 0
    chain_length: int = 4
    temperature: float = 0.7
    max_new_tokens: int = 64
    seed: int = 0

    def config(self, speculation: str) -> DecodeConfig:
        if speculation == "chain":
            return chain_config(self.chain_length, self.temperature, self.max_new_tokens, self.seed)
        return DecodeConfig(self.shape, self.budget, self.extra, self.temperature, self.max_new_tokens, self.seed)


def decode_cells(cells, configs: dict, models: ModelSpec, prompts_path, out: Path, limit: int | None,
                 shard_size: int, workers=None, progress: bool = True) -> None:
    """Record every cell into ``cell_dir(out, cell)`` through the workflow's record stage, with its speculation's
    config (``configs``) and rule, resuming finished shards: on ``workers`` (one queue of every cell's shards) or
    here, the models loaded once."""
    planned = [(cell_dir(out, c), configs[c["speculation"]], Lossy(c["verification_rule"], c["speculation"]))
               for c in cells]
    record_cells(models, prompts_path, planned, limit=limit, shard_size=shard_size, workers=workers,
                 progress=progress)


@dataclass(frozen=True)
class SweepSettings:
    """What a sweep runs: the verification rules of ``grid`` (``NAME[:KEY=V1/V2,...]`` entries) under each of
    ``speculations``, every cell decoding ``prompts_path`` (its first ``limit`` prompts) as ``decoding`` says, in
    shards of ``shard_size`` prompts."""

    prompts_path: str
    grid: tuple[str, ...] = DEFAULT_GRID
    speculations: tuple[str, ...] = ("tree", "chain")
    decoding: SweepDecoding = SweepDecoding(PoolShape(10, 8, 10), 59)
    limit: int | None = None
    shard_size: int = 4

    def configs(self) -> dict[str, DecodeConfig]:
        """Each speculation's decode configuration (a bad one refused before any model loads)."""
        return {s: self.decoding.config(s) for s in self.speculations}


@dataclass(frozen=True)
class SweepResult:
    """A sweep's table (one row per cell), its report and trade-off figure, and the rules skipped (no tree form)."""

    table: pd.DataFrame = field(repr=False)
    report: str = field(repr=False)
    figure: object = field(repr=False)
    skipped: tuple[str, ...]
    cells: int

    def write(self, folder) -> None:
        """``verify_sweep.parquet``, ``verify_sweep.csv``, ``report.md``, ``figures/tradeoff.png`` (each atomic)."""
        folder = Path(folder)
        (folder / "figures").mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(self.table, folder / "verify_sweep.parquet")
        atomic_write(folder / "verify_sweep.csv", lambda tmp: self.table.to_csv(tmp, index=False))
        atomic_write(folder / "report.md", lambda tmp: Path(tmp).write_text(self.report))
        atomic_write(folder / "figures" / "tradeoff.png", lambda tmp: self.figure.savefig(tmp, dpi=120, format="png"))


def verify_sweep(models: ModelSpec, settings: SweepSettings, *, out, meta: dict, workers=None,
                 progress: bool = True) -> SweepResult:
    """Record every cell of ``settings`` into ``out/runs`` (resumed when there; on ``workers`` or here) and gather
    the sweep's table, report and figure (``meta``: the run's settings as the report shows them)."""
    cells, skipped = grid_cells(settings.grid, settings.speculations)
    configs = settings.configs()
    out = Path(out)
    with removing_new_dirs(out):
        decode_cells(cells, configs, models, settings.prompts_path, out, settings.limit, settings.shard_size,
                     workers, progress=progress)
    table = sweep_table(cells, [read_diagnostics(cell_dir(out, c)) for c in cells])
    return SweepResult(table, sweep_report(table, meta), tradeoff_figure(table, meta), tuple(skipped), len(cells))
