"""The training loop: AdamW over the head's trainable parameters, a k-step training-time test,
held-out agreement per unrolled step, checkpoints with optimizer and RNG state, and resume.

Everything a step depends on is a function of (seed, step) and the checkpointed state, so a
run resumed from a checkpoint ends with the same weights as one that was never interrupted.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specrank.atomic import atomic_write
from specrank.decode.loading.weight_files import read_bin
from specrank.drafter_training.batches import batch_at, collate, windows
from specrank.drafter_training.objective import agreement, step_loss
from specrank.drafter_training.unroll import unrolled_logits

CHECKPOINT = "checkpoint.pt"


class TrainError(ValueError):
    """Training cannot start or resume as asked."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (all part of a checkpoint's identity except ``max_minutes``)."""

    steps: int = 2000
    unroll: int = 2  # training-time test: unrolled drafting steps
    step_decay: float = 0.8  # loss weight of unrolled step j is step_decay**j (EAGLE-3)
    batch_size: int = 4
    max_len: int = 512
    lr: float = 5e-4
    warmup: int = 50
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio at ``steps``
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    response_only: bool = False  # loss only on rows that predict generated tokens
    eval_every: int = 100
    checkpoint_every: int = 100
    seed: int = 0
    max_minutes: float | None = None  # stop early (after a checkpoint) once exceeded

    def __post_init__(self):
        if self.steps < 1 or self.unroll < 1 or self.batch_size < 1 or self.max_len < 2:
            raise TrainError("steps, unroll, batch_size >= 1 and max_len >= 2 are required")
        if self.eval_every < 1 or self.checkpoint_every < 1 or not self.lr > 0:
            raise TrainError("eval_every, checkpoint_every >= 1 and lr > 0 are required")

    def identity(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "max_minutes"}


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to ``min_lr_ratio``."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    done = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))


def batch_loss(head, teacher, batch, ids, cfg: TrainConfig):
    """Weighted loss over the unrolled steps, with per-step losses and (hits, count).

    ``teacher(last)`` gives the target's logits on the draft vocabulary from its final states."""
    outs = unrolled_logits(head, batch, cfg.unroll)
    total, losses, hits = 0.0, [], []
    for j, draft in enumerate(outs):
        width = draft.shape[1]
        with torch.no_grad():
            tgt = teacher(batch.last[:, j : j + width])
        valid = batch.valid(j, cfg.response_only)
        loss = step_loss(draft, tgt, valid)
        total = total + cfg.step_decay**j * loss
        losses.append(float(loss.detach()))
        hits.append(agreement(draft.detach(), batch.argmax[:, j : j + width], ids, valid))
    return total, losses, hits


@torch.no_grad()
def evaluate(head, corpus, wins, ids, cfg: TrainConfig, batch_size: int = 8) -> list[float]:
    """Held-out top-1 agreement with the target's argmax at each unrolled step, over the rows that
    predict generated tokens (what drafting meets after a prompt)."""
    hits = torch.zeros(cfg.unroll, 2, dtype=torch.long)  # (steps, [hits, count])
    for k in range(0, len(wins), batch_size):
        batch = collate(corpus, wins[k : k + batch_size], cfg.unroll).to(ids.device)
        for j, draft in enumerate(unrolled_logits(head, batch, cfg.unroll)):
            valid = batch.valid(j, response_only=True)
            hits[j] += torch.tensor(agreement(draft, batch.argmax[:, j : j + draft.shape[1]], ids, valid))
    return (hits[:, 0] / hits[:, 1].clamp_min(1)).tolist()


