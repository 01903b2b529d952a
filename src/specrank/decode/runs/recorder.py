"""The recorder: every round's pool with the exact target probability of every pool edge and the retained
rows read at its first-level candidates (docs/design.md, one round and retained rows), written shard by shard into a run
directory."""

from __future__ import annotations

import numpy as np
import torch

from specrank.decode.config import DecodeConfig
from specrank.decode.engine.pool import DraftPool
from specrank.decode.engine.prompt import decode_prompt
from specrank.decode.engine.timer import Timer
from specrank.decode.prompts import encode_prompts
from specrank.decode.runs.shards import open_run_dir, record_shards
from specrank.decode.runs.tables import rounds_table
from specrank.selection.select import rank_positions


def edge_probs(logp_of, pool: DraftPool, row_of: np.ndarray):
    """(p_edge (M,), p_argmax_child (M,), the root row's log-probabilities (V,)) from each candidate's parent
    row; ``logp_of(rows)`` gives log-probabilities of pass rows (only the root's and the parents' are asked)."""
    par_row = np.where(pool.parent < 0, 0, row_of[np.maximum(pool.parent, 0)])  # (M,)
    scored = par_row >= 0
    needed = np.unique(np.concatenate([[0], par_row[scored]]))  # the root row first
    logp = logp_of(needed)  # (k, V)
    at = torch.from_numpy(np.searchsorted(needed, np.maximum(par_row, 0))).to(logp.device)
    tokens = torch.from_numpy(pool.token).to(logp.device)
    p = logp[at, tokens].exp().cpu().numpy()
    argmax = (logp.argmax(-1)[at] == tokens).cpu().numpy()
    p_edge = np.where(scored, p, np.nan).astype(np.float32)
    return p_edge, np.where(scored, argmax, 0).astype(np.int8), logp[0]


def round_record(state, pool, logp_of, s, accepted, continuation, emitted, draft_rank, rows) -> dict:
    """The ``rounds`` row of one round (columns of ``specrank.schema``); ``logp_of(rows)``: log-probabilities of
    pass rows; ``rows``: the row caches' read-out."""
    p_edge, p_argmax, root_logp = edge_probs(logp_of, pool, s.row_of)
    root_p = root_logp.exp()
    argmax = int(root_logp.argmax())
    rank_of = rank_positions(draft_rank[None])[0]
    record = {
        "round": state.rounds,
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


def record_prompt(target, drafter, prompt_ids, config: DecodeConfig, prompt_id: str = "0", task: str = "",
                  verifier=None, timer: Timer | None = None, select=None) -> tuple[list, list]:
    """Record one prompt: (output token ids, round records). Rounds select top-B under ``select``
    (``pool -> (M,)`` score; default: draft selection) and score every pool edge."""
    from specrank.decode.runs.measure import Measure
    from specrank.decode.strategies import DraftSelection, ScoreSelection

    strategy = DraftSelection() if select is None else ScoreSelection(select)
    return decode_prompt(target, drafter, prompt_ids, config, strategy, verifier=verifier,
                         observer=Measure(record=True), prompt_id=prompt_id, task=task, timer=timer)


def recorder_work(target, drafter, prompts, config: DecodeConfig, verifier=None, timer: Timer | None = None):
    """``(decode_one, tables)`` of the shard writer (``runs.shards.record_shards``) recording ``prompts``;
    every prompt is encoded (and checked against the context) first, so a bad one fails before any output."""
    encoded = encode_prompts(target, prompts, config)

    def decode_one(i):
        _, records = record_prompt(target, drafter, encoded[i], config, prompts[i].prompt_id, prompts[i].task,
                                   verifier, timer)
        return {"rounds": records}

    tables = {"rounds": lambda parts: rounds_table([r for p in parts for r in p], config.shape.size, config.shape.topk)}
    return decode_one, tables


def record_run(target, drafter, prompts, out_dir, config: DecodeConfig, manifest: dict, shard_size: int = 4,
               verifier=None, progress: bool = True) -> Timer:
    """Record ``prompts`` into ``out_dir`` shard by shard, skipping finished ones; return the timer."""
    timer = Timer()
    decode_one, tables = recorder_work(target, drafter, prompts, config, verifier, timer)
    out = open_run_dir(out_dir, manifest)

    def postfix():
        return {"rounds": timer.rounds, "accepted": f"{(timer.tokens / max(timer.rounds, 1)) - 1:.2f}",
                "tok_s": f"{timer.tokens / max(timer.total, 1e-9):.1f}"}

    record_shards(out, len(prompts), shard_size, decode_one, tables, progress=progress, postfix=postfix)
    return timer
