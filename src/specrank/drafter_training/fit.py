"""End to end: held-out split, self-distillation data, draft vocabulary, head training, saving,
a short decode with the trained head, and MLflow tracking."""

from __future__ import annotations

import functools
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from specrank.atomic import write_json_atomic
from specrank.decode import Decoder
from specrank.decode.loading.eagle3 import default_hidden_layers, load_eagle3
from specrank.decode.loading.eagle3_named_heads import default_head_dir  # noqa: F401  (re-exported)
from specrank.decode.loading.target_spec import target_config
from specrank.decode.prompts import prompt_digests
from specrank.drafter_training.data import GenerationSpec, generate_corpus, load_corpus
from specrank.drafter_training.head import new_head, save_head
from specrank.drafter_training.objective import target_logits
from specrank.drafter_training.tracking import RunLogger
from specrank.drafter_training.train import TrainConfig, train
from specrank.drafter_training.vocab import most_frequent
from specrank.tracking.uri import check_tracking_uri, resolve_tracking_uri

SUMMARY = "training.json"


def hidden_layers(target_spec, layers=None) -> tuple[int, ...]:
    """The target's ``hidden_states`` indices a head reads: ``layers``, else EAGLE-3's default, checked against
    the target's config (one line naming ``--layers``)."""
    config = target_config(target_spec)
    layers = tuple(layers or default_hidden_layers(config, config["num_hidden_layers"]))
    if any(not 0 <= i <= config["num_hidden_layers"] for i in layers):
        raise ValueError(f"--layers {' '.join(map(str, layers))}: hidden_states indices of this target are "
                         f"0..{config['num_hidden_layers']} (its config.json)")
    return layers


def split_prompts(prompts, heldout_per_task: int, seed: int = 0) -> set[str]:
    """Prompt ids held out: ``heldout_per_task`` drawn per task (tasks with more prompts than that)."""
    rng = np.random.default_rng(seed)
    held = set()
    for task in sorted({p.task for p in prompts}):
        ids = [p.prompt_id for p in prompts if p.task == task]
        if len(ids) > heldout_per_task:
            held.update(ids[i] for i in rng.choice(len(ids), heldout_per_task, replace=False))
    return held


def tokens_per_pass(target, drafter, prompts, max_new_tokens: int, budget: int = 59) -> float:
    """Mean tokens emitted per target pass (accepted + 1 per round) in a greedy decode of ``prompts``."""
    decoder = Decoder(target, drafter, "draft", budget=budget)
    accepted = []
    for p in prompts:
        accepted += decoder.generate(p.text, max_new_tokens=max_new_tokens, prompt_id=p.prompt_id).stats.accepted
    return float(np.mean(accepted)) + 1.0 if accepted else float("nan")


def training_only(extra, prompts, held: set[str]) -> list:
    """The training-only prompts ``extra`` minus any whose text is a held-out prompt's; an id shared
    with ``prompts`` is an error (the held-out split goes by id)."""
    clash = {p.prompt_id for p in prompts} & {p.prompt_id for p in extra}
    if clash:
        raise ValueError(f"training prompts reuse ids of the prompt set: {sorted(clash)[:3]}")
    held_text = {p.text for p in prompts if p.prompt_id in held}
    return [p for p in extra if p.text not in held_text]


def split_positions(corpus, held):
    """(training sequences, held-out sequences, training positions, held-out positions that predict a generated
    token) of ``corpus``, split by the held-out prompt ids ``held``."""
    train_slices = corpus.sequences(lambda pid: pid not in held)
    held_slices = corpus.sequences(lambda pid: pid in held)
    train_pos = torch.cat([torch.arange(s.start, s.stop) for s in train_slices])
    held_pos = torch.cat([torch.arange(s.start, s.stop) for s in held_slices]) if held_slices else train_pos[:0]
    return train_slices, held_slices, train_pos, held_pos[corpus.response[held_pos]]


