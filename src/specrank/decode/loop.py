"""The per-prompt decoding loop: prefill, rounds (draft, [root pass], tree pass, verify, commit), stop.

The committed context ``c`` is every token whose KV is in the target's cache; the root is
the last emitted token, not yet cached (the last prompt token before round 0). One round
function serves the recorder and every online decoder: a selection strategy
(``specrank.decode.online``) picks the tree and may ask for a root pass first, whose KV the
tree pass reuses (its inputs exclude the root; rows, positions and mask shift by one). The
recorder scores every pool edge (SPEC §1); online decoders score root + tree plus what
``Measure`` asks. Each round records its pool and the retained rows read at its first-level
candidates (SPEC §4).
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from specrank.decode.caches import RowCaches
from specrank.decode.compare import Measure, expected_values, measured_nodes, own_expected, record_batch
from specrank.decode.online import (
    RerankedSelection, RoundContext, ScoreSelection, SelectionStrategy, draft_rank, drawn_node, forced_first_draw,
    leaf_demotion, round_batch, skips_tree_pass,
)
from specrank.decode.pool import DraftPool, PoolShape, causal_mask
from specrank.decode.tree import TreeError, attention_mask, scored_set
from specrank.decode.verify import ExhaustiveVerifier, Verifier, VerifyTree
from specrank.schema import ROW_COLUMNS, ROW_SCALARS
from specrank.selection.select import rank_order, rank_positions

ScoreFn = Callable[[DraftPool], np.ndarray]  # pool -> (M,) selection score (higher is better)


def draft_score(pool: DraftPool) -> np.ndarray:
    """Draft selection: cumulative draft log-probability."""
    return pool.draft_logp


@dataclass(frozen=True)
class DecodeConfig:
    shape: PoolShape = PoolShape()
    budget: int = 59  # B, verified tree size (root excluded)
    extra: int = 160  # M, top draft-ranked candidates also scored
    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.budget, int) or not 1 <= self.budget <= self.shape.size:
            raise ValueError(f"budget {self.budget} must be in 1..{self.shape.size} (the pool size)")
        if self.extra < 0:
            raise ValueError(f"extra scored candidates must be >= 0, got {self.extra}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def row_temperature(self) -> float:
        """Temperature of recorded probabilities: T, or 1 under greedy decoding."""
        return self.temperature or 1.0


def prompt_seed(seed: int, prompt_id: str) -> int:
    """Generator seed of one (prompt, run seed): independent of prompt order and resumes."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()[:8], "little") >> 1


@dataclass
class Timer:
    """Seconds spent in the prompt prefill, drafting, root passes, tree passes, reranker inference (online
    features included) and in total, with round, token and target-pass (after the prefill) counts."""

    prefill: float = 0.0
    draft: float = 0.0
    root: float = 0.0
    target: float = 0.0
    rerank: float = 0.0
    total: float = 0.0
    rounds: int = 0
    tokens: int = 0
    passes: int = 0

    @contextmanager
    def span(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)

    @property
    def bookkeeping(self) -> float:
        """Everything outside target and drafter forward passes and reranker inference."""
        return self.total - self.prefill - self.draft - self.root - self.target - self.rerank


@dataclass
class PromptState:
    """One prompt's decoding state between rounds."""

    prompt_ids: np.ndarray
    cache: object
    caches: RowCaches
    generator: torch.Generator
    root: int
    context_len: int
    output: list = field(default_factory=list)
    records: list = field(default_factory=list)
    prompt_id: str = "0"
    task: str = ""
    root_logits: torch.Tensor | None = None  # (V,) when the root's KV is already cached (root pass, covering)
    root_hidden: torch.Tensor | None = None


def edge_probs(logp: torch.Tensor, pool: DraftPool, row_of: np.ndarray):
    """p_edge (M,) and p_argmax_child (M,) from each candidate's parent row of ``logp`` (n, V)."""
    par_row = np.where(pool.parent < 0, 0, row_of[np.maximum(pool.parent, 0)])  # (M,)
    scored = par_row >= 0
    rows = torch.from_numpy(np.maximum(par_row, 0))
    tokens = torch.from_numpy(pool.token)
    p = logp[rows, tokens].exp().numpy()
    argmax = (logp.argmax(-1)[rows] == tokens).numpy()
    return np.where(scored, p, np.nan).astype(np.float32), np.where(scored, argmax, 0).astype(np.int8)


