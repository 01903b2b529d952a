"""A request's retained rows as the plugin keeps them on the CPU: ``decode.engine.caches.RowCaches``' rows and reads,
bit for bit, without its full-vocabulary temporaries.

``RowCaches`` normalizes a (3, V) block after every round (the cache, same-token and preceding rows stacked, scaled,
``logsumexp``, subtracted) and reads it at the next round's candidates. Each of those tensors is a new allocation of
a few hundred KB, and on a host the first touch of new memory costs a page fault per 4 KB, more than the arithmetic
(inside SGLang's process, whose forward passes evict the caches, more again); the block's subtraction touches V
entries a row of which a round reads topk. Here a round normalizes only the distinct rows it reads, in a scratch
block the rescorer owns (``Scratch``), and a read subtracts at the candidates alone. The values equal
``RowCaches``': ``torch.logsumexp`` of a row does not depend on the rows stacked with it, provided two rows at least
are reduced at once (a single row's sum is split across threads, in another order), and the scaling and
subtraction are elementwise IEEE operations (``tests/test_engine_sglang.py`` compares the two).

The same-token row is the token-keyed row the same update stored under the continuation (read in place, not
copied); the preceding row is copied into a row of the request's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specrank.decode.engine.caches import RowCaches, TokenRows, stored_rows


class Scratch:
    """A (3, V) float32 block the rescorer's requests normalize their rows in, one request at a time (SGLang retains
    and rescores its batch's requests in turn); allocated once, so no round touches new memory."""

    def __init__(self, vocab_size: int):
        self.block = torch.empty(3, vocab_size, dtype=torch.float32)

    def log_normalizers(self, rows: list[torch.Tensor], temperature: float) -> np.ndarray:
        """(k,) float32 ``logsumexp(row / T)`` of each of ``rows`` (1 <= k <= 3), as ``torch.logsumexp`` computes
        it over their stack: its operations, in place (none: an empty array)."""
        if not rows:
            return np.zeros(0, np.float32)
        x = self.block[: len(rows)]
        for out, row in zip(x, rows):
            out.copy_(row)
        if temperature != 1.0:  # row / 1 is the row itself
            x.div_(temperature)
        top = torch.amax(x, -1, keepdim=True)
        shift = top.numpy()[:, 0]  # a view; k entries are cheaper in numpy than in three tensor calls
        shift[np.isinf(shift)] = 0.0  # logsumexp's guard: an infinite maximum is not subtracted
        x.sub_(top).exp_()
        # a sum with one output is split across threads (another order); two outputs are reduced row by row
        total = torch.sum(x if len(rows) > 1 else x.expand(2, -1), -1)[: len(rows)]
        return total.log_().add_(top[:, 0]).numpy()


class BlockPool:
    """Token-row blocks of requests SGLang no longer holds, reused by later requests: a request stores a few new rows a
    step, and the first write to new memory costs the host a page fault per 4 KB (at SmolLM2's vocabulary about
    70 us a row, ten times the row's copy), memory touched before none."""

    def __init__(self):
        self.free: list[torch.Tensor] = []

    def give(self, blocks: list[torch.Tensor]) -> None:
        self.free.extend(blocks)

    def take(self, rows: int, vocab_size: int, like: torch.Tensor) -> torch.Tensor:
        """A (rows, V) block for rows like ``like``: a free one, else a new one (a free one of another kind is let
        go)."""
        while self.free:
            block = self.free.pop()
            if block.shape == (rows, vocab_size) and block.dtype == like.dtype and block.device == like.device:
                return block
        return torch.empty(rows, vocab_size, dtype=like.dtype, device=like.device)


class PooledTokenRows(TokenRows):
    """``TokenRows`` whose blocks come from, and go back to, a ``BlockPool``."""

    def __init__(self, vocab_size: int, block: int, pool: BlockPool):
        super().__init__(vocab_size, block)
        self.pool = pool

    def new_block(self, like: torch.Tensor) -> torch.Tensor:
        return self.pool.take(self.block, self.vocab_size, like)


