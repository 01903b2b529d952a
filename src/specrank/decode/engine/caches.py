"""Retained target rows (SPEC §4): full-address, token-keyed, same-token and preceding rows.

Rows are stored as the pass returned them (logits) and turned into log-probabilities at the
recording temperature only when read: a round reads three rows, but stores one per verified
prefix. Softmax works row by row, so a row read here has the same bits as the same row of a
whole pass's log-softmax. Only what later stages need is read out each round (values at the
first-level candidates, ages, counts, agreement with the root row); the rows never leave.
"""

from __future__ import annotations

import numpy as np
import torch


class TokenRows:
    """Token-keyed row store: one row per token, overwritten by later stores.

    Rows live in fixed-size blocks on the rows' device, so growing never copies what is stored
    (peak memory stays at what the distinct tokens need).
    """

    def __init__(self, vocab_size: int, block: int = 256):
        self.vocab_size, self.block = vocab_size, block
        self.slot_of = np.full(vocab_size, -1, dtype=np.int64)  # token -> slot
        self.round_of = np.zeros(0, dtype=np.int64)  # slot -> round stored
        self.blocks: list[torch.Tensor] = []  # each (block, V)
        self.count = 0

    def put(self, tokens: np.ndarray, rows: torch.Tensor, round_: int, index: np.ndarray | None = None) -> None:
        """Store ``rows[index]`` (n, V) (every row without ``index``) under distinct ``tokens`` (n,)."""
        index = np.arange(len(tokens)) if index is None else np.asarray(index, dtype=np.int64)
        new = tokens[self.slot_of[tokens] < 0]
        self.slot_of[new] = self.count + np.arange(len(new))
        self.count += len(new)
        while len(self.blocks) * self.block < self.count:
            self.blocks.append(torch.empty(self.block, self.vocab_size, dtype=rows.dtype, device=rows.device))
        self.round_of = np.concatenate([self.round_of, np.zeros(self.count - len(self.round_of), np.int64)])
        slots = self.slot_of[tokens]
        self.round_of[slots] = round_
        for b in np.unique(slots // self.block):  # one or two blocks per store
            on = slots // self.block == b
            src = torch.from_numpy(index[on]).to(rows.device)
            self.blocks[b].index_copy_(0, torch.from_numpy(slots[on] % self.block).to(rows.device),
                                       rows.index_select(0, src))

    def get(self, token: int):
        """(row (V,), round stored) or (None, -1)."""
        slot = self.slot_of[token]
        if slot < 0:
            return None, -1
        return self.blocks[slot // self.block][slot % self.block], int(self.round_of[slot])


def latest_unique(tokens: np.ndarray) -> np.ndarray:
    """Indices of the last occurrence of each distinct token."""
    _, first_in_reversed = np.unique(tokens[::-1], return_index=True)
    return len(tokens) - 1 - first_in_reversed


def first_unique(tokens: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct token."""
    return np.unique(tokens, return_index=True)[1]


def tv_and_agree(row: torch.Tensor | None, root: torch.Tensor | None) -> tuple[float, float]:
    """Total variation and argmax agreement of two log-prob rows in float32 softmax probabilities."""
    if row is None or root is None:
        return float("nan"), float("nan")
    p, q = row.float().exp(), root.float().exp()
    return 0.5 * float((p - q).abs().sum()), float(row.argmax() == root.argmax())


def _at(row: torch.Tensor | None, tokens: np.ndarray) -> np.ndarray:
    if row is None:
        return np.full(len(tokens), np.nan, dtype=np.float32)
    return row[torch.from_numpy(tokens.astype(np.int64)).to(row.device)].float().cpu().numpy()


class RowCaches:
    """The retained rows of one prompt's decode, updated after and read before each round.

    Rows go in as logits (V,); they are read as log-probabilities at ``temperature``.
    """

    def __init__(self, vocab_size: int, temperature: float = 1.0):
        self.temperature = temperature
        self.token_rows = TokenRows(vocab_size)
        self.matched = None  # row at the previous emitted address, when the pass scored it
        self.same_token = None
        self.preceding = None  # (row, the continuation token, whose entry is zeroed)
        self.prev_tree_count = -1

    def logp(self, row: torch.Tensor | None) -> torch.Tensor | None:
        """A stored row as log-probabilities at the recording temperature."""
        return None if row is None else torch.log_softmax(row / self.temperature, -1)

    def seed(self, prompt_tokens: np.ndarray, rows: torch.Tensor) -> None:
        """Before round 0: ``rows[i]`` (L, V) is the row after ``prompt_tokens[:i+1]``; keep latest occurrences."""
        idx = latest_unique(prompt_tokens)
        self.token_rows.put(prompt_tokens[idx], rows, -1, idx)

    def read(self, round_: int, root_token: int, first_tokens: np.ndarray, root_row: torch.Tensor | None = None) -> dict:
        """Retained-row columns of ``specrank.schema`` at this round's first-level candidates; the diagnostics
        against ``root_row`` (log-probabilities) are NaN without it (before verification, when a reranker reads
        the rows)."""
        stored, when = self.token_rows.get(root_token)
        cache_row = self.logp(stored)
        preceding = np.full(len(first_tokens), np.nan, dtype=np.float32)
        if self.preceding is not None:
            row, zeroed = self.preceding
            preceding = _at(self.logp(row), first_tokens)
            preceding[first_tokens == zeroed] = -np.inf  # the continuation's entry is zeroed
            preceding[first_tokens == root_token] = np.nan  # ... and missing (the root is that continuation)
        matched_tv, matched_agree = tv_and_agree(self.logp(self.matched) if root_row is not None else None, root_row)
        token_tv, token_agree = tv_and_agree(cache_row, root_row)
        return {
            "cache_logp": _at(cache_row, first_tokens),
            "same_token_logp": _at(self.logp(self.same_token), first_tokens),
            "preceding_logp": preceding,
            "cache_age": round_ - when if stored is not None else -1,
            "prev_tree_root_token_count": self.prev_tree_count,
            "matched_tv": matched_tv,
            "matched_argmax_agree": matched_agree,
            "token_tv": token_tv,
            "token_argmax_agree": token_agree,
        }

    def update(self, round_: int, root_token: int, rows: torch.Tensor, root: int, tree_tokens: np.ndarray,
               tree: np.ndarray, last_accepted: int, continuation: int, emitted: int) -> None:
        """After a round: ``rows`` (n, V) are the pass's logits; ``root``, ``tree`` (B,) in rank order (best
        first), ``last_accepted`` and ``emitted`` (-1: not scored) index its rows; ``tree_tokens`` (B,)."""
        self.matched = None if emitted < 0 else rows[emitted].clone()
        hits = np.flatnonzero(tree_tokens == continuation)
        if root_token == continuation:
            self.same_token = rows[root].clone()
        else:
            self.same_token = rows[int(tree[hits[0]])].clone() if len(hits) else None
        self.prev_tree_count = len(hits) + int(root_token == continuation)
        self.preceding = (rows[last_accepted].clone(), continuation)
        idx = first_unique(tree_tokens)  # highest-ranked prefix wins per token
        self.token_rows.put(tree_tokens[idx], rows, round_, tree[idx])
        self.token_rows.put(np.array([root_token]), rows, round_, np.array([root]))
