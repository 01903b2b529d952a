"""Retained target rows (SPEC §4): full-address, token-keyed, same-token and preceding rows.

Rows are full-vocabulary log-probabilities (V,) at the recording temperature. Only what
later stages need is read out each round (values at the first-level candidates, ages,
counts, agreement with the root row); the rows themselves never leave this object.
"""

from __future__ import annotations

import numpy as np
import torch


class TokenRows:
    """Token-keyed row store: one row per token, overwritten by later stores.

    Rows live in fixed-size blocks, so growing never copies what is stored (peak memory
    stays at what the distinct tokens need).
    """

    def __init__(self, vocab_size: int, block: int = 256):
        self.vocab_size, self.block = vocab_size, block
        self.slot_of = np.full(vocab_size, -1, dtype=np.int64)  # token -> slot
        self.round_of = np.zeros(0, dtype=np.int64)  # slot -> round stored
        self.blocks: list[torch.Tensor] = []  # each (block, V)
        self.count = 0

    def put(self, tokens: np.ndarray, rows: torch.Tensor, round_: int) -> None:
        """Store ``rows`` (n, V) under distinct ``tokens`` (n,)."""
        new = tokens[self.slot_of[tokens] < 0]
        self.slot_of[new] = self.count + np.arange(len(new))
        self.count += len(new)
        while len(self.blocks) * self.block < self.count:
            self.blocks.append(torch.empty(self.block, self.vocab_size))
        self.round_of = np.concatenate([self.round_of, np.zeros(self.count - len(self.round_of), np.int64)])
        slots = self.slot_of[tokens]
        self.round_of[slots] = round_
        for b in np.unique(slots // self.block):  # one or two blocks per store
            on = slots // self.block == b
            self.blocks[b][torch.from_numpy(slots[on] % self.block)] = rows[torch.from_numpy(on)].float()

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


def tv_and_agree(row: torch.Tensor | None, root: torch.Tensor) -> tuple[float, float]:
    """Total variation and argmax agreement of two log-prob rows in float32 softmax probabilities."""
    if row is None:
        return float("nan"), float("nan")
    p, q = row.float().exp(), root.float().exp()
    return 0.5 * float((p - q).abs().sum()), float(row.argmax() == root.argmax())


def _at(row: torch.Tensor | None, tokens: np.ndarray) -> np.ndarray:
    if row is None:
        return np.full(len(tokens), np.nan, dtype=np.float32)
    return row[torch.from_numpy(tokens.astype(np.int64))].float().numpy()


class RowCaches:
    """The retained rows of one prompt's decode, updated after and read before each round."""

    def __init__(self, vocab_size: int):
        self.token_rows = TokenRows(vocab_size)
        self.matched = None  # row at the previous emitted address, when the pass scored it
        self.same_token = None
        self.preceding = None
        self.prev_tree_count = -1

    def seed(self, prompt_tokens: np.ndarray, rows: torch.Tensor) -> None:
        """Before round 0: ``rows[i]`` (L, V) is the row after ``prompt_tokens[:i+1]``; keep latest occurrences."""
        idx = latest_unique(prompt_tokens)
        self.token_rows.put(prompt_tokens[idx], rows[torch.from_numpy(idx)], -1)

    def read(self, round_: int, root_token: int, first_tokens: np.ndarray, root_row: torch.Tensor) -> dict:
        """Retained-row columns of ``specrank.schema`` at this round's first-level candidates."""
        cache_row, stored = self.token_rows.get(root_token)
        preceding = _at(self.preceding, first_tokens)
        preceding[first_tokens == root_token] = np.nan  # the continuation's entry was zeroed
        matched_tv, matched_agree = tv_and_agree(self.matched, root_row)
        token_tv, token_agree = tv_and_agree(cache_row, root_row)
        return {
            "cache_logp": _at(cache_row, first_tokens),
            "same_token_logp": _at(self.same_token, first_tokens),
            "preceding_logp": preceding,
            "cache_age": round_ - stored if cache_row is not None else -1,
            "prev_tree_root_token_count": self.prev_tree_count,
            "matched_tv": matched_tv,
            "matched_argmax_agree": matched_agree,
            "token_tv": token_tv,
            "token_argmax_agree": token_agree,
        }

    def update(
        self,
        round_: int,
        root_token: int,
        root_row: torch.Tensor,
        tree_tokens: np.ndarray,
        tree_rows: torch.Tensor,
        last_accepted_row: torch.Tensor,
        continuation: int,
        emitted_row: torch.Tensor | None,
    ) -> None:
        """After a round. ``tree_tokens`` (B,) and ``tree_rows`` (B, V) in rank order (best first)."""
        self.matched = None if emitted_row is None else emitted_row.clone()
        hits = np.flatnonzero(tree_tokens == continuation)
        if root_token == continuation:
            self.same_token = root_row.clone()
        else:
            self.same_token = tree_rows[hits[0]].clone() if len(hits) else None
        self.prev_tree_count = len(hits) + int(root_token == continuation)
        self.preceding = last_accepted_row.clone()
        self.preceding[continuation] = -float("inf")
        idx = first_unique(tree_tokens)  # highest-ranked prefix wins per token
        self.token_rows.put(tree_tokens[idx], tree_rows[torch.from_numpy(idx)], round_)
        self.token_rows.put(np.array([root_token]), root_row[None], round_)
