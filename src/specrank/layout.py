"""Where every file of a run and of a study lives: one object names them, the stages ask it.

A **run** is one recorded directory (``specrank decode --out``, or one temperature of a study)::

    RUN/manifest.json             what was decoded, and how (models, pool, law, seed, prompts)
    RUN/rounds/shard-*.parquet    the recorded rounds, one file per shard of prompts
    RUN/features.parquet          one row per first-level candidate (``featurize``)
    RUN/edges.parquet             one row per pool edge (``featurize --edges-out``, where asked)
    RUN/rerankers/                cross-fitted rerankers (``train``): predictions.parquet, edge_predictions.parquet,
                                  models/NAME-foldF
    RUN/evaluation/               every score's tables, report and figures (``evaluate``)

and, inside a study, its temperature's own: ``stages.json`` (the digest each stage last ran on), ``figures.json``
(its offline figures, what a carried study keeps), ``champion/`` (the champion refitted on every round) and
``online/B<budget>/`` (the online phase's tables).

A **study** directory holds ``prompts.jsonl`` (its ordered prompts), one run per temperature (``t1``, ``greedy``,
named by the law's folder), ``results.json``, ``results.md``, ``learning-curve.png`` and, when it tracks to its own
store, ``mlflow.db``. Nothing is written outside it: installing a champion into the cache is a separate, announced
step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specrank.law import Law


@dataclass(frozen=True)
class RunLayout:
    """The files of one run directory ``root``."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def rounds(self) -> Path:
        return self.root / "rounds"

    @property
    def features(self) -> Path:
        return self.root / "features.parquet"

    @property
    def edges(self) -> Path:
        return self.root / "edges.parquet"

    @property
    def rerankers(self) -> Path:
        return self.root / "rerankers"

    @property
    def predictions(self) -> Path:
        return rerankers_predictions(self.rerankers)

    @property
    def evaluation(self) -> Path:
        return self.root / "evaluation"

    @property
    def stages(self) -> Path:
        return self.root / "stages.json"

    @property
    def figures(self) -> Path:
        return self.root / "figures.json"

    @property
    def champion(self) -> Path:
        return self.root / "champion"

    def online(self, budget: int) -> Path:
        return self.root / "online" / f"B{budget}"


def rerankers_predictions(folder: Path) -> Path:
    """The held-out predictions of a rerankers folder (``train --out-dir``)."""
    return Path(folder) / "predictions.parquet"


@dataclass(frozen=True)
class StudyLayout:
    """The files of one study directory ``root``."""

    root: Path

    @property
    def prompts(self) -> Path:
        return self.root / "prompts.jsonl"

    @property
    def results(self) -> Path:
        return self.root / "results.json"

    @property
    def page(self) -> Path:
        return self.root / "results.md"

    @property
    def curve(self) -> Path:
        return self.root / "learning-curve.png"

    @property
    def store(self) -> Path:
        return self.root / "mlflow.db"

    def run(self, temperature: float) -> RunLayout:
        """The run of one temperature: ``t1``, ``t0.7``, ``greedy``."""
        return RunLayout(self.root / Law(temperature).folder)
