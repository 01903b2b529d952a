"""Prompt files (JSON Lines, Spec-Bench or HumanEval form) and chat-template encoding."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


class PromptError(ValueError):
    """A prompt file is missing, empty or malformed."""


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    task: str
    text: str


def default_prompts_path() -> Path:
    """The bundled prompt set (8 prompts for each of 7 task types)."""
    return Path(str(resources.files("specrank") / "data" / "prompts.jsonl"))


def drafter_prompts_path() -> Path:
    """The bundled training-only prompts (1,709, seven task types) that heads are distilled on: none shares its
    text with the evaluation sets (``prompts.jsonl``, ``spec_bench.jsonl``)."""
    return Path(str(resources.files("specrank") / "data" / "drafter_prompts.jsonl"))


def spec_bench_path() -> Path:
    """Spec-Bench's 480 questions (Xia et al., arXiv 2401.07851; Apache-2.0, notice in ``spec_bench.LICENSE``
    beside it): 80 MT-Bench first turns and 80 each of translation, summarization, QA, math and RAG."""
    return Path(str(resources.files("specrank") / "data" / "spec_bench.jsonl"))


def prompt_digest(text: str) -> str:
    """The sha256 of a prompt's text (UTF-8): how a head's ``training.json`` names the prompts it trained on,
    so a prompt is recognised in any file under any id."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prompt_digests(prompts) -> dict[str, str]:
    """``{prompt_id: prompt_digest(text)}`` of ``prompts``."""
    return {p.prompt_id: prompt_digest(p.text) for p in prompts}


def _parse(obj, where: str) -> Prompt:
    prompt = _parse_form(obj, where)
    if not prompt.text.strip():
        raise PromptError(f"{where}: prompt {prompt.prompt_id!r} is empty")
    return prompt


def _parse_form(obj, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected a JSON object")
    if "turns" in obj:  # Spec-Bench: the first turn is the prompt
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise PromptError(f"{where}: 'turns' must be a non-empty list of strings")
        if "question_id" not in obj:
            raise PromptError(f"{where}: missing 'question_id'")
        return Prompt(str(obj["question_id"]), str(obj.get("category", "unknown")), turns[0])
    if "prompt" in obj:  # HumanEval
        if "task_id" not in obj or not isinstance(obj["prompt"], str):
            raise PromptError(f"{where}: HumanEval form needs 'task_id' and a string 'prompt'")
        return Prompt(str(obj["task_id"]), str(obj.get("category", "code")), obj["prompt"])
    raise PromptError(f"{where}: neither Spec-Bench ('question_id', 'turns') nor HumanEval ('task_id', 'prompt') form")


def spec_bench_text(prompts) -> str:
    """``prompts`` as Spec-Bench JSON Lines, one per line, the form ``read_prompts`` reads back."""
    return "".join(json.dumps({"question_id": p.prompt_id, "category": p.task, "turns": [p.text]}, ensure_ascii=False)
                   + "\n" for p in prompts)


def read_prompts(path, limit: int | None = None) -> list[Prompt]:
    """Read a JSONL prompt file; errors name the file and line number."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise PromptError(f"limit must be an integer >= 1, got {limit!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts = []
    with path.open(encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(_lines(f, path), start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptError(f"{where}: malformed JSON at column {exc.colno} ({exc.msg})") from None
            prompts.append(_parse(obj, where))
    if not prompts:
        raise PromptError(f"{path.name}: no prompts in file")
    ids = [p.prompt_id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise PromptError(f"{path.name}: duplicate prompt id {dup!r}")
    return prompts[:limit] if limit is not None else prompts


def _lines(f, path):
    try:
        yield from f
    except UnicodeDecodeError:
        raise PromptError(f"{path.name}: not a UTF-8 text file") from None


def check_context(ids: list[int], prompt_id: str, context_length: int | None, max_new_tokens: int,
                  depth: int) -> None:
    """Refuse a prompt that leaves no room in the target's context for ``max_new_tokens`` and a pool of
    ``depth`` (positions past the context are ones the model never saw)."""
    need = len(ids) + max_new_tokens + depth
    if context_length is not None and need > context_length:
        raise PromptError(f"prompt {prompt_id!r}: {len(ids)} tokens + max_new_tokens {max_new_tokens} + pool depth"
                          f" {depth} = {need} positions exceed the target's context of {context_length}")


def encode_prompts(target, prompts, config) -> list[list[int]]:
    """Token ids of every prompt under the chat template, each checked to fit ``target``'s context with
    ``config``'s ``max_new_tokens`` and pool depth (all refused up front, before any decoding)."""
    encoded = [encode_prompt(target.tokenizer, p.text) for p in prompts]
    context = getattr(target, "context_length", None)
    for p, ids in zip(prompts, encoded, strict=True):
        check_context(ids, p.prompt_id, context, config.max_new_tokens, config.shape.depth)
    return encoded


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of one user turn under the tokenizer's chat template (no system message added).

    Tokenizers without a chat template (base models, test tokenizers) encode the text as is.
    """
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    ids = [int(i) for i in ids]
    if len(ids) < 2:
        raise PromptError(f"prompt encodes to {len(ids)} token(s); at least 2 are needed")
    return ids
