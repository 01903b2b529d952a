"""The online decoding round: an optional root pass, a selection strategy, one tree pass, verify, commit.

A root pass scores the root alone and commits its KV; the tree pass then reuses it: its
inputs exclude the root and its rows, positions and mask are the scored set's shifted by
one. The covering decoder leaves the same state behind by committing the leaf it emits.
Each round returns the recorder's ``rounds`` record (``specrank.schema``) plus online
columns: ``decoder``, ``rule``, ``realized``, ``expected``, ``passes`` and ``expected_<rule>``.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from specrank.decode.compare import expected_values, measured_nodes
from specrank.decode.loop import (
    DecodeConfig, PromptState, Timer, emitted_node, eos_token_ids, final_output, is_finished, ranked_tree, retain,
    round_record, start_prompt, verify_tree,
)
from specrank.decode.online import (
    RerankedSelection, RoundContext, SelectionStrategy, draft_rank, drawn_node, forced_first_draw, leaf_demotion,
    round_batch, skips_tree_pass,
)
from specrank.decode.pool import DraftPool, causal_mask
from specrank.decode.tree import attention_mask, scored_set
from specrank.decode.verify import ExhaustiveVerifier
from specrank.schema import ROW_COLUMNS, ROW_SCALARS
from specrank.selection import PoolBatch, cumulate


@dataclass
class OnlineTimer(Timer):
    """Adds the prompt prefill, root pass, reranker inference (online features included) and the count of
    target passes after the prefill; ``target`` is tree passes only."""

    prefill: float = 0.0
    root: float = 0.0
    rerank: float = 0.0
    passes: int = 0

    @property
    def bookkeeping(self) -> float:
        return self.total - self.prefill - self.draft - self.target - self.root - self.rerank


@dataclass
class Measure:
    """Measurement-only scoring: ``rules`` compared at the decoder's contexts; ``record`` also scores
    the expanded nodes and top-M candidates so the rounds hold every pool edge, like the recorder."""

    rules: tuple = ()
    record: bool = False
    reranker: RerankedSelection | None = None


@dataclass
class OnlineState(PromptState):
    prompt_id: str = "0"
    task: str = ""
    root_logits: torch.Tensor | None = None  # (V,) when the root's KV is already cached
    root_hidden: torch.Tensor | None = None


def root_pass(target, drafter, state: OnlineState, timer: OnlineTimer) -> None:
    """Score the root alone and commit its KV (it is committed in every case); keep its row."""
    n = state.context_len
    with timer.span("root"):
        logits, hidden = target.forward(torch.tensor([state.root]), torch.tensor([n]), causal_mask(1, n),
                                        state.cache, drafter.hidden_layers)
    timer.passes += 1
    state.context_len += 1
    state.root_logits, state.root_hidden = logits[0], None if hidden is None else hidden[0]


def round_features(state: OnlineState, pool: DraftPool, config: DecodeConfig):
    """Features of this round's first-level candidates, by the offline featurizer on a one-round table."""
    from specrank.featurize import featurize_rounds

    topk = config.shape.topk
    rows = state.caches.read(len(state.records), state.root, pool.token[:topk], torch.zeros(1))
    table = {
        "prompt_id": np.array([state.prompt_id]), "task": np.array([state.task]),
        "round": np.array([len(state.records)]), "position": np.array([len(state.output)]),
        "prompt_len": np.array([len(state.prompt_ids)]), "root_token": np.array([state.root]),
        "prev_accepted": np.array([state.records[-1]["accepted"] if state.records else np.nan]),
        **{k: getattr(pool, k)[None] for k in ("token", "parent", "depth", "q_edge", "draft_logp")},
        **{k: np.asarray(rows[k])[None] for k in list(ROW_COLUMNS) + list(ROW_SCALARS)},
    }
    return featurize_rounds(table, {"temperature": config.temperature, "topk": topk}, labels=False)


