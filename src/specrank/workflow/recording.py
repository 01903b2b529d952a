"""Recording: decode prompts with a target and a drafter, keeping every verification round with the target's
exact probabilities (``decode.runs``) in a resumable run directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from specrank.decode.config import DecodeConfig
from specrank.decode.core import PoolShape, parse_device
from specrank.decode.loading import load_drafter, load_target
from specrank.decode.loading.drafters import check_unseen, parse_drafter_spec
from specrank.decode.loading.targets import check_target_spec
from specrank.decode.prompts import default_prompts_path, read_prompts
from specrank.decode.runs import build_manifest, lossy_decode_run, record_run
from specrank.decode.runs.chain import chain_config
from specrank.decode.runs.manifest import with_trained_prompts
from specrank.decode.runs.workers import Models, RunSpec, decode_on_workers, summary
from specrank.decode.verify.lossy.adapters import TreeRuleVerifier
from specrank.decode.verify.lossy.parse import parse_verification_rule
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


def record(target, drafter, prompts=None, *, out, temperature: float = 0.0, max_new_tokens: int = 256,
           seed: int = 0, pool: PoolShape = PoolShape(), budget: int = 59, extra: int = 160, limit: int | None = None,
           shard_size: int = 4, device: str = "cpu", dtype: str = "float32", graphs: bool | None = None,
           eagle3_layers=None,
           specforge_norm_output: str | None = None, threads: int | None = None, workers=None,
           verification_rule: str | None = None, speculation: str = "tree", chain_length: int = 4,
           allow_training_prompts: bool = False, progress: bool = True,
           tracking: Tracking | None = None) -> Recording:
    """Decode ``prompts`` (a JSONL file; default: the bundled set) with ``target`` and ``drafter`` (loaded, or
    specs as the command line spells them) into run directory ``out``; rerun, it decodes only the prompts not yet
    recorded.

    ``graphs``: capture the passes as CUDA graphs (default: on a CUDA device; ``load_target``).
    ``workers`` (``scale.Workers``) decodes on Ray workers, which load the models from their specs;
    ``verification_rule`` or ``speculation="chain"`` records a lossy run. Every input is checked before a model
    loads.
    """
    check_output_dir(out)
    if threads and workers is None:
        torch.set_num_threads(threads)
    hf_logging.disable_progress_bar()  # weight-loading bars would bury errors and the decode bar
    prompts_path = prompts or default_prompts_path()
    prompt_list = read_prompts(prompts_path, limit=limit)
    config = DecodeConfig(pool, budget, extra, temperature, max_new_tokens, seed)
    lossy = verification_rule is not None or speculation == "chain"
    if lossy:
        rule = parse_verification_rule(verification_rule or "lossless")
        if speculation == "chain":
            config = chain_config(chain_length, temperature, max_new_tokens, seed)
        else:
            TreeRuleVerifier(rule, temperature)  # refuses rules without a tree form before any model loads
    parse_device(device)
    specs = isinstance(target, str) and isinstance(drafter, str)
    if workers is not None and not specs:
        raise ValueError("workers load the models themselves: give the target and the drafter as specs")
    if isinstance(drafter, str):
        parse_drafter_spec(drafter, eagle3_layers, specforge_norm_output)  # every argument checked before a model loads
    spec = drafter if isinstance(drafter, str) else getattr(drafter, "spec", None)
    seen = check_unseen(spec, prompt_list, allow_training_prompts) if spec else 0
    tracking = tracking.checked() if tracking is not None else None  # before any model loads
    if workers is not None:  # the workers load the models; the driver loads none
        run = RunSpec(out, config, speculation if lossy else "record", verification_rule, seen)
        models = Models(target, drafter, device, dtype, eagle3_layers, specforge_norm_output, graphs)
        outcome = decode_on_workers(workers, models, prompt_list, prompts_path, [run], shard_size, progress=progress)
        recording = Recording(Path(out), outcome, summary(outcome, out))
        if tracking is not None:
            _log(tracking, recording, read_json(Path(out, "manifest.json"), "run manifest"), prompts_path)
        return recording
    if isinstance(target, str):
        check_target_spec(target)
    loaded = load_target(target, device, dtype, graphs) if isinstance(target, str) else target
    draft = load_drafter(drafter, loaded, eagle3_layers, specforge_norm_output) if isinstance(drafter, str) else drafter
    manifest = with_trained_prompts(build_manifest(loaded, draft, config, prompts_path, shard_size), seen)
    with removing_new_dirs(out):
        if lossy:
            timer = lossy_decode_run(loaded, draft, prompt_list, out, config, manifest, rule, speculation,
                                     shard_size, progress=progress)
        else:
            timer = record_run(loaded, draft, prompt_list, out, config, manifest, shard_size, progress=progress)
    if timer.rounds:
        line = (f"{timer.rounds} rounds, {timer.tokens / timer.rounds - 1:.2f} accepted/round, "
                f"{timer.tokens / timer.total:.1f} tokens/s -> {out}")
    else:
        line = f"nothing to do: every prompt is already recorded in {out}"
    recording = Recording(Path(out), timer, line)
    if tracking is not None:
        _log(tracking, recording, manifest, prompts_path)
    return recording


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