def train(head, teacher, ids, corpus, train_slices, heldout_slices, out_dir, cfg: TrainConfig, logger=None, progress=False):
    """Train ``head`` in place on ``train_slices``; checkpoints in ``out_dir``; return the final metrics.

    ``ids`` (Vd,) are the target ids of the draft vocabulary (on the head's device), ``teacher`` as
    in ``batch_loss``.
    Resumes from ``out_dir/checkpoint.pt`` when it exists and was made with the same settings.
    ``logger(metrics: dict, step)`` receives training and held-out metrics.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_wins, held_wins = windows(train_slices, cfg.max_len), windows(heldout_slices, cfg.max_len)
    if len(train_wins) < cfg.batch_size:
        raise TrainError(f"{len(train_wins)} training windows, fewer than batch_size {cfg.batch_size}")
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    torch.manual_seed(cfg.seed)
    identity = run_identity(cfg, ids, train_wins)
    state = load_checkpoint(out_dir / CHECKPOINT, head, opt, identity)
    step, elapsed, history = state["step"], state["elapsed"], state["history"]
    start, metrics = time.monotonic() - elapsed, {}
    bar = _bar(cfg.steps, step, progress)
    head.train()
    while step < cfg.steps:
        batch = batch_at(corpus, train_wins, step, cfg.batch_size, cfg.seed, cfg.unroll).to(ids.device)
        metrics = optimizer_step(head, teacher, opt, batch, ids, cfg, step)
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", top1=f"{metrics['train_top1_step0']:.2f}")
        over_time = cfg.max_minutes is not None and time.monotonic() - start > 60 * cfg.max_minutes
        if held_wins and (step % cfg.eval_every == 0 or step == cfg.steps or over_time):
            eval_start = time.monotonic()
            metrics.update(heldout_metrics(head, corpus, held_wins, ids, cfg))
            start += time.monotonic() - eval_start  # minutes count training only
        metrics["minutes"] = (time.monotonic() - start) / 60
        history.append({"step": step, **metrics})
        if logger is not None:
            logger(metrics, step)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps or over_time:
            save_checkpoint(out_dir / CHECKPOINT, head, opt, identity, step, time.monotonic() - start, history)
        if over_time:
            break
    bar.close()
    if not metrics and held_wins:  # nothing left to train: report the saved head
        metrics = heldout_metrics(head, corpus, held_wins, ids, cfg)
    head.eval()
    return {"step": step, "history": history, **metrics}


def heldout_metrics(head, corpus, wins, ids, cfg: TrainConfig) -> dict:
    """``heldout_top1_step{j}`` in eval mode (the head is left in training mode)."""
    head.eval()
    top1 = evaluate(head, corpus, wins, ids, cfg)
    head.train()
    return {f"heldout_top1_step{j}": v for j, v in enumerate(top1)}


def optimizer_step(head, teacher, opt, batch, ids, cfg: TrainConfig, step: int) -> dict:
    """One clipped AdamW step at the scheduled learning rate; its training metrics."""
    for group in opt.param_groups:
        group["lr"] = cfg.lr * lr_factor(step, cfg)
    loss, losses, hits = batch_loss(head, teacher, batch, ids, cfg)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], cfg.grad_clip)
    opt.step()
    metrics = {"loss": float(loss.detach()), "lr": opt.param_groups[0]["lr"]}
    metrics.update({f"loss_step{j}": v for j, v in enumerate(losses)})
    metrics.update({f"train_top1_step{j}": h / max(c, 1) for j, (h, c) in enumerate(hits)})
    return metrics


def run_identity(cfg: TrainConfig, ids, wins) -> dict:
    """What a checkpoint must share with the run resuming it: settings, draft vocabulary, data windows."""
    digest = hashlib.sha256(ids.cpu().numpy().tobytes() + repr([(w.start, w.stop) for w in wins]).encode())
    return {**cfg.identity(), "vocab_and_data": digest.hexdigest()[:16]}


def save_checkpoint(path: Path, head, opt, identity: dict, step: int, elapsed: float, history: list) -> None:
    """Trainable weights, optimizer and RNG state, atomically."""
    trainable = {n for n, p in head.named_parameters() if p.requires_grad}
    state = {
        "config": identity,
        "step": step,
        "elapsed": elapsed,
        "history": history,
        "head": {k: v for k, v in head.state_dict().items() if k in trainable},
        "optimizer": opt.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, head, opt, identity: dict) -> dict:
    """Restore a checkpoint into ``head`` and ``opt``; a fresh start when there is none."""
    if not path.exists():
        return {"step": 0, "elapsed": 0.0, "history": []}

    state = read_bin(path, tensors_only=False)
    if not isinstance(state, dict) or not {"config", "head", "optimizer", "torch_rng"} <= set(state):
        raise TrainError(f"{path}: not a checkpoint of specrank drafter train (remove it or use a new --out)")
    if state["config"] != identity:
        diff = sorted(k for k in identity if state["config"].get(k) != identity[k])
        raise TrainError(f"{path} was made with other settings ({', '.join(diff)}); use a new --out or the same settings")
    unexpected = head.load_state_dict(state["head"], strict=False).unexpected_keys  # frozen weights are not stored
    if unexpected:
        raise TrainError(f"{path} holds weights this head does not have ({unexpected[0]}, ...)")
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    return state


def _bar(total: int, initial: int, enabled: bool):
    return tqdm(total=total, initial=initial, disable=not enabled, desc="training", unit="step")
