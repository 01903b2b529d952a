"""A chain engine's retained target rows, per request, on the engine's device (docs/vllm.md, "Retained rows").

specrank's decoder keeps, per prompt (``decode.engine.caches.RowCaches``): a row per token (the row of every
verified prefix under its last token, the highest-ranked one winning, then the root's row under the root token),
the same-token row and the preceding row. An engine verifying a chain computes k + 1 target rows a step: the
root's and each drafted token's. ``DeviceRows`` keeps the same rows from them, as tensors with fixed shapes, so
an update and a read are a fixed list of tensor operations with no host read:

- ``store`` (S, R + 3, V): each request slot's token-keyed rows (logits, as the pass returned them), R of them, a
  scratch row that absorbs the writes a step does not keep, and the last step's same-token and preceding rows (a
  read gathers its three rows in one copy); ``slot_of`` (S, V + 1) token -> row (-1: none).

Memory: (S (R + 3) V) floats and S (V + R) integers: 8 requests of 64 rows at SmolLM2's 49,152 tokens hold
about 104 MB in float32. When a request has stored more than R distinct tokens its oldest row is dropped (a
ring): until then its reads equal ``RowCaches``' (``tests/test_device.py``); after, a dropped token's row reads
as absent where the decoder would still hold it.
"""

from __future__ import annotations

import math

import torch


