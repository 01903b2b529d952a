"""One decoding round: grow the pool [while the root pass runs], select, one tree pass, verify, commit. No I/O.

The committed context ``c`` is every token whose KV is in the target's cache; the root is the
last emitted token, not yet cached (the last prompt token before round 0). A selection strategy
(``specrank.decode.strategies``) picks the tree and may ask for a root pass first, whose KV the
tree pass reuses (its inputs exclude the root; rows, positions and mask shift by one).

A round computes only what its strategy reads: the row caches (docs/design.md, retained rows) are kept only when the
strategy or an observer reads retained rows, and full-vocabulary log-probabilities only for the
rows stored there. An *observer* (the recorder, the online measurement; ``specrank.decode.runs``)
may add prefixes to the pass for measurement only and reads the round while its rows are in memory:

- ``scored_nodes(pool, state, config, ctx, root_known) -> (pool indices, score expanded nodes?)``;
- ``observe(view: RoundView) -> dict | None``, the round's record (timed as measurement);
- ``wants_rows``: whether it reads the row caches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from specrank.decode.config import DecodeConfig, prompt_seed
from specrank.decode.core import DraftPool, causal_mask, to_device
from specrank.decode.engine.caches import RowCaches, prompt_positions
from specrank.decode.engine.timer import Timer
from specrank.decode.engine.tree import ScoredSet, TreeError, attention_mask, scored_set
from specrank.decode.strategies.base import (
    RoundContext,
    SelectionStrategy,
    drawn_node,
    leaf_demotion,
    skips_tree_pass,
)
from specrank.decode.strategies.features import first_level_features, first_level_inputs
from specrank.decode.verify import Verifier, VerifyTree
from specrank.featurize.features import FEATURE_GROUPS
from specrank.selection.select import rank_order


@dataclass
class PromptState:
    """One prompt's decoding state between rounds."""

    prompt_ids: np.ndarray
    cache: object
    caches: RowCaches | None  # retained rows, kept only when something reads them
    generator: torch.Generator
    root: int
    context_len: int
    output: list = field(default_factory=list)
    rounds: int = 0
    prev_accepted: float = float("nan")  # accepted draft tokens of the previous round
    prompt_id: str = "0"
    task: str = ""
    root_logits: torch.Tensor | None = None  # (V,) when the root's KV is already cached (root pass, covering)
    root_hidden_state: torch.Tensor | None = None


@dataclass
class RoundView:
    """A finished round as an observer sees it, before the state moves on (rows still in memory)."""

    state: PromptState
    config: DecodeConfig
    pool: DraftPool
    strategy: SelectionStrategy  # what the round verifies
    acting: SelectionStrategy  # the strategy acting this round (``strategy.plan``)
    ctx: RoundContext
    tree: np.ndarray  # (M,) bool, the selected tree
    score: np.ndarray  # (M,) ranking score of the selection
    scored: ScoredSet
    logits: torch.Tensor  # (n, V) rows of the pass (the root's from the root pass when known)
    accepted: np.ndarray  # pool indices of the accepted path
    continuation: int
    emitted: int  # pool index of the emitted address, -1 when not in the pool
    drawn: int  # token drawn before selection, -1 without a draw
    skipped: bool  # the drawn token was emitted without a tree pass
    passes: int  # target passes of this round

    def logp_rows(self, rows) -> torch.Tensor:
        """Log-probabilities of pass ``rows`` (k, V) at the recording temperature, computed for those rows only
        (softmax is row by row: the same bits as the rows of the whole pass's log-softmax)."""
        index = torch.as_tensor(np.asarray(rows, dtype=np.int64)).to(self.logits.device)
        return torch.log_softmax(self.logits[index] / self.config.row_temperature, -1)


