"""The study's prompts: those that fit the target's context, in the study's seeded order, the last of them kept
unseen for the online phase."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from specrank.atomic import atomic_write
from specrank.decode.loading.named_targets import DEFAULT_TARGET
from specrank.decode.loading.targets import load_target_tokenizer
from specrank.decode.prompts import encode_prompt, read_prompts, spec_bench_path, spec_bench_text
from specrank.experiments.study.study_settings import DEFAULT_MAX_NEW_TOKENS, DEFAULT_ONLINE_PROMPTS, StudyDirError
from specrank.layout import StudyLayout

log = logging.getLogger(__name__)


def fitting_prompts(target: str, prompts, max_new_tokens: int, depth: int = 8) -> tuple[list, int]:
    """(the prompts whose chat-encoded length leaves room for ``max_new_tokens`` and a pool of ``depth`` in the
    target's context, how many were skipped); only the tokenizer loads."""
    tokenizer, context = load_target_tokenizer(target)
    if context is None:
        return list(prompts), 0
    kept = [p for p in prompts if len(encode_prompt(tokenizer, p.text)) + max_new_tokens + depth <= context]
    return kept, len(prompts) - len(kept)


def study_order(prompts, seed: int) -> list:
    """``prompts`` in a study's seeded order (any prefix mixes the tasks)."""
    return [prompts[i] for i in np.random.default_rng(seed).permutation(len(prompts))]


def online_reserve(n_prompts: int, online_prompts: int) -> int:
    """How many prompts at the end of the study's order the online phase keeps unseen: ``online_prompts``, at most a
    quarter of the prompts (said in one line when lowered)."""
    reserved = min(online_prompts, n_prompts // 4)
    if reserved < online_prompts:
        log.info(f"online phase: {reserved} prompts kept unseen (of {online_prompts} asked: at most a quarter of the "
                 f"{n_prompts} prompts)")
    return reserved


def unseen_prompts(target: str = DEFAULT_TARGET, prompts=None, *, online_prompts: int = DEFAULT_ONLINE_PROMPTS,
                   max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, seed: int = 0) -> list:
    """The prompts a study with these settings never records and decodes in its online phase: the last
    ``online_reserve`` of its order of the prompts that fit ``target`` (``prompts``: a JSONL file, default
    Spec-Bench). Only the tokenizer loads."""
    kept, _ = fitting_prompts(target, read_prompts(prompts or spec_bench_path()), max_new_tokens)
    reserved = online_reserve(len(kept), online_prompts)
    return study_order(kept, seed)[len(kept) - reserved:]


def write_study_prompts(out: Path, prompts, seed: int) -> Path:
    """``OUT/prompts.jsonl``: ``prompts`` in the study's order (``study_order``), in Spec-Bench form; an
    existing file must hold exactly these lines (the same study), else the study is refused."""
    text = spec_bench_text(study_order(prompts, seed))
    path = StudyLayout(out).prompts
    if path.is_file():
        if path.read_text(encoding="utf-8") != text:
            raise StudyDirError(f"{out} holds another study (its prompts.jsonl differs); use a new --out")
        return path
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda p: Path(p).write_text(text, encoding="utf-8"))
    return path
