"""The prompts an engine benchmark decodes (``benchmarks/bench_sglang.py``): none that the head or either shipped
champion trained on, checked by digest. The bundled held-out set, or the first ones of another set in a study's
seeded order (every prefix mixes the tasks), less those either trained on. Refusals name the benchmark options these
arguments come from (``--limit``, ``--prompts``, ``--drafter``, ``--max-prompt-tokens``).
"""

from __future__ import annotations

from pathlib import Path

from specrank.atomic import atomic_write
from specrank.decode.loading.drafters import check_unseen, trained_on
from specrank.decode.loading.targets import load_target_tokenizer
from specrank.decode.prompts import (default_prompts_path, encode_prompt, prompt_digest, read_prompts,
                                     spec_bench_path, spec_bench_text)
from specrank.experiments.study.study_prompts import study_order
from specrank.rerankers.defaults import default_reranker_dir
from specrank.rerankers.loader import load_reranker
from specrank.workflow.champion import training_prompts


class HeldOutError(ValueError):
    """No held-out set of the size asked: the message names the option at fault."""


def champions_seen() -> dict[float, set[str]]:
    """The prompt digests each shipped champion (greedy, T = 1) learned from."""
    return {t: training_prompts(load_reranker(default_reranker_dir(t))) for t in (0.0, 1.0)}


def held_out_prompts(drafter: str, limit: int, prompts: str | None = None, *, target: str = "smollm2",
                     max_prompt_tokens: int | None = None) -> list:
    """The first ``limit`` bundled held-out prompts, refused when a champion trained on any of them
    (``SeenPromptError`` when the head did); or, with ``prompts`` (a JSONL file or ``spec-bench``), the first
    ``limit`` of that set in a study's seeded order that neither trained on, each at most ``max_prompt_tokens``
    target tokens long. ``HeldOutError`` when too few remain."""
    champions = champions_seen()
    if prompts is None:
        chosen = read_prompts(default_prompts_path(), limit=limit)
        check_unseen(drafter, chosen)
        for t, seen in champions.items():
            if any(prompt_digest(p.text) in seen for p in chosen):
                raise HeldOutError(f"--limit {limit}: the champion at T = {t:g} trained on some of these prompts")
        return chosen
    ordered = study_order(read_prompts(spec_bench_path() if prompts == "spec-bench" else Path(prompts)), seed=0)
    head_seen = trained_on(drafter, ordered)
    if head_seen is None:
        raise HeldOutError(f"--drafter {drafter}: its training.json does not say which prompts it trained on")
    kept = unseen_by(ordered, set(head_seen), set().union(*champions.values()))
    if max_prompt_tokens is not None:
        tokenizer, _ = load_target_tokenizer(target)
        kept = [p for p in kept if len(encode_prompt(tokenizer, p.text)) <= max_prompt_tokens]
    if len(kept) < limit:
        raise HeldOutError(f"--prompts {prompts}: {len(kept)} prompts that neither the head nor a champion trained on"
                           + (f" of at most {max_prompt_tokens} tokens" if max_prompt_tokens else "")
                           + f", fewer than --limit {limit}")
    return kept[:limit]


def unseen_by(prompts, head_seen: set[str], champion_seen: set[str]) -> list:
    """``prompts`` less those the head trained on (by id) and those a champion learned from (by digest)."""
    return [p for p in prompts if p.prompt_id not in head_seen and prompt_digest(p.text) not in champion_seen]


def write_prompts(path: Path, prompts) -> None:
    """``prompts`` as Spec-Bench JSONL at ``path``, written atomically: the form tree-config reads."""
    text = spec_bench_text(prompts)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
