"""The online speed protocol (target-row reuse, arXiv 2610.29210, App. D.14): every strategy on every prompt, in an
order rotated per prompt, after warm-up decodes, with what each strategy realized and expected at its own contexts.

Each round's measurement (its record, the expected values of compared strategies) is timed apart and left
out of the strategies' seconds, so tokens/s measures decoding alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specrank.decode.config import DecodeConfig
from specrank.decode.engine.prompt import decode_prompt
from specrank.decode.engine.timer import Timer
from specrank.decode.runs.measure import Measure
from specrank.decode.strategies import RerankedSelection


def rotated(strategies: list, i: int) -> list:
    """``strategies`` rotated by ``i`` (prompt i runs them in this order, App. D.14)."""
    k = i % len(strategies)
    return strategies[k:] + strategies[:k]


def decode_row(prompt_id: str, task: str, strategy: str, order: int, tokens: int, timer: Timer) -> dict:
    """One row of the decodes table: tokens, rounds, target passes and the seconds by span."""
    return {"prompt_id": prompt_id, "task": task, "strategy": strategy, "order": order, "tokens": tokens,
            "rounds": timer.rounds, "passes": timer.passes, "seconds": timer.decoding, "prefill_s": timer.prefill,
            "draft_s": timer.draft, "root_pass_s": timer.root, "tree_pass_s": timer.target,
            "rerank_s": timer.rerank, "bookkeeping_s": timer.bookkeeping, "measure_s": timer.measure,
            "drafter_busy_s": timer.drafting, "root_pass_hidden_s": timer.root_pass_hidden_s}


def run_protocol(target, drafter, prompts, config: DecodeConfig, strategies: dict, compare=(), warmup: int = 1,
                 progress=None, measure: bool = True, drafters: dict | None = None):
    """Every strategy on every prompt, in an order rotated per prompt, after warm-up decodes.

    ``prompts``: list of (prompt_id, task, token ids); ``strategies``: {name: SelectionStrategy}. With
    ``measure`` each round's record is kept (realized and expected acceptance, ``compare``'s strategies).
    ``drafters`` ({name: drafter}) gives a strategy its own drafter (a pipelined one); the rest use ``drafter``.
    ``progress(prompts done, decode rows so far)`` is called after each prompt.
    Returns (rounds DataFrame: one row per round, decodes DataFrame: one row per (prompt, strategy)).
    """
    names = list(strategies)
    reranker = next((s for s in strategies.values() if isinstance(s, RerankedSelection)), None)
    for s in strategies.values():
        s.check(config)  # every reranker and strategy is checked before the first decode
    observer = Measure(tuple(compare), reranker=reranker) if measure else None
    drafter_of = {name: (drafters or {}).get(name, drafter) for name in names}
    for pid, task, ids in prompts[:warmup]:
        for name in names:
            decode_prompt(target, drafter_of[name], ids, config, strategies[name], observer=observer, prompt_id=pid,
                          task=task)
    rounds, decodes = [], []
    for i, (pid, task, ids) in enumerate(prompts):
        for name in rotated(names, i):
            timer = Timer()
            out, records = decode_prompt(target, drafter_of[name], ids, config, strategies[name], observer=observer,
                                         prompt_id=pid, task=task, timer=timer)
            rounds += [{k: v for k, v in r.items() if np.ndim(v) == 0} for r in records]
            decodes.append(decode_row(pid, task, name, names.index(name), len(out), timer))
        if progress:
            progress(i + 1, decodes)
    return pd.DataFrame(rounds), pd.DataFrame(decodes)
