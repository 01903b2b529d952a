"""Recording to a round target: decoding calls sized by the rounds per prompt so far, the same prompts on every
rerun."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow.parquet as pq

from specrank.decode.config import DecodeConfig
from specrank.decode.loading.model_spec import ModelSpec
from specrank.decode.runs.shards import SHARD, done_prompts
from specrank.experiments.study.study_settings import FIRST_CHUNK, SHARD_SIZE, StudySettings
from specrank.layout import RunLayout
from specrank.workflow.recording import record
from specrank.workflow.stages import timed
from specrank.workflow.tracking import Tracking

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recorder:
    """How the study records: the models, the workers that decode them, and the recording's own switches."""

    models: ModelSpec
    workers: object = None
    allow_training_prompts: bool = False
    progress: bool = True

    def until(self, prompts_path: Path, n_prompts: int, run_dir: Path, temp: float, goal: int | None,
              settings: StudySettings, tracking: Tracking | None = None) -> int:
        """Record ``prompts_path`` in order until ``goal`` rounds are recorded (or the prompts run out; None: every
        prompt, in one call); return how many prompts were decoded. Each call's size comes from the rounds recorded
        so far (``next_limit``), so the same study always decodes the same prompts; prompts already recorded are
        not decoded again. With ``tracking`` (the decode stage's), the n-th decoding call is its run, with ``-n``
        added to the name after the first."""
        config = DecodeConfig(temperature=temp, max_new_tokens=settings.max_new_tokens, seed=settings.seed)
        limit, calls = 0, 0
        while limit < n_prompts:
            limit = (n_prompts if goal is None else
                     next_limit(limit, rounds_below(run_dir, limit), goal, n_prompts, settings.chunk))
            if not set(range(limit)) <= (done_prompts(run_dir) if run_dir.exists() else set()):
                calls += 1
                tracked = tracking if tracking is None or calls == 1 else replace(
                    tracking, run_name=f"{tracking.run_name}-{calls}")
                with timed(f"record: the first {limit} prompts at T = {temp:g} -> {run_dir}"):
                    recording = record(self.models, prompts_path, out=run_dir, config=config, limit=limit,
                                       shard_size=SHARD_SIZE, workers=self.workers,
                                       allow_training_prompts=self.allow_training_prompts, progress=self.progress,
                                       tracking=tracked)
                    log.info(recording.summary)
            if goal is not None and rounds_below(run_dir, limit) >= goal:
                break
        return limit


def next_limit(limit: int, rounds: int, goal: int, n_prompts: int, chunk: int) -> int:
    """The next number of prompts to have decoded: ``FIRST_CHUNK`` (at most ``chunk``) to start, then as many
    more as the rounds per prompt so far say the goal needs, in whole shards, at most ``chunk`` more a call (a
    call starts the workers and loads the models, so few large calls cost less)."""
    if limit == 0:
        return min(n_prompts, FIRST_CHUNK, chunk)
    need = math.ceil((goal - rounds) * limit / max(rounds, 1))
    need = SHARD_SIZE * math.ceil(max(need, 1) / SHARD_SIZE)
    return min(n_prompts, limit + min(need, chunk))


def rounds_below(run_dir: Path, below: int) -> int:
    """Rounds of prompts ``0..below-1`` in the run directory's finished shards (from the Parquet footers); a shard
    of later prompts, left by an interrupted call, does not count."""
    total = 0
    for f in sorted(RunLayout(Path(run_dir)).rounds.glob("shard-*.parquet")):
        m = SHARD.fullmatch(f.name)
        if m and int(m.group(2)) < below:
            total += pq.ParquetFile(f).metadata.num_rows
    return total
