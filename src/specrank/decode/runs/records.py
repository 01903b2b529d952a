"""The ``rounds`` row of one round: the pool, the exact target probability of every scored edge and the
retained rows' read-out (columns of ``specrank.schema``)."""

from __future__ import annotations

import numpy as np
import torch

from specrank.decode.core import DraftPool
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