class DeviceRows:
    """The retained rows of up to ``requests`` requests (slots 0..S-1), ``rows`` token-keyed rows each."""

    def __init__(self, requests: int, rows: int, vocab_size: int, temperature: float = 1.0, device="cpu",
                 dtype=torch.float32):
        s, r, v = requests, rows, vocab_size
        self.capacity, self.vocab_size, self.temperature = r, v, float(temperature or 1.0)
        self.store = torch.zeros(s, r + 3, v, dtype=dtype, device=device)  # + scratch, same-token, preceding
        self.slot_of = torch.full((s, v + 1), -1, dtype=torch.int64, device=device)
        self.token_of = torch.full((s, r + 1), v, dtype=torch.int64, device=device)  # v: no token
        self.round_of = torch.zeros(s, r + 1, dtype=torch.int64, device=device)
        self.count = torch.zeros(s, dtype=torch.int64, device=device)
        self.sides = torch.tensor([r + 1, r + 2], device=device)  # the same-token and preceding rows' places
        self.is_preceding = (torch.arange(3, device=device) == 2)[None, :, None]  # (1, 3, 1) of a read's sources
        self.has_same = torch.zeros(s, dtype=torch.bool, device=device)
        self.has_preceding = torch.zeros(s, dtype=torch.bool, device=device)
        self.continuation = torch.zeros(s, dtype=torch.int64, device=device)
        self.prev_count = torch.full((s,), -1.0, dtype=torch.float64, device=device)
        self.prev_accepted = torch.full((s,), math.nan, dtype=torch.float64, device=device)
        self.rounds = torch.zeros(s, dtype=torch.int64, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values() if isinstance(t, torch.Tensor))

    def reset(self, slot: torch.Tensor) -> None:
        """Empty the request slots ``slot`` (n,) for new requests."""
        self.slot_of[slot] = -1
        self.token_of[slot] = self.vocab_size
        self.count[slot] = 0
        self.has_same[slot] = False
        self.has_preceding[slot] = False
        self.prev_count[slot] = -1.0
        self.prev_accepted[slot] = math.nan
        self.rounds[slot] = 0

    def read(self, slot: torch.Tensor, root: torch.Tensor, candidates: torch.Tensor):
        """Before a first draft step: (log r(x) (b, 3, K) float32 of the cache, same-token and preceding rows at the
        ``candidates`` (b, K), NaN where absent; cache age (b,) float64, -1 absent; the previous chain's count of
        the root token (b,) float64, -1 unknown)."""
        where = self.slot_of[slot, root]  # (b,)
        stored = where >= 0
        r = self.capacity
        index = torch.stack([where.clamp_min(0), torch.full_like(where, r + 1), torch.full_like(where, r + 2)], dim=1)
        rows = self.store[slot[:, None], index]  # (b, 3, V): the cache, same-token and preceding rows, one copy
        present = torch.stack([stored, self.has_same[slot], self.has_preceding[slot]], dim=1)  # (b, 3)
        # log r(x) = row[x] / T - logsumexp(row / T): the normalizer over each row, the rest at the K candidates
        t = self.temperature
        scaled = (lambda x: x.float() / t) if t != 1.0 else (lambda x: x.float())  # noqa: E731 (as RowCaches)
        lse = torch.logsumexp(scaled(rows), -1)  # (b, 3)
        values = scaled(torch.gather(rows, 2, candidates[:, None, :].expand(-1, 3, -1))) - lse[:, :, None]
        preceding = self.is_preceding
        continuation = (candidates == self.continuation[slot][:, None])[:, None]  # (b, 1, K)
        values = torch.where(preceding & continuation, -math.inf, values)  # the continuation's entry is zeroed
        values = torch.where(preceding & (candidates == root[:, None])[:, None], math.nan, values)  # ... missing
        values = torch.where(present[:, :, None], values, torch.full_like(values, math.nan))
        age = torch.where(stored, (self.rounds[slot] - self.round_of[slot, where.clamp_min(0)]).double(),
                          torch.full_like(self.prev_count[slot], -1.0))
        return values, age, self.prev_count[slot]

    def update(self, slot: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, accepted: torch.Tensor,
               continuation: torch.Tensor) -> None:
        """After a verify pass: ``rows`` (b, n, V) the target's logits at the root (0) and the n - 1 drafted tokens
        ``tokens`` (b, n) (root first, the chain in order: its rank order), ``accepted`` (b,) draft tokens accepted,
        ``continuation`` (b,) the token emitted after them (the next root)."""
        b, n, _ = rows.shape
        if n > self.capacity:
            raise ValueError(f"a step stores up to {n} rows a request; the store holds {self.capacity} (rows >= k + 1)")
        root, chain = tokens[:, 0], tokens[:, 1:]
        j = torch.arange(n, device=rows.device)
        hits = chain == continuation[:, None]  # (b, n - 1)
        is_root = root == continuation
        # the root's row when the root is the continuation, else the first (highest-ranked) chain node's
        first_hit = torch.where(hits.any(dim=1) & ~is_root, hits.int().argmax(dim=1) + 1, torch.zeros_like(root))
        batch = torch.arange(b, device=rows.device)
        self.store[slot[:, None], self.sides] = torch.stack(
            [rows[batch, first_hit], rows[batch, accepted]], dim=1).to(self.store.dtype)  # same-token, preceding
        self.has_same[slot] = is_root | hits.any(dim=1)
        self.prev_count[slot] = (hits.sum(dim=1) + is_root.long()).double()
        self.has_preceding[slot] = True
        self.continuation[slot] = continuation
        # stored: the root, and each chain token's first occurrence that is not the root's token
        earlier = (tokens[:, :, None] == tokens[:, None, :]) & (j[None, None, :] < j[None, :, None])
        keep = ~earlier.any(dim=2) & ((tokens != root[:, None]) | (j == 0)[None])  # (b, n)
        self._put(slot, tokens, rows, keep)
        self.rounds[slot] += 1
        self.prev_accepted[slot] = accepted.double()

    def _put(self, slot, tokens, rows, keep) -> None:
        """Store ``rows[keep]`` under ``tokens[keep]`` (distinct in each request); the rest go to the scratch row."""
        r = self.capacity
        held = self.slot_of[slot[:, None], tokens]  # (b, n)
        new = keep & (held < 0)
        ring = (self.count[slot][:, None] + torch.cumsum(new.long(), dim=1) - 1) % r
        target = torch.where(new, ring, torch.where(keep, held, torch.full_like(held, r)))
        dropped = torch.where(new, self.token_of[slot[:, None], ring], torch.full_like(held, self.vocab_size))
        self.slot_of[slot[:, None], dropped] = -1  # a ring slot reused: its old token reads as absent
        self.slot_of[slot[:, None], torch.where(keep, tokens, torch.full_like(tokens, self.vocab_size))] = \
            torch.where(keep, target, torch.full_like(target, -1))
        self.slot_of[slot, self.vocab_size] = -1
        self.token_of[slot[:, None], target] = torch.where(keep, tokens, torch.full_like(tokens, self.vocab_size))
        self.round_of[slot[:, None], target] = self.rounds[slot][:, None]
        self.store[slot[:, None], target] = rows.to(self.store.dtype)
        self.count[slot] += new.sum(dim=1)
