"""Chain speculative decoding with a one-position verification rule (lossy verification, arXiv 2607.26627, §2.1, §3).

A round: the drafter samples a chain of G tokens from its own rows at temperature T (argmax at 0);
the target scores root + chain in one causal pass; the rule accepts position by position and, at the
first rejection, draws the continuation from its residual (after a fully accepted chain, from the
bonus row: the target, truncated for truncation rules). Root + accepted tokens are committed.

A chain is recorded as a pool of shape ``PoolShape(topk=1, depth=G, expand=1)`` (node j's parent is
node j - 1), so its ``rounds`` rows keep the schema; the emission diagnostics of every position go to
separate rows (``specrank.decode.verify.lossy.emission``).
"""

from __future__ import annotations

import numpy as np
import torch

from specrank.decode.config import DecodeConfig
from specrank.decode.core import DraftPool, PoolShape
from specrank.decode.engine.prompt import iter_rounds, run_rounds
from specrank.decode.engine.round import PromptState, commit_round, ranked_tree, retain
from specrank.decode.engine.timer import Timer
from specrank.decode.engine.tree import attention_mask, scored_set
from specrank.decode.runs.records import round_record
from specrank.decode.verify.lossy.chain import verify_chain
from specrank.decode.verify.lossy.emission import emission_diagnostics, target_probs
from specrank.law import Law


def tempered_log_probs(logp: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probabilities at ``temperature`` from ones at 1; the argmax point mass (0 / -inf) at 0."""
    if Law(temperature).greedy:
        return torch.full_like(logp, float("-inf")).scatter_(-1, logp.argmax(-1, keepdim=True), 0.0)
    return torch.log_softmax(logp / temperature, dim=-1)


def draft_chain(drafter, root_token: int, length: int, temperature: float, generator=None):
    """Sample ``length`` tokens below ``root_token``, each from the drafter's row at ``temperature`` (its argmax
    at 0), through the hooks every :class:`~specrank.decode.core.Drafter` implements: (tokens (G,) int64,
    rows (G, V) float32 over the target vocabulary). The drafter's cache is left at the committed context."""
    step = drafter._draft_root(int(root_token))
    try:
        logp, past, tokens, rows = step.logp, step.visible, [], []
        feed = None if step.feed is None else step.feed[None]  # (1, F) for EAGLE-3 heads
        for k in range(length):  # one drafter forward per chain token but the last
            row = drafter._root_row(tempered_log_probs(logp, temperature)).cpu()  # (V,)
            tokens.append(int(torch.multinomial(row.double(), 1, generator=generator)))
            rows.append(row)
            if k + 1 < length:
                position = torch.tensor([step.position + k + 1])
                out, feed = drafter._draft_step(torch.tensor([tokens[-1]]), position, torch.zeros(1, past + 1), feed)
                logp, past = out[0], past + 1
        return np.array(tokens, dtype=np.int64), torch.stack(rows)
    finally:
        drafter._rewind()


class ChainConfigError(ValueError):
    """A chain decode was asked with a pool shape that is not a chain."""


def chain_config(length: int, temperature: float = 0.0, max_new_tokens: int = 256, seed: int = 0) -> DecodeConfig:
    """The decode configuration of chains of ``length`` drafted tokens."""
    if not isinstance(length, int) or length < 1:
        raise ChainConfigError(f"chain length must be a positive integer, got {length!r}")
    return DecodeConfig(PoolShape(1, length, 1), budget=length, extra=0, temperature=temperature,
                        max_new_tokens=max_new_tokens, seed=seed)


def chain_length(config: DecodeConfig) -> int:
    """G, refusing configurations whose pool is not a chain."""
    shape = config.shape
    if shape.topk != 1 or shape.expand != 1 or config.budget != shape.depth:
        raise ChainConfigError(f"chain decoding needs PoolShape(1, G, 1) and budget G, got {shape}, B={config.budget}")
    return shape.depth


def chain_pool(tokens: np.ndarray, q_edge: np.ndarray, q_root: np.ndarray) -> DraftPool:
    """A drafted chain (G,) as a pool: node j hangs from node j - 1."""
    g = len(tokens)
    logq = np.log(np.maximum(q_edge, np.finfo(np.float32).tiny)).astype(np.float32)
    return DraftPool(tokens.astype(np.int64), np.arange(-1, g - 1), np.arange(1, g + 1), q_edge.astype(np.float32),
                     np.cumsum(logq).astype(np.float32), np.zeros(g, bool), q_root, np.zeros(g, np.int64))


