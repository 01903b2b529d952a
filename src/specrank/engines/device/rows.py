"""A chain engine's retained target rows, per request, on the engine's device (docs/vllm.md, "Retained rows").

specrank's decoder keeps, per prompt (``decode.engine.caches.RowCaches``): a row per token (the row of every
verified prefix under its last token, the highest-ranked one winning, then the root's row under the root token),
the same-token row and the preceding row. An engine verifying a chain computes k + 1 target rows a step: the
root's and each drafted token's. ``DeviceRows`` keeps the same rows from them, as tensors with fixed shapes, so
an update and a read are a fixed, short list of tensor operations with no host read. Inside an engine each
operation costs far more than its arithmetic (the engine's forward pass has evicted the caches), so the layout
is chosen for few operations:

- ``store`` (S, R + m + 1, V): each request slot's rows as log-probabilities at the law's temperature
  (``log_probabilities``, computed once when a row arrives, so a read is one gather of b x 3 x K values): R
  token-keyed rows, then m places for the rows of the last verify pass it does not keep (m: the most rows a pass
  returns, k + 1), then a row of NaN, where every absent row points. Each row is written once: the same-token and
  preceding rows are the places of two of the last pass's rows, which stay until the next pass writes;
- ``slot_of`` (S, V + 1) token -> row (the NaN row: none), ``token_of`` and ``round_of`` (S, R + m + 1) row ->
  token and the step it was stored;
- ``state`` (S, 7) float64: each slot's scalars (``engines.device.state``), read and written as one row.

Memory: (S (R + m + 1) V) floats and about S (V + R) integers: 8 requests of 64 rows at SmolLM2's 49,152 tokens
hold about 115 MB in float32 with m = 8. When a request has stored more than R distinct tokens its oldest row is
dropped (a ring): until then its reads equal ``RowCaches``' (``tests/test_device.py``); after, a dropped token's
row reads as absent where the decoder would still hold it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specrank.engines.device.state import CONTINUATION, COUNT, PREV_ACCEPTED, PREV_COUNT, ROUNDS, SAME_AT


def host(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as the kernels take it: C-contiguous (one compiled specialization; no copy when it is)."""
    return np.ascontiguousarray(t.numpy())


