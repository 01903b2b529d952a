"""Retained target rows (docs/design.md, retained rows): full-address, token-keyed, same-token and preceding rows.

Rows are stored as the pass returned them (logits), each with its log-normalizer at the recording
temperature, ``logsumexp(row / T)``, computed once, the first time the row is read (a round stores
one row per verified prefix but reads at most three, so normalizing at read time does the least
work; a token-keyed row read again reuses its normalizer). A read takes only the first-level
candidates' entries, ``row[x] / T - normalizer``, on the rows' device, and copies one (3, topk)
block to the host: no full-vocabulary log-softmax per round. The recorder reads through the same
arithmetic, so recorded and online features agree bit for bit. Only what later stages need is read
out each round (values at the first-level candidates, ages, counts, agreement with the root row).
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
        self.norms: list[torch.Tensor] = []  # each (block,) float32 log-normalizers, valid where ``normed``
        self.normed = np.zeros(0, dtype=bool)  # slot -> normalizer computed since the row was stored
        self.count = 0

    def put(self, tokens: np.ndarray, rows: torch.Tensor, round_: int, index: np.ndarray | None = None) -> None:
        """Store ``rows[index]`` (n, V) (every row without ``index``) under distinct ``tokens`` (n,)."""
        index = np.arange(len(tokens)) if index is None else np.asarray(index, dtype=np.int64)
        new = tokens[self.slot_of[tokens] < 0]
        self.slot_of[new] = self.count + np.arange(len(new))
        self.count += len(new)
        while len(self.blocks) * self.block < self.count:
            self.blocks.append(torch.empty(self.block, self.vocab_size, dtype=rows.dtype, device=rows.device))
            self.norms.append(torch.empty(self.block, dtype=torch.float32, device=rows.device))
        grow = self.count - len(self.round_of)
        self.round_of = np.concatenate([self.round_of, np.zeros(grow, np.int64)])
        self.normed = np.concatenate([self.normed, np.zeros(grow, bool)])
        slots = self.slot_of[tokens]
        self.round_of[slots] = round_
        self.normed[slots] = False
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

    def normalizer(self, token: int, temperature: float) -> torch.Tensor:
        """() log-normalizer of ``token``'s stored row, computed on its first read after the store."""
        slot = int(self.slot_of[token])
        b, i = divmod(slot, self.block)
        if not self.normed[slot]:
            self.norms[b][i] = log_normalizer(self.blocks[b][i], temperature)
            self.normed[slot] = True
        return self.norms[b][i]


