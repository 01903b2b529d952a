"""Retained target rows (docs/design.md, retained rows): full-address, token-keyed, same-token and preceding rows.

Rows are stored as the pass returned them (logits). After each round, the three rows the next round's
features read (the token-keyed row of the next root token, the same-token row and the preceding row) are
turned into log-probabilities at the recording temperature at once, one (3, V) block on the rows' device
(``row / T - logsumexp(row / T)``, the preceding row's continuation entry zeroed). On a GPU the block is
then copied to page-locked host memory without waiting (about 1.5 MB at a 128k vocabulary, while the
next round drafts), so a read before verification indexes host memory, as on the CPU: no normalizer, no
full-vocabulary work and no device call inside the reranker's time (each device call costs the host tens
of microseconds, more than the features themselves). The recorder reads through the same
block, so recorded and online features agree bit for bit. Only what later stages need is read out each
round (values at the first-level candidates, ages, counts, agreement with the root row).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specrank.decode.core import to_device


class TokenRows:
    """Token-keyed row store: one row per token, overwritten by later stores.

    Rows live in fixed-size blocks on the rows' device, so growing never copies what is stored
    (peak memory stays at what the distinct tokens need). The prompt's rows, stored first, are kept as
    the prefill returned them, one read-only block of their own (an inference tensor: it cannot be written
    outside inference mode), so seeding copies nothing; a token stored again moves to a slot of its own.
    """

    def __init__(self, vocab_size: int, block: int = 256):
        self.vocab_size, self.block = vocab_size, block
        self.slot_of = np.full(vocab_size, -1, dtype=np.int64)  # token -> slot
        self.round_of = np.zeros(0, dtype=np.int64)  # slot -> round stored
        self.blocks: list[torch.Tensor] = []  # the adopted block (first, when there is one), then each (block, V)
        self.adopted = 0  # rows in the adopted block
        self.count = 0

    def adopt(self, tokens: np.ndarray, rows: torch.Tensor, round_: int) -> None:
        """Into an empty store: ``rows`` (n, V) under distinct ``tokens`` (n,), kept as they are (not copied)."""
        if self.count:
            raise RuntimeError("TokenRows.adopt: the store already holds rows")
        self.slot_of[tokens] = np.arange(len(tokens))
        self.round_of = np.full(len(tokens), round_, dtype=np.int64)
        self.blocks, self.adopted, self.count = [rows], len(tokens), len(tokens)

    def locate(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(block, offset) of each slot."""
        after = slots - self.adopted
        first = int(self.adopted > 0)
        block = np.where(after < 0, 0, first + after // self.block)
        return block, np.where(after < 0, slots, after % self.block)

    def put(self, tokens: np.ndarray, rows: torch.Tensor, round_: int, index: np.ndarray | None = None) -> None:
        """Store ``rows[index]`` (n, V) (every row without ``index``) under distinct ``tokens`` (n,)."""
        index = np.arange(len(tokens)) if index is None else np.asarray(index, dtype=np.int64)
        new = tokens[self.slot_of[tokens] < self.adopted]  # never stored, or only in the read-only prompt block
        self.slot_of[new] = self.count + np.arange(len(new))
        self.count += len(new)
        while self.adopted + (len(self.blocks) - int(self.adopted > 0)) * self.block < self.count:
            self.blocks.append(self.new_block(rows))
        if len(self.round_of) < self.count:
            self.round_of = np.concatenate([self.round_of, np.zeros(self.count - len(self.round_of), np.int64)])
        slots = self.slot_of[tokens]
        self.round_of[slots] = round_
        block, offset = self.locate(slots)
        for b in np.unique(block):  # one or two blocks per store
            on = block == b
            copy_rows(self.blocks[b], offset[on], rows, index[on])

    def new_block(self, like: torch.Tensor) -> torch.Tensor:
        """An empty (block, V) block for rows like ``like``."""
        return torch.empty(self.block, self.vocab_size, dtype=like.dtype, device=like.device)

    def get(self, token: int):
        """(row (V,), round stored) or (None, -1)."""
        slot = self.slot_of[token]
        if slot < 0:
            return None, -1
        block, offset = self.locate(np.array([slot]))
        return self.blocks[int(block[0])][int(offset[0])], int(self.round_of[slot])


def copy_rows(dest: torch.Tensor, at: np.ndarray, rows: torch.Tensor, index: np.ndarray) -> None:
    """``dest[at] = rows[index]``. On the CPU row by row: a gathered copy would be a new (n, V) tensor, and the
    host pays a page fault per 4 KB of a new tensor of a few MB, more than the copy; elsewhere one gather and one
    scatter (a kernel a row would cost more)."""
    if rows.device.type == "cpu":
        for a, i in zip(at.tolist(), index.tolist()):
            dest[a].copy_(rows[i])
        return
    src = to_device(torch.from_numpy(index), rows.device)
    dest.index_copy_(0, to_device(torch.from_numpy(at), rows.device), rows.index_select(0, src))


def log_probabilities(rows: torch.Tensor, temperature: float) -> torch.Tensor:
    """(n, V) float32 ``rows / T - logsumexp(rows / T)`` (a NaN row stays NaN)."""
    scaled = rows.float() / temperature
    return scaled.sub_(torch.logsumexp(scaled, -1, keepdim=True))  # in place: a block is built every round


@dataclass
class ReadBlock:
    """The rows one root token's read gathers from: (3, V) log-probabilities of the cache, same-token and
    preceding rows (NaN where absent), or None when all three are."""

    root_token: int
    stored: bool  # the root token has a token-keyed row
    stored_round: int  # the round it was stored (-1: the prompt)
    logp: torch.Tensor | None
    host: np.ndarray | None  # ``logp`` on the host (a read is one fancy index); on a GPU once ``ready``
    ready: torch.cuda.Event | None = None  # the host copy of a GPU block is complete once this has fired

    def host_rows(self) -> np.ndarray | None:
        """``host``, after its copy from the device has finished (by a read, it almost always has: the pool's
        own copy to the host comes later in the stream)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None
        return self.host


def host_copy(logp: torch.Tensor) -> tuple[np.ndarray, torch.cuda.Event | None]:
    """(``logp`` as numpy on the host, the event after which it holds the values). A CPU block is itself; a
    GPU block is copied into a new page-locked tensor without waiting (PyTorch's caching host allocator reuses
    freed ones, and a block still held by an earlier round's features is never overwritten)."""
    if logp.device.type != "cuda":
        return logp.numpy(), None
    host = torch.empty(logp.shape, dtype=logp.dtype, pin_memory=True)
    host.copy_(logp, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(logp.device))
    return host.numpy(), ready


def latest_unique(tokens: np.ndarray) -> np.ndarray:
    """Indices of the last occurrence of each distinct token."""
    _, first_in_reversed = np.unique(tokens[::-1], return_index=True)
    return len(tokens) - 1 - first_in_reversed


def prompt_positions(prompt_tokens: np.ndarray) -> np.ndarray:
    """(k,) increasing positions of the prompt whose rows the caches keep: each distinct token's latest
    occurrence (a prefill computes logits at these rows only)."""
    return np.sort(latest_unique(prompt_tokens))


def first_unique(tokens: np.ndarray) -> np.ndarray:
    """Indices of the first occurrence of each distinct token."""
    return np.unique(tokens, return_index=True)[1]


def stored_rows(root_token: int, root: int, tree_tokens: np.ndarray, tree: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, row indices) a round keeps under their tokens: each verified token's highest-ranked prefix
    (``tree_tokens``, ``tree`` in rank order), then the root's row, which wins over them all."""
    idx = first_unique(tree_tokens)
    idx = idx[tree_tokens[idx] != root_token]
    return np.append(tree_tokens[idx], root_token), np.append(tree[idx], root)


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
        self.matched: torch.Tensor | None = None  # row at the previous emitted address, when the pass scored it
        self.same_token: torch.Tensor | None = None
        self.preceding: torch.Tensor | None = None  # the last accepted node's row; ``continuation``'s entry is zeroed
        self.continuation = -1
        self.prev_tree_count = -1
        self.prepared: ReadBlock | None = None

    def seed(self, prompt_tokens: np.ndarray, rows: torch.Tensor, positions: np.ndarray | None = None) -> None:
        """Before round 0: ``rows[i]`` (k, V) is the row after ``prompt_tokens[:positions[i]+1]`` (``positions``:
        every position by default); keep each token's latest occurrence. Given exactly the latest occurrences
        (``prompt_positions``), as a prefill computes them, the rows are kept as they are, not copied."""
        positions = np.arange(len(prompt_tokens)) if positions is None else np.asarray(positions, dtype=np.int64)
        tokens = prompt_tokens[positions]
        latest = latest_unique(tokens)
        if len(latest) == len(positions) and not self.token_rows.count:
            self.token_rows.adopt(tokens, rows, -1)
        else:
            self.token_rows.put(tokens[latest], rows, -1, latest)
        self.prepared = None

    def prepare(self, root_token: int) -> ReadBlock:
        """The read block of ``root_token`` (built after each round for the next root, here otherwise)."""
        stored, when = self.token_rows.get(root_token)
        sources = (stored, self.same_token, self.preceding)
        like = next((r for r in sources if r is not None), None)
        logp = host = None
        if like is not None:
            missing = like.new_full(like.shape, float("nan"))
            logp = log_probabilities(torch.stack([missing if r is None else r for r in sources]), self.temperature)
            if self.preceding is not None:
                logp[2, self.continuation] = -torch.inf  # the continuation's entry is zeroed
                logp[2, root_token] = torch.nan  # ... and missing (the root is that continuation)
        host, ready = (None, None) if logp is None else host_copy(logp)
        self.prepared = ReadBlock(int(root_token), stored is not None, when, logp, host, ready)
        return self.prepared

    def gather(self, round_: int, root_token: int, first_tokens: np.ndarray) -> tuple:
        """What the features kernel reads of the rows at this round's first-level candidates (``featurize.
        RoundInputs``): (rows (3, R) float32, row_index int64, cache age, previous tree count). ``rows`` is the
        read block's host copy, indexed by ``first_tokens`` (nothing is copied here; a round passes its whole
        pool's tokens, of which the kernel reads the first topk, sparing a slice a round)."""
        block = self.prepared
        if block is None or block.root_token != root_token:
            block = self.prepare(root_token)
        age = round_ - block.stored_round if block.stored else -1
        if block.logp is None:
            index = np.arange(len(first_tokens), dtype=np.int64)
            return np.full((3, len(first_tokens)), np.nan, np.float32), index, age, self.prev_tree_count
        rows = block.host if block.ready is None else block.host_rows()  # no call once the copy is known done
        return rows, first_tokens, age, self.prev_tree_count

    def read(self, round_: int, root_token: int, first_tokens: np.ndarray, root_row: torch.Tensor | None = None) -> dict:
        """Retained-row columns of ``specrank.schema`` at this round's first-level candidates; the diagnostics
        against ``root_row`` (log-probabilities) are NaN without it (before verification, when a reranker reads
        the rows)."""
        rows, index, age, count = self.gather(round_, root_token, first_tokens)
        values = rows[:, index]
        block = self.prepared
        diagnose = root_row is not None
        matched = None if not diagnose or self.matched is None else log_probabilities(self.matched[None],
                                                                                       self.temperature)[0]
        cache = block.logp[0] if diagnose and block.stored else None
        matched_tv, matched_agree = tv_and_agree(matched, root_row)
        token_tv, token_agree = tv_and_agree(cache, root_row)
        return {
            "cache_logp": values[0],
            "same_token_logp": values[1],
            "preceding_logp": values[2],
            "cache_age": age,
            "prev_tree_root_token_count": count,
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
        self.preceding, self.continuation = rows[last_accepted].clone(), continuation
        tokens, index = stored_rows(root_token, root, tree_tokens, tree)
        self.token_rows.put(tokens, rows, round_, index)
        self.prepare(continuation)  # the next round's root