class DeviceRows:
    """The retained rows of up to ``requests`` requests (slots 0..S-1), ``rows`` token-keyed rows each, from verify
    passes of up to ``pass_rows`` rows (k + 1). ``host`` (None: on a CPU device): reads and updates run as the
    numba kernels of ``rows_kernel`` on the same tensors, else as tensor operations."""

    def __init__(self, requests: int, rows: int, vocab_size: int, temperature: float = 1.0, device="cpu",
                 dtype=torch.float32, pass_rows: int = 8, host: bool | None = None):
        s, r, v, m = requests, rows, vocab_size, pass_rows
        self.capacity, self.pass_rows, self.vocab_size, self.temperature = r, m, v, float(temperature or 1.0)
        self.absent = r + m  # the NaN row
        self.store = torch.zeros(s, r + m + 1, v, dtype=dtype, device=device)
        self.store[:, self.absent] = math.nan
        self.slot_of = torch.full((s, v + 1), self.absent, dtype=torch.int64, device=device)
        self.token_of = torch.full((s, r + m + 1), v, dtype=torch.int64, device=device)  # v: no token
        self.round_of = torch.zeros(s, r + m + 1, dtype=torch.float64, device=device)
        self.empty = torch.tensor((v, math.nan, math.nan, 0.0, 0.0, self.absent, self.absent),
                                  dtype=torch.float64, device=device)
        self.state = self.empty.repeat(s, 1)  # (S, 7)
        self.is_preceding = (torch.arange(3, device=device) == 2)[None, :, None]  # (1, 3, 1) of a read's sources
        self.pass_constants: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.kernels = None
        if (self.store.device.type == "cpu") if host is None else host:
            if self.store.device.type != "cpu" or dtype != torch.float32:
                raise ValueError("the host kernels hold float32 rows in CPU memory")
            from specrank.engines.device.rows_kernel import kernels  # numba: compiled or loaded once, here

            self.kernels = kernels()
            self.views = tuple(t.numpy() for t in (self.store, self.slot_of, self.token_of, self.round_of, self.state))
            none = torch.zeros(0, dtype=torch.int64, device=device)  # compile (or load) the kernels now, not mid-step
            self.update(none, torch.zeros(0, 1, v), none[:, None], none, none)
            self.read(none, none, none[:, None])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values() if isinstance(t, torch.Tensor))

    @property
    def requests(self) -> int:
        return self.store.shape[0]

    def reset(self, slot: torch.Tensor) -> None:
        """Empty the request slots ``slot`` (n,) for new requests."""
        self.slot_of[slot] = self.absent
        self.token_of[slot] = self.vocab_size
        self.state[slot] = self.empty

    def log_probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., V) a verify pass's logits -> log r(x) at the law's temperature (float32; a NaN row stays NaN),
        a new tensor: the engine's sampler may then scale its logits in place."""
        t = self.temperature
        return torch.log_softmax(logits.float() / t if t != 1.0 else logits.float(), dim=-1)

    def read(self, slot: torch.Tensor, root: torch.Tensor, candidates: torch.Tensor):
        """Before a first draft step: (log r(x) (b, 3, K) float32 of the cache, same-token and preceding rows at the
        ``candidates`` (b, K), NaN where absent; cache age (b,) float64 and the previous chain's count of the root
        token (b,) float64, NaN unknown)."""
        state = self.state[slot]  # (b, 7)
        where = self.slot_of[slot, root]  # (b,)
        index = torch.cat([where[:, None], state[:, SAME_AT:].long()], dim=1)  # (b, 3)
        values = self.store[slot[:, None, None], index[:, :, None], candidates[:, None, :]]  # (b, 3, K)
        # the preceding row: the continuation's entry zeroed, the root's missing
        values = values.masked_fill(self.is_preceding & (candidates == state[:, CONTINUATION, None])[:, None],
                                    -math.inf)
        values = values.masked_fill(self.is_preceding & (candidates == root[:, None])[:, None], math.nan)
        age = torch.where(where == self.absent, math.nan, state[:, ROUNDS] - self.round_of[slot, where])
        return values, age, state[:, PREV_COUNT]

    def _host_read(self, slot, root, candidates):
        b, k = candidates.shape
        values = torch.empty(b, 3, k, dtype=torch.float32)
        age, count = torch.empty(b, dtype=torch.float64), torch.empty(b, dtype=torch.float64)
        store, slot_of, _, round_of, state = self.views
        self.kernels.read(host(slot), host(root), host(candidates), store, slot_of, round_of, state, self.absent,
                          values.numpy(), age.numpy(), count.numpy())
        return values, age, count

    def prev_accepted(self, slot: torch.Tensor) -> torch.Tensor:
        """(b,) float64 the previous step's accepted count (NaN: none yet)."""
        return self.state[slot, PREV_ACCEPTED]

    def update(self, slot: torch.Tensor, logp: torch.Tensor, tokens: torch.Tensor, accepted: torch.Tensor,
               continuation: torch.Tensor) -> None:
        """After a verify pass: ``logp`` (b, n, V) ``log_probabilities`` of the target's logits at the root (0) and
        the n - 1 drafted tokens ``tokens`` (b, n) (root first, the chain in order: its rank order), ``accepted``
        (b,) draft tokens accepted, ``continuation`` (b,) the token emitted after them (the next root)."""
        b, n, _ = logp.shape
        if n > self.pass_rows or n > self.capacity:
            raise ValueError(f"a verify pass of {n} rows a request; the store takes passes of up to"
                             f" {min(self.pass_rows, self.capacity)} (rows and pass_rows >= k + 1)")
        if self.kernels is not None:
            store, slot_of, token_of, round_of, state = self.views
            self.kernels.update(*(host(t) for t in (slot, logp, tokens, accepted, continuation)), store, slot_of,
                                token_of, round_of, state, self.capacity, self.absent, self.vocab_size)
            return
        earlier, scratch = self._constants(n)
        matches = tokens == continuation[:, None]  # (b, n): the root, then the chain
        # stored: each token's first occurrence (a chain token equal to the root is not: the root came first)
        keep = ~((tokens[:, :, None] == tokens[:, None, :]) & earlier).any(dim=2)  # (b, n)
        state = self.state[slot]  # (b, 7)
        target, new = self._put(slot, tokens, logp, keep, state, scratch)
        # the same-token row: the root's when the root is the continuation, else the first (highest-ranked) chain
        # node's (argmax: the first maximum); the NaN row when none is
        target = torch.cat([target, torch.full_like(target[:, :1], self.absent)], dim=1)
        first_hit = torch.where(matches.any(dim=1), matches.int().argmax(dim=1), n)
        sides = torch.gather(target, 1, torch.stack([first_hit, accepted], dim=1))  # (b, 2)
        self.state[slot] = torch.cat([
            torch.stack([continuation, matches.sum(dim=1), accepted], dim=1),
            state[:, ROUNDS:COUNT + 1] + torch.stack([torch.ones_like(new), new], dim=1), sides], dim=1).double()

    def _constants(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A pass of ``n`` rows: (n, n) bool ``earlier[i, j]`` = j < i, and (n,) the places after the ring."""
        if n not in self.pass_constants:
            j = torch.arange(n, device=self.store.device)
            self.pass_constants[n] = (j[None, :] < j[:, None], self.capacity + j)
        return self.pass_constants[n]

    def _put(self, slot, tokens, logp, keep, state, scratch) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``logp[keep]`` under ``tokens[keep]`` (distinct in each request), the rest in the places after
        the ring (``scratch``). ((b, n) each row's place, (b,) the new tokens stored)."""
        held = self.slot_of[slot[:, None], tokens]  # (b, n)
        new = keep & (held == self.absent)
        ring = (state[:, COUNT, None].long() + torch.cumsum(new.long(), dim=1) - 1) % self.capacity
        target = torch.where(new, ring, torch.where(keep, held, scratch))
        dropped = torch.where(new, self.token_of[slot[:, None], ring], self.vocab_size)
        self.slot_of[slot[:, None], dropped] = self.absent  # a ring slot reused: its old token reads as absent
        kept_tokens = torch.where(keep, tokens, self.vocab_size)  # the rest at V, which always reads absent
        self.slot_of[slot[:, None], kept_tokens] = torch.where(keep, target, self.absent)
        self.token_of[slot[:, None], target] = kept_tokens
        self.round_of[slot[:, None], target] = state[:, ROUNDS, None]
        self.store[slot[:, None], target] = logp.to(self.store.dtype)
        return target, new.sum(dim=1)