def start_prompt(target, drafter, prompt_ids, config: DecodeConfig, prompt_id: str, timer: Timer,
                 with_rows: bool) -> PromptState:
    """Prefill the target with the prompt but its last token (the first root); seed the row caches if kept."""
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    committed = ids[:-1]
    n = len(committed)
    cache = target.new_cache()
    kept = prompt_positions(committed.numpy()) if with_rows else ()  # the rows the caches keep, computed alone
    with timer.span("prefill"):
        logits, hidden = target.forward(committed, torch.arange(n), causal_mask(n, 0), cache, drafter.hidden_layers,
                                        logit_rows=kept)
    caches = None
    if with_rows:  # the prompt's rows are prompt work, like its pass: not a round's bookkeeping
        with timer.span("prefill"):
            caches = RowCaches(target.vocab_size, config.row_temperature)
            caches.seed(committed.numpy(), logits, kept)
            caches.prepare(int(ids[-1]))  # the first round's read block, as each round prepares the next's
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
    state.root_logits, state.root_hidden_state = logits[0], None if hidden is None else hidden[0]


def draft_phase(target, drafter, state: PromptState, config: DecodeConfig, acting: SelectionStrategy,
                timer: Timer) -> tuple[DraftPool, bool]:
    """The round's pool and, when the acting strategy needs the root row, the root pass, run between asking for
    the pool and taking it: hidden under drafting when the drafter works in its own process (``decode.pipeline``).
    The pool does not depend on the root row, so the order changes no value. Returns (pool, root known)."""
    root_known, root_window = state.root_logits is not None, None
    drafter.request_pool(state.root, config.shape)
    if acting.needs_root_pass and not root_known:
        root_pass(target, drafter, state, timer)
        root_known, root_window = True, timer.window
    with timer.span("draft"):
        pool = drafter.receive_pool()
    timer.add_drafting(drafter.draft_window, root_window)
    return pool, root_known


def once(fn):
    """``fn`` evaluated at most once (features are computed only when a strategy asks for them)."""
    return functools.lru_cache(maxsize=1)(fn)


def decode_round(target, drafter, state: PromptState, config: DecodeConfig, verifier: Verifier,
                 strategy: SelectionStrategy, timer: Timer, observer=None) -> tuple[int, dict | None]:
    """One round: grow the pool, a root pass if the strategy needs the root row, select, one tree pass
    (root + tree, plus an observer's prefixes), verify, commit. Returns (tokens emitted, the observer's record)."""
    root_known = state.root_logits is not None
    acting = strategy.plan(root_known)
    passes = timer.passes
    pool, root_known = draft_phase(target, drafter, state, config, acting, timer)
    drawn = acting.draw(state.root_logits, pool, verifier, state.generator) if acting.draws_first else -1
    node = drawn_node(pool, drawn, config.shape.topk) if acting.draws_first else -1
    features = once(lambda groups=FEATURE_GROUPS: first_level_features(state, pool, config, groups))
    inputs = once(lambda rows=True: first_level_inputs(state, pool, config, rows))
    ctx = RoundContext(config.budget, config.law, config.temperature, state.root_logits, node, features,
                       inputs=inputs, task=state.task)
    if acting.reranks:  # features plus inference; ranking the pool is bookkeeping, as for draft selection
        with timer.span("rerank"):
            ctx.first_factor = acting.first_factor(pool, ctx)
    tree, score = acting.select(pool, ctx)
    skip = skips_tree_pass(acting, tree, node)
    verified = np.zeros(len(pool), bool) if skip else tree
    order, with_expanded = observer.scored_nodes(pool, state, config, ctx, root_known) if observer else (
        np.zeros(0, np.int64), False)
    expanded = pool.expanded if with_expanded else np.zeros(len(pool), bool)
    s = scored_set(state.root, pool.token, pool.parent, pool.depth, expanded, verified, order, len(order),
                   state.context_len - int(root_known))
    logits, hidden = tree_pass(target, drafter, state, s, root_known, timer)
    if skip:
        accepted, continuation = np.zeros(0, np.int64), drawn
    else:
        first = drawn if acting.draws_first else None
        accepted, continuation = verifier.verify(verify_tree(pool, s), logits[: s.n_tree + 1], state.generator, first)
    carried = -1
    if strategy.carries_leaf_row and leaf_demotion(accepted, verified, pool.parent):
        carried, continuation, accepted = int(s.row_of[accepted[-1]]), int(pool.token[accepted[-1]]), accepted[:-1]
    emitted = emitted_node(pool, accepted, continuation)
    view = RoundView(state, config, pool, strategy, acting, ctx, tree, score, s, logits, accepted, continuation,
                     emitted, drawn, skip, timer.passes - passes)
    record = None
    if observer is not None:
        with timer.span("measure"):
            record = observer.observe(view)
    commit_round(target, drafter, state, pool.token[accepted], s.row_of[accepted], carried, root_known,
                 s.n > 1 or not root_known, hidden, timer)
    if state.caches is not None:
        retain(state, pool, s, logits, accepted, continuation, emitted, ranked_tree(score, pool.depth, verified))
    state.output += [int(x) for x in pool.token[accepted]] + [int(continuation)]
    state.root = int(continuation)
    state.root_logits = logits[carried] if carried >= 0 else None
    state.root_hidden_state = hidden[carried] if carried >= 0 and hidden is not None else None
    state.rounds += 1
    state.prev_accepted = float(len(accepted))
    return len(accepted) + 1, record


