"""The per-prompt recording loop: prefill, rounds (draft, one target pass, verify, commit), stop.

The committed context ``c`` is every token whose KV is in the target's cache; the root is
the last emitted token, not yet cached (the last prompt token before round 0). Each round
records its pool with the exact target probability of every edge (SPEC §1) and the retained
rows read at its first-level candidates (SPEC §4).
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from specrank.decode.caches import RowCaches
from specrank.decode.pool import DraftPool, PoolShape, causal_mask
from specrank.decode.tree import TreeError, attention_mask, scored_set
from specrank.decode.verify import ExhaustiveVerifier, Verifier, VerifyTree
from specrank.selection.select import rank_order, rank_positions, select_top

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
    """Seconds spent drafting, in target passes and in total, with round and token counts."""

    draft: float = 0.0
    target: float = 0.0
    total: float = 0.0
    rounds: int = 0
    tokens: int = 0

    @contextmanager
    def span(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)

    @property
    def bookkeeping(self) -> float:
        """Everything outside target and drafter forward passes."""
        return self.total - self.draft - self.target


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
    with timer.span("target"):
        logits, hidden = target.forward(committed, torch.arange(n), causal_mask(n, 0), cache, drafter.hidden_layers)
    caches = RowCaches(target.vocab_size)
    caches.seed(committed.numpy(), torch.log_softmax(logits / config.row_temperature, -1))
    with timer.span("draft"):
        drafter.start(committed, hidden)
    gen = torch.Generator().manual_seed(prompt_seed(config.seed, prompt_id))
    return PromptState(ids.numpy(), cache, caches, gen, int(ids[-1]), n)


def decode_round(target, drafter, state: PromptState, config: DecodeConfig, verifier: Verifier,
                 select: ScoreFn, timer: Timer) -> dict:
    """One round: grow the pool, score root + tree + expanded + top-M, verify, commit; return its record."""
    with timer.span("draft"):
        pool = drafter.grow_pool(state.root, config.shape)
    score = select(pool)  # (M,)
    tree = select_top(score[None], pool.depth[None], config.budget)[0]  # (M,) bool
    draft_rank = rank_order(pool.draft_logp[None], pool.depth[None])[0]
    s = scored_set(state.root, pool.token, pool.parent, pool.depth, pool.expanded, tree, draft_rank,
                   config.extra, state.context_len)
    mask = attention_mask(s.ancestors, state.context_len)
    with timer.span("target"):
        logits, hidden = target.forward(s.input_ids, s.position_ids, mask, state.cache, drafter.hidden_layers)
    logp = torch.log_softmax(logits / config.row_temperature, -1)  # (n, V)
    rows = state.caches.read(len(state.records), state.root, pool.token[: config.shape.topk], logp[0])
    accepted, continuation = verifier.verify(verify_tree(pool, s), logits[: s.n_tree + 1], state.generator)
    emitted = emitted_node(pool, accepted, continuation)
    record = round_record(state, pool, logp, s, accepted, continuation, emitted, draft_rank, rows)
    keep = np.concatenate([[0], s.row_of[accepted]])  # pass rows of the root + accepted path
    committed = np.concatenate([[state.root], pool.token[accepted]])
    commit(target, drafter, state, torch.from_numpy(keep), torch.from_numpy(committed), hidden, timer)
    retain(state, pool, ranked_tree(score, pool.depth, tree), s, logp, int(keep[-1]), continuation, emitted)
    state.output += [int(x) for x in pool.token[accepted]] + [continuation]
    state.root = continuation
    state.records.append(record)
    return record


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
                  verifier: Verifier | None = None, select: ScoreFn = draft_score, timer: Timer | None = None):
    """Decode one prompt; return (output token ids, list of round records)."""
    timer = timer or Timer()
    verifier = verifier or ExhaustiveVerifier(config.temperature)
    eos = eos_token_ids(target)
    with timer.span("total"):
        state = start_prompt(target, drafter, prompt_ids, config, prompt_id, timer)
        while not is_finished(state, eos, config):
            record = decode_round(target, drafter, state, config, verifier, select, timer)
            record.update(prompt_id=prompt_id, task=task)
            timer.rounds += 1
            timer.tokens += record["accepted"] + 1
    return final_output(state.output, eos, config.max_new_tokens), state.records
