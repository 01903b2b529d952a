"""Online decoding runs: one prompt with a selection strategy, and the speed protocol over prompts.

The round itself is ``specrank.decode.loop.decode_round`` (the recorder's too): the strategy decides
whether a root pass runs first and which tree the one tree pass verifies.
"""

from __future__ import annotations

import numpy as np

from specrank.decode.compare import Measure
from specrank.decode.loop import DecodeConfig, Timer, decode_prompt
from specrank.decode.online import RerankedSelection, SelectionStrategy

__all__ = ["Measure", "decode_prompt_online", "rotated", "run_protocol"]


def decode_prompt_online(target, drafter, prompt_ids, config: DecodeConfig, strategy: SelectionStrategy,
                         prompt_id: str = "0", task: str = "", timer: Timer | None = None,
                         measure: Measure | None = None):
    """Decode one prompt with ``strategy``, scoring nothing beyond root + tree unless ``measure`` asks."""
    return decode_prompt(target, drafter, prompt_ids, config, prompt_id, task, timer=timer, strategy=strategy,
                         measure=measure or Measure())


def rotated(rules: list, i: int) -> list:
    """``rules`` rotated by ``i`` (prompt i runs them in this order, App. D.14)."""
    k = i % len(rules)
    return rules[k:] + rules[:k]


def run_protocol(target, drafter, prompts, config: DecodeConfig, strategies: dict, compare=(), warmup: int = 1,
                 progress=None):
    """Every strategy on every prompt, in an order rotated per prompt, after warm-up decodes.

    ``prompts``: list of (prompt_id, task, token ids); ``strategies``: {name: SelectionStrategy}.
    Returns (rounds DataFrame: one row per round, decodes DataFrame: one row per (prompt, decoder)).
    """
    import pandas as pd

    names = list(strategies)
    reranker = next((s for s in strategies.values() if isinstance(s, RerankedSelection)), None)
    for s in strategies.values():
        s.check(config)  # every reranker and strategy is checked before the first decode
    measure = Measure(tuple(compare), reranker=reranker)
    for pid, task, ids in prompts[:warmup]:
        for name in names:
            decode_prompt_online(target, drafter, ids, config, strategies[name], pid, task, measure=measure)
    rounds, decodes = [], []
    for i, (pid, task, ids) in enumerate(prompts):
        for name in rotated(names, i):
            timer = Timer()
            out, records = decode_prompt_online(target, drafter, ids, config, strategies[name], pid, task, timer,
                                                measure)
            rounds += [{k: v for k, v in r.items() if np.ndim(v) == 0} for r in records]
            decodes.append({"prompt_id": pid, "task": task, "decoder": name, "order": names.index(name),
                            "tokens": len(out), "rounds": timer.rounds, "passes": timer.passes,
                            "seconds": timer.total, "prefill_s": timer.prefill, "draft_s": timer.draft,
                            "root_pass_s": timer.root,
                            "tree_pass_s": timer.target, "rerank_s": timer.rerank,
                            "bookkeeping_s": timer.bookkeeping})
        if progress:
            progress(i + 1)
    return pd.DataFrame(rounds), pd.DataFrame(decodes)