def emitted_node(pool: DraftPool, accepted: np.ndarray, continuation: int) -> int:
    """Pool index of the emitted address (accepted path + continuation), -1 when not in the pool."""
    last = accepted[-1] if len(accepted) else -1
    hit = np.flatnonzero((pool.parent == last) & (pool.token == continuation))
    return int(hit[0]) if len(hit) else -1


def start_prompt(target, drafter, prompt_ids, config: DecodeConfig, prompt_id: str, timer: Timer) -> PromptState:
    """Prefill the target with the prompt but its last token (the first root); seed the row caches."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    committed = ids[:-1]
    n = len(committed)
    cache = target.new_cache()
    with timer.span("prefill"):
        logits, hidden = target.forward(committed, torch.arange(n), causal_mask(n, 0), cache, drafter.hidden_layers)
    caches = RowCaches(target.vocab_size)
    caches.seed(committed.numpy(), torch.log_softmax(logits / config.row_temperature, -1))
    with timer.span("draft"):
        drafter.start(committed, hidden)
    gen = torch.Generator().manual_seed(prompt_seed(config.seed, prompt_id))
    return PromptState(ids.numpy(), cache, caches, gen, int(ids[-1]), n, prompt_id=prompt_id)


def root_pass(target, drafter, state: PromptState, timer: Timer) -> None:
    """Score the root alone and commit its KV (it is committed in every case); keep its row."""
    n = state.context_len
    with timer.span("root"):
        logits, hidden = target.forward(torch.tensor([state.root]), torch.tensor([n]), causal_mask(1, n),
                                        state.cache, drafter.hidden_layers)
    timer.passes += 1
    state.context_len += 1
    state.root_logits, state.root_hidden = logits[0], None if hidden is None else hidden[0]


def round_features(state: PromptState, pool: DraftPool, config: DecodeConfig):
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


def measured_order(pool: DraftPool, state: PromptState, config: DecodeConfig, measure: Measure, ctx: RoundContext,
                   root_known: bool):
    """(pool indices scored for measurement only, reranker first factor (1, topk) or None)."""
    factor = measure.reranker.first_factor(pool, ctx)[None] if measure.reranker and measure.rules else None
    extra = np.zeros(0, np.int64)
    if measure.rules:
        batch = round_batch(pool, state.root_logits, config.temperature)
        extra = np.flatnonzero(measured_nodes(batch, measure.rules, config.budget, ctx.law, root_known, factor))
    recorded = draft_rank(pool)[: config.extra] if measure.record else np.zeros(0, np.int64)
    return np.concatenate([extra, recorded]).astype(np.int64), factor


def decode_round(target, drafter, state: PromptState, config: DecodeConfig, verifier: Verifier,
                 strategy: SelectionStrategy, timer: Timer, measure: Measure | None = None) -> dict:
    """One round: grow the pool, a root pass if the strategy needs the root row, select, one tree pass
    (root + tree, plus measurement prefixes), verify, commit; return its record."""
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


def tree_pass(target, drafter, state: PromptState, s, root_known: bool, timer: Timer):
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


def commit_round(target, drafter, state: PromptState, tokens, rows, carried: int, root_known: bool, ran: bool,
                 hidden, timer: Timer) -> None:
    """Keep the root (unless cached), the accepted rows and a carried leaf in the target's KV; hand the
    root and accepted path to the drafter."""
    keep = np.concatenate([[] if root_known else [0], rows, [carried] if carried >= 0 else []]).astype(np.int64)
    if ran:
        target.commit(state.cache, state.context_len, torch.from_numpy(keep - int(root_known)))
    state.context_len += len(keep)
    committed = torch.as_tensor(np.concatenate([[state.root], tokens]), dtype=torch.long)
    with timer.span("draft"):
        drafter.commit(committed, None if hidden is None else hidden[torch.from_numpy(np.concatenate([[0], rows]))])


def verify_tree(pool: DraftPool, s) -> VerifyTree:
    """The verified tree (pass rows 1..t) in the verifier's terms."""
    t = s.n_tree
    if (s.parent_row[1 : t + 1] > t).any():
        raise TreeError("verified tree is not ancestor-closed under the selection score")
    nodes = s.pool_index[1 : t + 1]
    return VerifyTree(pool.token[nodes], s.parent_row[1 : t + 1], nodes, pool.q_edge[nodes])


