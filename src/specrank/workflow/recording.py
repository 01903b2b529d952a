"""Recording: decode prompts with a target and a drafter, keeping every verification round with the target's
exact probabilities (``decode.runs``) in a resumable run directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers.utils import logging as hf_logging

from specrank.decode.config import DecodeConfig
from specrank.decode.loading.drafters import check_unseen
from specrank.decode.loading.model_spec import ModelSpec, Models, loaded
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.decode.runs import build_manifest, lossy_decode_run, record_run
from specrank.decode.runs.chain import chain_length
from specrank.decode.runs.lossy import SPECULATIONS, LossyRunError
from specrank.decode.runs.manifest import with_trained_prompts
from specrank.decode.runs.workers import RunSpec, decode_on_workers, summary
from specrank.decode.verify.lossy.adapters import TreeRuleVerifier
from specrank.decode.verify.lossy.parse import parse_verification_rule
from specrank.evaluation.data import Rounds, load_rounds
from specrank.featurize.storage import read_manifest
from specrank.files import read_json
from specrank.outputs import check_output_dir, removing_new_dirs
from specrank.scale import Outcome
from specrank.workflow.tracking import Tracking


@dataclass
class Recording:
    """A run directory (``manifest.json`` + ``rounds/``). ``decoded`` is what the call that returned it decoded
    (the decoding timer, or the Ray workers' outcome; None when opened or when nothing was left to decode) and
    ``summary`` that call's one-line account."""

    path: Path
    decoded: object | None = None
    summary: str = ""

    @classmethod
    def open(cls, path) -> Recording:
        """The recording in run directory ``path``."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no run directory {path}")
        read_manifest(path)  # refuses a directory that is not a run
        return cls(path)

    @property
    def manifest(self) -> dict:
        return read_manifest(self.path)


@dataclass(frozen=True)
class Lossy:
    """A lossy run: ``rule`` (``NAME[:KEY=VALUE,...]``) verifies a ``tree`` or a ``chain`` (whose decode
    configuration is ``chain_config``'s); its ``diagnostics/`` are written beside ``rounds/``."""

    rule: str = "lossless"
    speculation: str = "tree"

    def __post_init__(self):
        if self.speculation not in SPECULATIONS:
            raise LossyRunError(f"unknown speculation {self.speculation!r} (one of {', '.join(SPECULATIONS)})")


def record(models: ModelSpec | Models, prompts=None, *, out, config: DecodeConfig = DecodeConfig(),
           limit: int | None = None, shard_size: int = 4, workers=None, lossy: Lossy | None = None,
           strategy=None, allow_training_prompts: bool = False, progress: bool = True,
           tracking: Tracking | None = None) -> Recording:
    """Decode ``prompts`` (a JSONL file; default: the bundled set) with ``models`` (a ``ModelSpec``, or ``Models``
    already loaded) under ``config`` into run directory ``out``; rerun, it decodes only the prompts not yet
    recorded.

    ``workers`` (``scale.Workers``) decodes on Ray workers, which load the models from their spec (with the
    workers' threads, not the spec's); ``lossy`` records a lossy run; ``strategy`` (a selection strategy, here
    only) chooses the tree each round verifies instead of draft selection. Every input is checked before a model
    loads.
    """
    check_output_dir(out)
    hf_logging.disable_progress_bar()  # weight-loading bars would bury errors and the decode bar
    prompts_path = prompts or default_prompts_path()
    prompt_list = read_prompts(prompts_path, limit=limit)
    if lossy is not None:
        rule = parse_verification_rule(lossy.rule)  # a malformed rule is refused before any model loads
        if lossy.speculation == "chain":
            chain_length(config)
        else:
            TreeRuleVerifier(rule, config.temperature)  # refuses rules without a tree form before any model loads
    spec = models if isinstance(models, ModelSpec) else None
    if workers is not None and spec is None:
        raise ValueError("workers load the models themselves: give a ModelSpec, not loaded models")
    if workers is not None and strategy is not None:
        raise ValueError("a strategy verifies rounds here only: record it without workers")
    if spec is not None:
        spec.check(here=workers is None)  # every argument checked before a model loads
    drafter_spec = spec.drafter if spec is not None else getattr(models.drafter, "spec", None)
    seen = check_unseen(drafter_spec, prompt_list, allow_training_prompts) if drafter_spec else 0
    tracking = tracking.checked() if tracking is not None else None  # before any model loads
    if workers is not None:  # the workers load the models; the driver loads none
        run = (RunSpec(out, config, lossy.speculation, lossy.rule, seen) if lossy is not None
               else RunSpec(out, config, trained_prompts=seen))
        outcome = decode_on_workers(workers, spec, prompt_list, prompts_path, [run], shard_size,
                                    progress=progress)
        recording = Recording(Path(out), outcome, summary(outcome, out))
        if tracking is not None:
            _log(tracking, recording, read_json(Path(out, "manifest.json"), "run manifest"), prompts_path)
        return recording
    timer, manifest = _decode_here(loaded(models), prompt_list, prompts_path, out, config,
                                   (rule, lossy.speculation) if lossy is not None else None, shard_size, seen, progress,
                                   strategy)
    if timer.rounds:
        line = (f"{timer.rounds} rounds, {timer.tokens / timer.rounds - 1:.2f} accepted/round, "
                f"{timer.tokens / timer.total:.1f} tokens/s -> {out}")
    else:
        line = f"nothing to do: every prompt is already recorded in {out}"
    recording = Recording(Path(out), timer, line)
    if tracking is not None:
        _log(tracking, recording, manifest, prompts_path)
    return recording


def _decode_here(models: Models, prompt_list, prompts_path, out, config: DecodeConfig, lossy, shard_size: int,
                 seen: int, progress: bool, strategy=None):
    """Decode in this process (``lossy``: the parsed rule and the speculation, or None): (the timer, the run's
    manifest)."""
    target, drafter = models
    manifest = with_trained_prompts(build_manifest(target, drafter, config, prompts_path, shard_size), seen)
    with removing_new_dirs(out):
        if lossy is not None:
            timer = lossy_decode_run(target, drafter, prompt_list, out, config, manifest, *lossy, shard_size,
                                     progress=progress)
        else:
            timer = record_run(target, drafter, prompt_list, out, config, manifest, shard_size, progress=progress,
                               desc=f"recording {Path(out).name}", strategy=strategy)
    return timer, manifest


def record_cells(models: ModelSpec, prompts, cells: list[tuple[Path, DecodeConfig, Lossy]], *,
                 limit: int | None = None, shard_size: int = 4, workers=None, progress: bool = True) -> list[Recording]:
    """``record`` for several lossy runs of one prompt set (``cells``: (out, config, lossy) each): on ``workers``
    every cell's shards in one queue (the workers load the models once), else one cell after another with the
    models loaded once."""
    if workers is None:
        here = models.check().load()
        return [record(here, prompts, out=out, config=config, limit=limit, shard_size=shard_size, lossy=lossy,
                       progress=progress) for out, config, lossy in cells]
    for out, _, _ in cells:
        check_output_dir(out)
    prompts_path = prompts or default_prompts_path()
    prompt_list = read_prompts(prompts_path, limit=limit)
    models.check(here=False)
    seen = check_unseen(models.drafter, prompt_list, False)
    runs = [RunSpec(out, config, lossy.speculation, lossy.rule, seen) for out, config, lossy in cells]
    outcome = decode_on_workers(workers, models, prompt_list, prompts_path, runs, shard_size, progress=progress)
    return [Recording(Path(out), outcome, summary(outcome, out)) for out, _, _ in cells]


def recorded_rounds(recording: Recording | str | Path) -> Rounds:
    """The recording's rounds, its pool knowing each round's prompt (a prompt bootstrap resamples them)."""
    rounds = load_rounds(recording.path if isinstance(recording, Recording) else recording)
    rounds.pool.prompt_id = rounds.prompt_id
    return rounds


def decode_metrics(recording: Recording) -> dict[str, float]:
    """The MLflow metrics of the call that returned ``recording``: its rounds, speed and time split, and the
    run directory's totals."""
    from specrank.tracking.decode import decode_metrics as timer_metrics  # MLflow is optional: loaded when logging
    from specrank.tracking.decode import workers_decode_metrics  # MLflow, as above

    if isinstance(recording.decoded, Outcome):
        return workers_decode_metrics(recording.decoded, recording.path)
    return timer_metrics(recording.decoded, recording.path)


def _log(tracking: Tracking, recording: Recording, manifest: dict, prompts_path) -> None:
    from specrank.tracking.decode import log_decode  # MLflow loads only for a tracked stage

    log_decode(tracking.uri, tracking.experiment, tracking.run_name, recording.path, manifest,
               decode_metrics(recording), prompts_path)