def tree_pass(target, drafter, state: PromptState, s: ScoredSet, root_known: bool, timer: Timer):
    """Logits (n, V) and hidden states of the scored set's rows, the root's from the root pass when known."""
    if s.n == 1 and root_known:  # nothing beyond the root to score
        hidden = None if state.root_hidden_state is None else state.root_hidden_state[None]
        return state.root_logits[None], hidden
    lo = int(root_known)  # the root's KV is cached: score rows 1.. only
    mask = attention_mask(s.ancestors, state.context_len - lo, device=target.device)[lo:]
    with timer.span("target"):
        logits, hidden = target.forward(s.input_ids[lo:], s.position_ids[lo:], mask, state.cache,
                                        drafter.hidden_layers)
    timer.passes += 1
    if root_known:
        logits = torch.cat([state.root_logits[None], logits])
        hidden = None if hidden is None else torch.cat([state.root_hidden_state[None], hidden])
    return logits, hidden


def verify_tree(pool: DraftPool, s: ScoredSet) -> VerifyTree:
    """The verified tree (pass rows 1..t) in the verifier's terms."""
    t = s.n_tree
    if (s.parent_row[1 : t + 1] > t).any():
        raise TreeError("verified tree is not ancestor-closed under the selection score")
    nodes = s.pool_index[1 : t + 1]
    return VerifyTree(pool.token[nodes], s.parent_row[1 : t + 1], nodes, pool.q_edge[nodes])


def emitted_node(pool: DraftPool, accepted: np.ndarray, continuation: int) -> int:
    """Pool index of the emitted address (accepted path + continuation), -1 when not in the pool."""
    last = accepted[-1] if len(accepted) else -1
    hit = np.flatnonzero((pool.parent == last) & (pool.token == continuation))
    return int(hit[0]) if len(hit) else -1


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
        path = None if hidden is None else to_device(torch.from_numpy(np.concatenate([[0], rows])), hidden.device)
        drafter.commit(committed, None if hidden is None else hidden[path])


def ranked_tree(score: np.ndarray, depth: np.ndarray, tree: np.ndarray) -> np.ndarray:
    """Pool indices of the verified tree, best-ranked first under ``score``."""
    order = rank_order(score[None], depth[None])[0]
    return order[tree[order]]


def retain(state: PromptState, pool: DraftPool, s: ScoredSet, logits: torch.Tensor, accepted: np.ndarray,
           continuation: int, emitted: int, tree_ranked: np.ndarray) -> None:
    """Update the row caches with this round's pass rows ``logits`` (docs/design.md, retained rows): the root row, the
    verified prefixes' rows (``tree_ranked``, best first), the last accepted node's and the emitted address's."""
    last_row = int(s.row_of[accepted[-1]]) if len(accepted) else 0
    emitted_row = int(s.row_of[emitted]) if emitted >= 0 else -1
    state.caches.update(state.rounds, state.root, logits, 0, pool.token[tree_ranked], s.row_of[tree_ranked], last_row,
                        continuation, emitted_row)
