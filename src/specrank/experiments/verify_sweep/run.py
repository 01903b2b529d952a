"""A grid of verification rules run with tree and chain speculation on one prompt set (``specrank
verify-sweep``): one resumable lossy run per (speculation, rule) cell under ``OUT/runs``, here or on Ray workers,
then the sweep's table, report and trade-off figure (``evaluation.sweep``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specrank.atomic import atomic_write
from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape
from specrank.decode.runs.chain import chain_config
from specrank.decode.runs.lossy import lossy_decode_run, read_diagnostics
from specrank.decode.runs.manifest import build_manifest
from specrank.decode.loading.model_spec import ModelSpec
from specrank.decode.runs.workers import RunSpec, decode_on_workers
from specrank.decode.verify.lossy.parse import parse_verification_rule
from specrank.decode.verify.lossy.rules import RuleError
from specrank.decode.verify.lossy.tree import tree_form
from specrank.experiments.verify_sweep.tables import expand_grid, sweep_report, sweep_table, tradeoff_figure


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


def decode_cells(cells, configs: dict, models: ModelSpec, prompts, prompts_path, out: Path, shard_size: int,
                 workers=None, progress: bool = True) -> None:
    """Decode every cell into ``cell_dir(out, cell)`` with its speculation's config (``configs``), resuming
    finished shards: on ``workers`` (one queue of every cell's shards) or here, the models loaded once."""
    if workers is not None:
        runs = [RunSpec(str(cell_dir(out, c)), configs[c["speculation"]], c["speculation"], c["verification_rule"])
                for c in cells]
        decode_on_workers(workers, models, prompts, prompts_path, runs, shard_size, progress=progress)
        return
    target, drafter = models.load()
    for cell in cells:
        config = configs[cell["speculation"]]
        manifest = build_manifest(target, drafter, config, prompts_path, shard_size)
        lossy_decode_run(target, drafter, prompts, cell_dir(out, cell), config, manifest, cell["rule"],
                         cell["speculation"], shard_size, progress=progress)


def sweep_outputs(cells, out: Path, meta: dict) -> tuple:
    """(table, report, figure) of the decoded cells (``meta``: the run's settings, shown in both)."""
    table = sweep_table(cells, [read_diagnostics(cell_dir(out, c)) for c in cells])
    return table, sweep_report(table, meta), tradeoff_figure(table, meta)


def save_outputs(out: Path, table, report: str, figure) -> None:
    """``verify_sweep.parquet``, ``verify_sweep.csv``, ``report.md``, ``figures/tradeoff.png`` (each atomic)."""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    atomic_write(out / "verify_sweep.parquet", lambda tmp: table.to_parquet(tmp, index=False))
    atomic_write(out / "verify_sweep.csv", lambda tmp: table.to_csv(tmp, index=False))
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(report))
    atomic_write(out / "figures" / "tradeoff.png", lambda tmp: figure.savefig(tmp, dpi=120, format="png"))