def commit(target, drafter, state: PromptState, keep, committed, hidden, timer: Timer) -> None:
    """Keep the root + accepted path (pass rows ``keep``, tokens ``committed``) in the target's KV cache
    (gathered per layer) and hand them to the drafter."""
    target.commit(state.cache, state.context_len, keep)
    with timer.span("draft"):
        drafter.commit(committed, None if hidden is None else hidden[keep])
    state.context_len += len(keep)


def retain(state: PromptState, pool, tree_ranked, s, logp, last_row: int, continuation: int, emitted: int) -> None:
    """Update the row caches with this round's rows (SPEC §4)."""
    emitted_row = int(s.row_of[emitted]) if emitted >= 0 else -1
    state.caches.update(len(state.records), state.root, logp[0], pool.token[tree_ranked],
                        logp[torch.from_numpy(s.row_of[tree_ranked])], logp[last_row], continuation,
                        logp[emitted_row] if emitted_row >= 0 else None)


def ranked_tree(score: np.ndarray, depth: np.ndarray, tree: np.ndarray) -> np.ndarray:
    """Pool indices of the verified tree, best-ranked first under ``score``."""
    order = rank_order(score[None], depth[None])[0]
    return order[tree[order]]


def round_record(state, pool, logp, s, accepted, continuation, emitted, draft_rank, rows) -> dict:
    """The ``rounds`` row of one round (columns of ``specrank.schema``)."""
    root_logp = logp[0]
    root_p = root_logp.exp()
    argmax = int(root_logp.argmax())
    p_edge, p_argmax = edge_probs(logp, pool, s.row_of)
    rank_of = rank_positions(draft_rank[None])[0]
    record = {
        "round": len(state.records),
        "position": len(state.output),
        "prompt_len": len(state.prompt_ids),
        "root_token": state.root,
        "token": pool.token, "parent": pool.parent, "depth": pool.depth,
        "q_edge": pool.q_edge, "draft_logp": pool.draft_logp,
        "p_edge": p_edge, "p_argmax_child": p_argmax,
        "root_entropy": float(torch.special.entr(root_p).sum()),
        "root_argmax": argmax,
        "root_argmax_prob": float(root_p[argmax]),
        "accepted": len(accepted),
        "accepted_nodes": accepted,
        "continuation": continuation,
        "emitted_rank": int(rank_of[emitted]) if emitted >= 0 else -1,
        "covered": bool(emitted >= 0 and s.row_of[emitted] >= 0),
        "n_scored": s.n,
    }
    record.update(rows)
    return record


def is_finished(state: PromptState, eos_ids, config: DecodeConfig) -> bool:
    """Stop after the round in which EOS appears or the output reaches max_new_tokens."""
    return len(state.output) >= config.max_new_tokens or not eos_ids.isdisjoint(state.output)


def final_output(output: list, eos_ids, max_new_tokens: int) -> list:
    """The emitted tokens cut after the first EOS and at ``max_new_tokens``."""
    out = output[:max_new_tokens]
    stops = [i for i, t in enumerate(out) if t in eos_ids]
    return out[: stops[0] + 1] if stops else out


def eos_token_ids(target) -> set:
    """EOS ids of the target (generation config and tokenizer)."""
    ids = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if target.tokenizer is not None and target.tokenizer.eos_token_id is not None:
        ids.add(int(target.tokenizer.eos_token_id))
    return ids


def decode_prompt(target, drafter, prompt_ids, config: DecodeConfig, prompt_id: str = "0", task: str = "",
                  verifier: Verifier | None = None, select: ScoreFn = draft_score, timer: Timer | None = None,
                  strategy: SelectionStrategy | None = None, measure: Measure | None = None):
    """Decode one prompt; return (output token ids, list of round records).

    By default this is the recorder: top-B under ``select``, every pool edge scored. An online
    ``strategy`` (``specrank.decode.online``) scores only root + tree unless ``measure`` asks for more.
    """
    timer = timer or Timer()
    verifier = verifier or ExhaustiveVerifier(config.temperature)
    if strategy is None:
        strategy, measure = ScoreSelection(select), measure or Measure(record=True)
    strategy.check(config)
    eos = eos_token_ids(target)
    with timer.span("total"):
        state = start_prompt(target, drafter, prompt_ids, config, prompt_id, timer)
        state.task = task
        while not is_finished(state, eos, config):
            record = decode_round(target, drafter, state, config, verifier, strategy, timer, measure)
            record.update(prompt_id=prompt_id, task=task)
            timer.rounds += 1
            timer.tokens += record["accepted"] + 1
    return final_output(state.output, eos, config.max_new_tokens), state.records