@dataclass
class Normalized:
    """What a read of ``root_token`` gathers from: the cache, same-token and preceding rows (None where absent) and
    each one's log-normalizer at the caches' temperature."""

    root_token: int
    stored: bool  # the root token has a token-keyed row
    stored_round: int
    rows: tuple  # (cache, same-token, preceding), each (V,) or None
    normalizer: np.ndarray  # (3,) float32, NaN where absent
    continuation: int  # the preceding row's zeroed entry

    def values(self, tokens: np.ndarray, temperature: float) -> np.ndarray:
        """(3, len(tokens)) float32 log-probabilities at ``tokens``, NaN where a row is absent, as ``RowCaches``' block
        holds them there: ``row / T - logsumexp(row / T)``, the preceding row's continuation entry zeroed and the
        root's missing."""
        out = np.full((3, len(tokens)), np.nan, np.float32)
        for i, row in enumerate(self.rows):
            if row is not None:
                v = entries(row, tokens)
                out[i] = (v if temperature == 1.0 else v / temperature) - self.normalizer[i]
        if self.rows[2] is not None:
            out[2, tokens == self.continuation] = -np.inf
            out[2, tokens == self.root_token] = np.nan
        return out


def entries(row: torch.Tensor, tokens: np.ndarray) -> np.ndarray:
    """float32 ``row[tokens]`` on the host (a float32 row is read through numpy's view of it)."""
    if row.dtype == torch.float32:
        return row.numpy()[tokens]
    return row[torch.from_numpy(tokens)].float().numpy()


class RetainedRows(RowCaches):
    """``RowCaches`` of CPU rows for the plugin: the same updates and reads (``gather``), the rows normalized in
    ``scratch``. No prompt rows (an engine's prefill keeps none) and no diagnostics (``read``'s need a verify row)."""

    def __init__(self, vocab_size: int, temperature: float, scratch: Scratch, pool: BlockPool, block: int):
        super().__init__(vocab_size, temperature)
        self.token_rows = PooledTokenRows(vocab_size, block, pool)
        self.scratch = scratch
        self.own_preceding: torch.Tensor | None = None  # (V,), allocated at the first update

    def release(self) -> None:
        """The request is gone: its token rows' blocks back to the pool (nothing here is read again)."""
        self.token_rows.pool.give(self.token_rows.blocks)
        self.token_rows.blocks, self.prepared = [], None

    def update(self, round_: int, root_token: int, rows: torch.Tensor, root: int, tree_tokens: np.ndarray,
               tree: np.ndarray, last_accepted: int, continuation: int, emitted: int) -> None:
        """``RowCaches.update``: the same rows kept, read the same way (``emitted`` is never scored here)."""
        hits = np.flatnonzero(tree_tokens == continuation)
        self.prev_tree_count = len(hits) + int(root_token == continuation)
        if self.own_preceding is None:
            self.own_preceding = torch.empty_like(rows[0])
        self.preceding, self.continuation = self.own_preceding.copy_(rows[last_accepted]), continuation
        tokens, index = stored_rows(root_token, root, tree_tokens, tree)
        self.token_rows.put(tokens, rows, round_, index)
        # RowCaches' same-token row (the root's when it is the continuation, else the highest-ranked verified node's
        # of that token) is the row just stored under the continuation
        held = root_token == continuation or len(hits) > 0
        self.same_token = self.token_rows.get(continuation)[0] if held else None
        self.prepare(continuation)

    def prepare(self, root_token: int) -> Normalized:
        """The normalized rows a read of ``root_token`` gathers from; a row read twice (the cache row is the
        same-token row whenever the latter is held) is normalized once."""
        stored, when = self.token_rows.get(root_token)
        rows = (stored, self.same_token, self.preceding)
        at = [None if row is None else row.data_ptr() for row in rows]
        distinct = list(dict.fromkeys(a for a in at if a is not None))
        computed = self.scratch.log_normalizers([rows[at.index(a)] for a in distinct], self.temperature)
        normalizer = np.array([np.nan if a is None else computed[distinct.index(a)] for a in at], np.float32)
        self.prepared = Normalized(int(root_token), stored is not None, when, rows, normalizer, self.continuation)
        return self.prepared

    def gather(self, round_: int, root_token: int, first_tokens: np.ndarray) -> tuple:
        """``RowCaches.gather`` at ``first_tokens`` (the first-level candidates): rows (3, n) float32 read at
        0..n-1, the cache age, the previous tree's count."""
        block = self.prepared
        if block is None or block.root_token != root_token:
            block = self.prepare(root_token)
        age = round_ - block.stored_round if block.stored else -1
        index = np.arange(len(first_tokens), dtype=np.int64)
        return block.values(first_tokens, self.temperature), index, age, self.prev_tree_count