def own_expected(record: dict, tree: np.ndarray, rule: SelectionStrategy, node: int, law: str) -> float:
    """Expected acceptance of the selected tree given the round's draw (its mean is the rule's value)."""
    edge = record["p_argmax_child"] if law == "greedy" else record["p_edge"]
    path = cumulate(record["parent"][None], record["depth"][None], np.asarray(edge, np.float64)[None])[0]
    if not rule.draws_first:
        return float(path[tree].sum())
    if node < 0:
        return float(rule.counts_draw)
    branch = record_batch(record).first_ancestor[0] == node
    return float(path[tree & branch].sum() / path[node]) if path[node] > 0 else float(rule.counts_draw)


_POOL = ("token", "parent", "depth", "q_edge", "draft_logp", "p_edge", "p_argmax_child")


def record_batch(record: dict) -> PoolBatch:
    """A one-round PoolBatch of a round record (target probabilities as scored by its passes)."""
    return PoolBatch(**{k: np.asarray(record[k])[None] for k in _POOL})


def measured_order(pool: DraftPool, state: OnlineState, config: DecodeConfig, measure: Measure, ctx: RoundContext,
                   root_known: bool):
    """(pool indices scored for measurement only, reranker first factor (1, topk) or None)."""
    factor = measure.reranker.first_factor(pool, ctx)[None] if measure.reranker and measure.rules else None
    extra = np.zeros(0, np.int64)
    if measure.rules:
        batch = round_batch(pool, state.root_logits, config.temperature)
        extra = np.flatnonzero(measured_nodes(batch, measure.rules, config.budget, ctx.law, root_known, factor))
    recorded = draft_rank(pool)[: config.extra] if measure.record else np.zeros(0, np.int64)
    return np.concatenate([extra, recorded]).astype(np.int64), factor


def online_round(target, drafter, state: OnlineState, config: DecodeConfig, strategy: SelectionStrategy,
                 timer: OnlineTimer, verifier: ExhaustiveVerifier, measure: Measure | None = None) -> dict:
    """One round of ``strategy``; return its record."""
    root_known = state.root_logits is not None
    rule = strategy.plan(root_known)
    passes = timer.passes
    with timer.span("draft"):
        pool = drafter.grow_pool(state.root, config.shape)
    if rule.needs_root_pass and not root_known:
        root_pass(target, drafter, state, timer)
        root_known = True
    drawn = rule.draw(state.root_logits, pool, verifier, state.generator) if rule.draws_first else -1
    node = drawn_node(pool, drawn, config.shape.topk) if rule.draws_first else -1
    features = _once(lambda: round_features(state, pool, config))
    ctx = RoundContext(config.budget, config.temperature, state.root_logits, node, features)
    with timer.span("rerank") if isinstance(rule, RerankedSelection) else nullcontext():
        tree, score = rule.select(pool, ctx)
    skip = skips_tree_pass(rule, tree, node)
    verified = np.zeros(len(pool), bool) if skip else tree
    rank = draft_rank(pool)
    measure = measure or Measure()
    order, factor = measured_order(pool, state, config, measure, ctx, root_known)
    expanded = pool.expanded if measure.record else np.zeros(len(pool), bool)
    s = scored_set(state.root, pool.token, pool.parent, pool.depth, expanded, verified, order, len(order),
                   state.context_len - int(root_known))
    logits, hidden = tree_pass(target, drafter, state, s, root_known, timer)
    logp = torch.log_softmax(logits / config.row_temperature, -1)  # (n, V)
    rows = state.caches.read(len(state.records), state.root, pool.token[: config.shape.topk], logp[0])
    if skip:
        accepted, continuation = np.zeros(0, np.int64), drawn
    else:
        vlogits = logits[: s.n_tree + 1]
        vlogits = forced_first_draw(vlogits, drawn) if rule.draws_first else vlogits
        accepted, continuation = verifier.verify(verify_tree(pool, s), vlogits, state.generator)
    carried = -1
    if strategy.carries_leaf_row and leaf_demotion(accepted, verified, pool.parent):
        carried, continuation, accepted = int(s.row_of[accepted[-1]]), int(pool.token[accepted[-1]]), accepted[:-1]
    emitted = emitted_node(pool, accepted, continuation)
    record = round_record(state, pool, logp, s, accepted, continuation, emitted, rank, rows)
    commit_round(target, drafter, state, pool.token[accepted], s.row_of[accepted], carried, root_known,
                 s.n > 1 or not root_known, hidden, timer)
    last_row = int(s.row_of[accepted[-1]]) if len(accepted) else 0
    retain(state, pool, ranked_tree(score, pool.depth, verified), s, logp, last_row, continuation, emitted)
    state.output += [int(x) for x in pool.token[accepted]] + [int(continuation)]
    state.root = int(continuation)
    state.root_logits = logits[carried] if carried >= 0 else None
    state.root_hidden = hidden[carried] if carried >= 0 and hidden is not None else None
    state.records.append(record)
    record.update(decoder=strategy.name, rule=rule.name, drawn=drawn, passes=timer.passes - passes,
                  realized=len(accepted) + int(skip and rule.counts_draw),
                  expected=np.nan if strategy.carries_leaf_row else own_expected(record, tree, rule, node, ctx.law))
    if measure.rules:
        values = expected_values(record_batch(record), measure.rules, config.budget, ctx.law, factor)
        record.update({f"expected_{k}": v for k, v in values.items()})
    return record


