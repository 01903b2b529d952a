"""``DeviceRows``' read and update on the CPU as two numba kernels, a loop over the step's requests each:
inside an engine a tensor operation costs some 10 µs from caches the forward pass evicted, and the torch
path is some 40 of them a step. The kernels work in place on the same tensors (numpy views of CPU tensors:
host memory, nothing waits) and mean the same thing, operation for operation (``tests/test_device.py`` runs
both against the decoder's ``RowCaches``). Importing this module imports numba; the kernels compile on their
first call and are cached beside this file, keyed on ``frozen_digest`` of ``state`` and this module (the state's
column numbers are compiled in)."""

from __future__ import annotations

import functools
import math
import sys
from typing import Callable, NamedTuple

import numba
import numpy as np

from specrank.engines.device import state as layout
from specrank.engines.device.state import CONTINUATION, COUNT, PRECEDING_AT, PREV_ACCEPTED, PREV_COUNT, ROUNDS, SAME_AT
from specrank.featurize.kernel import frozen_digest


class Kernels(NamedTuple):
    read: Callable
    update: Callable


@functools.cache
def kernels() -> Kernels:
    return compile_kernels(frozen_digest(layout, sys.modules[__name__]))


def compile_kernels(key: str) -> Kernels:
    """The kernels with ``key`` in their closures (``featurize.kernel``'s rule against a stale cache)."""

    @numba.njit(cache=True, nogil=True)
    def read(slot, root, candidates, store, slot_of, round_of, state, absent, values, age, count):
        """``DeviceRows.read`` into ``values`` (b, 3, K) float32, ``age`` and ``count`` (b,) float64."""
        key  # noqa: B018 (the cache key)
        for i in range(slot.shape[0]):
            s = slot[i]
            where = slot_of[s, root[i]]
            sources = (where, np.int64(state[s, SAME_AT]), np.int64(state[s, PRECEDING_AT]))
            for j in range(3):
                for k in range(candidates.shape[1]):
                    values[i, j, k] = store[s, sources[j], candidates[i, k]]
            for k in range(candidates.shape[1]):  # the preceding row: the continuation's entry zeroed, the root's missing
                if candidates[i, k] == state[s, CONTINUATION]:
                    values[i, 2, k] = -np.inf
                if candidates[i, k] == root[i]:
                    values[i, 2, k] = np.nan
            age[i] = math.nan if where == absent else state[s, ROUNDS] - round_of[s, where]
            count[i] = state[s, PREV_COUNT]

    @numba.njit(cache=True, nogil=True)
    def update(slot, logp, tokens, accepted, continuation, store, slot_of, token_of, round_of, state, capacity,
               absent, vocab_size):
        """``DeviceRows.update``: each token's first occurrence stored under it (a new token at the ring's next
        place, its old token dropped), the rest after the ring, then the slot's scalars."""
        key  # noqa: B018 (the cache key)
        n = tokens.shape[1]
        target = np.empty(n, np.int64)
        new = np.zeros(n, np.bool_)
        keep = np.zeros(n, np.bool_)
        for i in range(slot.shape[0]):
            s = slot[i]
            stored, count = np.int64(state[s, COUNT]), 0
            for j in range(n):
                keep[j] = True
                for e in range(j):
                    if tokens[i, e] == tokens[i, j]:
                        keep[j] = False
                held = slot_of[s, tokens[i, j]]
                new[j] = keep[j] and held == absent
                if new[j]:
                    target[j] = (stored + count) % capacity
                    count += 1
                else:
                    target[j] = held if keep[j] else capacity + j
            for j in range(n):  # a ring place reused: its old token reads as absent
                if new[j]:
                    slot_of[s, token_of[s, target[j]]] = absent
            slot_of[s, vocab_size] = absent
            hits, same = 0, absent
            for j in range(n):
                if keep[j]:
                    slot_of[s, tokens[i, j]] = target[j]
                    token_of[s, target[j]] = tokens[i, j]
                else:
                    token_of[s, target[j]] = vocab_size
                round_of[s, target[j]] = state[s, ROUNDS]
                store[s, target[j]] = logp[i, j]
                if tokens[i, j] == continuation[i]:
                    hits += 1
                    if same == absent:
                        same = target[j]
            state[s, CONTINUATION] = continuation[i]
            state[s, PREV_COUNT] = hits
            state[s, PREV_ACCEPTED] = accepted[i]
            state[s, ROUNDS] += 1
            state[s, COUNT] += count
            state[s, SAME_AT] = same
            state[s, PRECEDING_AT] = target[accepted[i]]

    return Kernels(read, update)