def bonus_row(rule, p: torch.Tensor) -> torch.Tensor:
    """Law of the token after a fully accepted chain: the rule's (truncated) target."""
    return rule.truncated_target(p) if hasattr(rule, "truncated_target") else p


def chain_diagnostics(rule, p: torch.Tensor, q: torch.Tensor, accepted: int) -> dict:
    """Exact emission law of each emitted position 0..A vs the target rows (and ``p_A``)."""
    g = q.shape[0]
    k = min(accepted + 1, g)
    emission = rule.induced(p[:k], q[:k])  # (k, V)
    acceptance = rule.acceptance(p[:k], q[:k]).numpy()
    if accepted == g:  # the bonus position emits the bonus row exactly
        emission = torch.cat([emission, bonus_row(rule, p[g:])])
        acceptance = np.append(acceptance, np.nan)
    rows = p[: len(emission)]
    truncated = rule.truncated_target(rows) if hasattr(rule, "truncated_target") else None
    return {"acceptance": acceptance, "expected_accepted": np.nan,
            **emission_diagnostics(emission, rows, truncated, getattr(rule, "ell", None))}


def chain_round(target, drafter, state: PromptState, config: DecodeConfig, rule, timer: Timer):
    """One round: draft a chain, score it, verify it with ``rule``, commit; (tokens, (rounds record, diagnostics))."""
    g = chain_length(config)
    with timer.span("draft"):
        tokens, q_rows = draft_chain(drafter, state.root, g, config.temperature, state.generator)  # (G,), (G, V)
    q = q_rows.double()
    q = q / q.sum(-1, keepdim=True)  # float32 rows summed in float64
    pool = chain_pool(tokens, q[torch.arange(g), torch.from_numpy(tokens)].numpy(), q_rows[0].numpy())
    order, everything = np.arange(g), np.ones(g, bool)
    s = scored_set(state.root, pool.token, pool.parent, pool.depth, pool.expanded, everything, order, 0,
                   state.context_len)
    with timer.span("target"):
        logits, hidden = target.forward(s.input_ids, s.position_ids, attention_mask(s.ancestors, state.context_len),
                                        state.cache, drafter.hidden_layers)
    p = target_probs(logits, config.temperature)  # (G + 1, V)
    rows = torch.cat([p[:g], bonus_row(rule, p[g:])])
    count, token = verify_chain(rule, torch.from_numpy(pool.token)[None], rows[None], q[None], state.generator)
    accepted, continuation = order[: int(count)], int(token)
    logp = torch.log_softmax(logits / config.row_temperature, -1)  # (G + 1, V)
    cached = state.caches.read(state.rounds, state.root, pool.token[:1], logp[0])
    emitted = int(len(accepted)) if len(accepted) < g and pool.token[len(accepted)] == continuation else -1
    record = round_record(state, pool, lambda rows: logp[torch.from_numpy(rows)], s, accepted, continuation, emitted,
                          order, cached)
    record.update(prompt_id=state.prompt_id, task=state.task)
    diagnostics = chain_diagnostics(rule, p, q, len(accepted))
    diagnostics.update(token=np.append(pool.token[accepted], continuation),
                       accepted=np.arange(len(accepted) + 1) < len(accepted))
    rows = np.arange(1, len(accepted) + 1)  # pass rows of the accepted chain
    commit_round(target, drafter, state, pool.token[accepted], rows, -1, False, True, hidden, timer)
    retain(state, pool, s, logits, accepted, continuation, emitted, ranked_tree(pool.draft_logp, pool.depth, everything))
    state.output += [int(x) for x in pool.token[accepted]] + [continuation]
    state.root = continuation
    state.rounds += 1
    return len(accepted) + 1, (record, diagnostics)


def decode_chain_prompt(target, drafter, prompt_ids, config: DecodeConfig, rule, prompt_id: str = "0",
                        task: str = "", timer: Timer | None = None):
    """Decode one prompt with chains; (output ids, rounds records, per-round diagnostics)."""
    chain_length(config)
    timer = timer or Timer()
    rounds = iter_rounds(target, drafter, prompt_ids, config, lambda state: chain_round(
        target, drafter, state, config, rule, timer), prompt_id=prompt_id, task=task, timer=timer, with_rows=True)
    output, pairs = run_rounds(rounds)
    return output, [r for r, _ in pairs], [d for _, d in pairs]