def run_params(target, dirs, extra, extra_spec: GenerationSpec, train_tokens: int, held, vocab, spec: GenerationSpec,
               cfg: TrainConfig) -> dict:
    """The training run's MLflow parameters (also kept in its summary): data, split, vocabulary, recipe."""
    return {
        "target": target.name,
        "data_dir": ",".join(str(d) for d in dirs),
        "training_only_prompts": len(extra),
        **({f"extra_gen_{k}": v for k, v in asdict(extra_spec).items()} if extra else {}),
        "train_tokens": train_tokens,
        "heldout_prompts": ",".join(sorted(held)),
        "draft_vocab_size": len(vocab.ids),
        **{f"gen_{k}": v for k, v in asdict(spec).items()},
        **cfg.identity(),
    }


def fit_drafter(target, prompts, out_dir, spec: GenerationSpec, cfg: TrainConfig, draft_vocab: int = 16384,
                heldout_per_task: int = 1, decode_prompts: int = 2, decode_tokens: int = 64,
                tracking_uri: str | None = None, data_root=None, progress: bool = False,
                extra_prompts=(), extra_spec: GenerationSpec | None = None, workers=None) -> dict:
    """Generate (or reuse) the data, train a head into ``out_dir`` (resuming), save it, log to MLflow
    (``tracking_uri``: None logs nowhere, "" the default ``sqlite:///mlflow.db``).

    ``prompts`` are split into training and held-out prompts per task; ``extra_prompts`` only add
    training data, continued under ``extra_spec`` (default ``spec``). ``workers`` (``specrank.scale.Workers``)
    generate the data on Ray workers."""
    if draft_vocab < 1 or heldout_per_task < 0 or decode_prompts < 0:
        raise ValueError("draft_vocab >= 1, heldout_per_task >= 0 and decode_prompts >= 0 are required")
    uri = None if tracking_uri is None else check_tracking_uri(resolve_tracking_uri(tracking_uri))  # fail before work
    held = split_prompts(prompts, heldout_per_task, cfg.seed)
    extra, extra_spec = training_only(extra_prompts, prompts, held), extra_spec or spec
    t0 = time.monotonic()
    dirs = [generate_corpus(target, prompts, spec, data_root, progress, workers)]
    if extra:
        dirs.append(generate_corpus(target, extra, extra_spec, data_root, progress, workers))
    corpus = load_corpus(*dirs)
    gen_minutes = (time.monotonic() - t0) / 60
    train_slices, held_slices, train_pos, held_pos = split_positions(corpus, held)
    vocab = most_frequent(corpus.argmax[train_pos], target.vocab_size, draft_vocab)
    head = new_head(target, vocab, cfg.seed)
    lm_head = target.model.get_output_embeddings()
    teacher = functools.partial(target_logits, lm_head=lm_head, ids=vocab.ids.to(target.device))
    params = run_params(target, dirs, extra, extra_spec, len(train_pos), held, vocab, spec, cfg)
    logger = RunLogger.open(uri, params, out_dir)
    try:
        ids = vocab.ids.to(target.device)
        result = train(head, teacher, ids, corpus, train_slices, held_slices, out_dir, cfg, logger.log, progress)
        save_head(out_dir, head, vocab, spec.layers)
        final = {
            "heldout_vocab_coverage": vocab.coverage(corpus.argmax[held_pos]),
            "generation_minutes": gen_minutes,
            **{k: v for k, v in result.items() if k != "history"},
        }
        if decode_prompts and held:
            decoded = [p for p in prompts if p.prompt_id in held][:decode_prompts]
            final["tokens_per_pass_b59"] = tokens_per_pass(target, load_eagle3(out_dir, target), decoded, decode_tokens)
        logger.log({k: v for k, v in final.items() if isinstance(v, (int, float))}, result["step"])
        trained = [p for p in prompts if p.prompt_id not in held] + list(extra)
        write_json_atomic(Path(out_dir) / SUMMARY, {
            "params": params, "final": final, "history": result["history"],
            "training_prompts": prompt_digests(trained),
        })
    finally:
        logger.close()
    return final