def _once(fn):
    """``fn`` evaluated at most once (features are computed only when a strategy asks for them)."""
    cache = []
    return lambda: cache[0] if cache else cache.append(fn()) or cache[0]


def tree_pass(target, drafter, state: OnlineState, s, root_known: bool, timer: OnlineTimer):
    """Logits (n, V) and hidden states of the scored set's rows, the root's from the root pass when known."""
    if s.n == 1 and root_known:  # nothing beyond the root to score
        hidden = None if state.root_hidden is None else state.root_hidden[None]
        return state.root_logits[None], hidden
    lo = int(root_known)  # the root's KV is cached: score rows 1.. only
    mask = attention_mask(s.ancestors, state.context_len - lo)[lo:]
    with timer.span("target"):
        logits, hidden = target.forward(s.input_ids[lo:], s.position_ids[lo:], mask, state.cache,
                                        drafter.hidden_layers)
    timer.passes += 1
    if root_known:
        logits = torch.cat([state.root_logits[None], logits])
        hidden = None if hidden is None else torch.cat([state.root_hidden[None], hidden])
    return logits, hidden


def commit_round(target, drafter, state: OnlineState, tokens, rows, carried: int, root_known: bool, ran: bool,
                 hidden, timer: OnlineTimer) -> None:
    """Keep the root (unless cached), the accepted rows and a carried leaf in the target's KV; hand the
    root and accepted path to the drafter."""
    keep = np.concatenate([[] if root_known else [0], rows, [carried] if carried >= 0 else []]).astype(np.int64)
    if ran:
        target.commit(state.cache, state.context_len, torch.from_numpy(keep - int(root_known)))
    state.context_len += len(keep)
    committed = torch.as_tensor(np.concatenate([[state.root], tokens]), dtype=torch.long)
    with timer.span("draft"):
        drafter.commit(committed, None if hidden is None else hidden[torch.from_numpy(np.concatenate([[0], rows]))])


def decode_prompt_online(target, drafter, prompt_ids, config: DecodeConfig, strategy: SelectionStrategy,
                         prompt_id: str = "0", task: str = "", timer: OnlineTimer | None = None,
                         measure: Measure | None = None):
    """Decode one prompt with ``strategy``; return (output token ids, list of round records)."""
    strategy.check(config)
    timer = timer or OnlineTimer()
    verifier = ExhaustiveVerifier(config.temperature)
    eos = eos_token_ids(target)
    with timer.span("total"):
        tree_passes = timer.target
        state = OnlineState(**vars(start_prompt(target, drafter, prompt_ids, config, prompt_id, timer)),
                            prompt_id=prompt_id, task=task)
        timer.prefill += timer.target - tree_passes  # start_prompt times the prefill as a target pass
        timer.target = tree_passes
        while not is_finished(state, eos, config):
            record = online_round(target, drafter, state, config, strategy, timer, verifier, measure)
            record.update(prompt_id=prompt_id, task=task)
            timer.rounds += 1
            timer.tokens += record["accepted"] + 1
    return final_output(state.output, eos, config.max_new_tokens), state.records


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
            timer = OnlineTimer()
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