def log_normalizer(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """() ``logsumexp(row / T)`` in float32: log-probabilities are ``row / T - log_normalizer``."""
    return torch.logsumexp(row.float() / temperature, -1)


class Retained:
    """A retained row (V,) logits and its log-normalizer, computed on first read."""

    __slots__ = ("row", "temperature", "_norm")

    def __init__(self, row: torch.Tensor, temperature: float, norm: torch.Tensor | None = None):
        self.row, self.temperature, self._norm = row, temperature, norm

    def norm(self) -> torch.Tensor:
        if self._norm is None:
            self._norm = log_normalizer(self.row, self.temperature)
        return self._norm

    def at(self, index: torch.Tensor) -> torch.Tensor:
        """(k,) log-probabilities at ``index`` (k,), on the row's device."""
        return self.row[index].float() / self.temperature - self.norm()

    def logp(self) -> torch.Tensor:
        """(V,) the whole row as log-probabilities (diagnostics only)."""
        return self.row.float() / self.temperature - self.norm()


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


class RowCaches:
    """The retained rows of one prompt's decode, updated after and read before each round.

    Rows go in as logits (V,); they are read as log-probabilities at ``temperature``.
    """

    def __init__(self, vocab_size: int, temperature: float = 1.0):
        self.temperature = temperature
        self.token_rows = TokenRows(vocab_size)
        self.matched: Retained | None = None  # row at the previous emitted address, when the pass scored it
        self.same_token: Retained | None = None
        self.preceding: Retained | None = None  # the last accepted node's row; ``continuation``'s entry is zeroed
        self.continuation = -1
        self.prev_tree_count = -1

    def retained(self, row: torch.Tensor | None) -> Retained | None:
        return None if row is None else Retained(row, self.temperature)

    def seed(self, prompt_tokens: np.ndarray, rows: torch.Tensor) -> None:
        """Before round 0: ``rows[i]`` (L, V) is the row after ``prompt_tokens[:i+1]``; keep latest occurrences."""
        idx = latest_unique(prompt_tokens)
        self.token_rows.put(prompt_tokens[idx], rows, -1, idx)

    def read(self, round_: int, root_token: int, first_tokens: np.ndarray, root_row: torch.Tensor | None = None) -> dict:
        """Retained-row columns of ``specrank.schema`` at this round's first-level candidates; the diagnostics
        against ``root_row`` (log-probabilities) are NaN without it (before verification, when a reranker reads
        the rows)."""
        stored, when = self.token_rows.get(root_token)
        cache = None if stored is None else Retained(stored, self.temperature,
                                                     self.token_rows.normalizer(root_token, self.temperature))
        block = self.entries((cache, self.same_token, self.preceding), first_tokens)  # (3, K)
        preceding = block[2]
        if self.preceding is not None:
            preceding[first_tokens == self.continuation] = -np.inf  # the continuation's entry is zeroed
            preceding[first_tokens == root_token] = np.nan  # ... and missing (the root is that continuation)
        matched = self.matched.logp() if self.matched is not None and root_row is not None else None
        matched_tv, matched_agree = tv_and_agree(matched, root_row)
        token_tv, token_agree = tv_and_agree(None if cache is None or root_row is None else cache.logp(), root_row)
        return {
            "cache_logp": block[0],
            "same_token_logp": block[1],
            "preceding_logp": preceding,
            "cache_age": round_ - when if stored is not None else -1,
            "prev_tree_root_token_count": self.prev_tree_count,
            "matched_tv": matched_tv,
            "matched_argmax_agree": matched_agree,
            "token_tv": token_tv,
            "token_argmax_agree": token_agree,
        }

    def entries(self, rows, tokens: np.ndarray) -> np.ndarray:
        """(len(rows), K) float32 log-probabilities of ``rows`` (Retained or None: NaN) at ``tokens`` (K,):
        gathered on the rows' device, one copy to the host."""
        present = [i for i, r in enumerate(rows) if r is not None]
        out = np.full((len(rows), len(tokens)), np.nan, np.float32)
        if present:
            device = rows[present[0]].row.device
            index = torch.from_numpy(np.asarray(tokens, dtype=np.int64)).to(device)
            out[present] = torch.stack([rows[i].at(index) for i in present]).cpu().numpy()
        return out

    def update(self, round_: int, root_token: int, rows: torch.Tensor, root: int, tree_tokens: np.ndarray,
               tree: np.ndarray, last_accepted: int, continuation: int, emitted: int) -> None:
        """After a round: ``rows`` (n, V) are the pass's logits; ``root``, ``tree`` (B,) in rank order (best
        first), ``last_accepted`` and ``emitted`` (-1: not scored) index its rows; ``tree_tokens`` (B,)."""
        self.matched = None if emitted < 0 else self.retained(rows[emitted].clone())
        hits = np.flatnonzero(tree_tokens == continuation)
        if root_token == continuation:
            self.same_token = self.retained(rows[root].clone())
        else:
            self.same_token = self.retained(rows[int(tree[hits[0]])].clone()) if len(hits) else None
        self.prev_tree_count = len(hits) + int(root_token == continuation)
        self.preceding, self.continuation = self.retained(rows[last_accepted].clone()), continuation
        idx = first_unique(tree_tokens)  # highest-ranked prefix wins per token
        self.token_rows.put(tree_tokens[idx], rows, round_, tree[idx])
        self.token_rows.put(np.array([root_token]), rows, round_, np.array([root]))
