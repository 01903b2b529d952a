"""A preallocated KV cache written in place at cache positions (the decoder's only KV cache).

A model (the target, a drafter) owns one ``KVStore``: per layer, key and value buffers of shape
(1, kv_heads, capacity, head_dim), allocated at the first write and doubled when a prompt outgrows them.
A prompt decodes through a ``StaticKVCache``, a handle on its model's store holding the prompt's length:
a forward writes its ``n`` new positions at ``[length, length + n)`` with ``index_copy_`` (no
concatenation, so no copy of what the context already holds), a commit moves the kept ones into place, a
crop only lowers the length. Buffers outlive prompts, so passes captured as CUDA graphs
(``decode.graphs``), which hold the buffers' addresses, stay valid from one prompt to the next.

A forward sees either the keys up to its own last position (eager: the attention costs what the context
holds, as with a growing cache) or the whole capacity (a captured pass: fixed shapes, the additive mask
hiding every position past the context). Masked positions weigh exactly zero after the softmax, so both
give the same rows up to the order of floating-point sums.

The handle implements what a Hugging Face attention layer calls (``update``, ``get_seq_length``), so the
models' own layers write into it. One prompt at a time: a newer handle on the same store makes the older one
refuse to be used (``StaleCacheError``) rather than read positions another prompt overwrote.
"""

from __future__ import annotations

import torch

from specrank.decode.core import to_device

INITIAL_CAPACITY = 1024  # positions; a store doubles past it (rarely: a prompt plus its output and one pass)


class StaleCacheError(RuntimeError):
    """A prompt's cache handle was used after another prompt took the same model's store."""


class KVStore:
    """The key and value buffers of one model, by attention layer (see the module docstring)."""

    def __init__(self, capacity: int = INITIAL_CAPACITY):
        self.capacity = int(capacity)
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (1, kv_heads, capacity, head_dim)
        self.values: dict[int, torch.Tensor] = {}
        self.generation = 0  # bumped when the buffers move (captured passes hold the old addresses)
        # (capacity,) the position of each slot, kept only for sliding-window attention (``decode.attention``)
        self.positions: torch.Tensor | None = None
        self.holder = 0  # the handle allowed to use the store

    def layer(self, index: int, like_keys: torch.Tensor, like_values: torch.Tensor):
        """(keys, values) buffers of layer ``index``, allocated after ``like_*`` (1, kv_heads, n, head_dim)."""
        if index not in self.keys:
            shape_k, shape_v = list(like_keys.shape), list(like_values.shape)
            shape_k[-2] = shape_v[-2] = self.capacity
            self.keys[index] = like_keys.new_zeros(shape_k)
            self.values[index] = like_values.new_zeros(shape_v)
        return self.keys[index], self.values[index]

    def reserve(self, positions: int, length: int) -> None:
        """Room for ``positions`` positions, keeping the first ``length``: doubling, so a prompt moves its
        buffers a logarithmic number of times."""
        if positions <= self.capacity:
            return
        capacity = self.capacity
        while capacity < positions:
            capacity *= 2
        for buffers in (self.keys, self.values):
            for index, old in buffers.items():
                shape = list(old.shape)
                shape[-2] = capacity
                new = old.new_zeros(shape)
                new[..., :length, :] = old[..., :length, :]
                buffers[index] = new
        if self.positions is not None:
            positions = self.positions.new_zeros(capacity)
            positions[:length] = self.positions[:length]
            self.positions = positions
        self.capacity = capacity
        self.generation += 1


class StaticKVCache:
    """One prompt's view of a ``KVStore``: its length and the positions the running forward writes."""

    def __init__(self, store: KVStore):
        store.holder += 1
        self.store, self.handle, self.length = store, store.holder, 0
        self.write: torch.Tensor | None = None  # (n,) cache positions of the running forward's new tokens
        self.visible = 0  # key positions the running forward's attention reads

    def check(self) -> None:
        if self.store.holder != self.handle:
            raise StaleCacheError("this KV cache was taken over by a newer prompt on the same model "
                                  "(one prompt decodes at a time per model)")

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def begin(self, n: int, device, full: bool) -> torch.Tensor:
        """Before a forward of ``n`` new positions: room for them, and their cache positions (n,) on ``device``
        (an ``arange`` launched there: no copy). ``full``: the forward reads the whole capacity."""
        self.check()
        self.store.reserve(self.length + n, self.length)
        self.visible = self.store.capacity if full else self.length + n
        return torch.arange(self.length, self.length + n, device=device)

    def end(self, n: int) -> None:
        """After a forward: its ``n`` positions are held (until a commit or crop)."""
        self.length += n

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Write (1, kv_heads, n, head_dim) at ``write``; return the keys and values the attention reads."""
        keys, values = self.store.layer(layer_idx, key_states, value_states)
        keys.index_copy_(2, self.write, key_states)
        values.index_copy_(2, self.write, value_states)
        return keys[:, :, : self.visible], values[:, :, : self.visible]

    def place(self, positions: torch.Tensor) -> torch.Tensor:
        """Note the positions (n,) of the running forward's new tokens at ``write``; return every slot's position
        (capacity,). A tree's slots are not its positions (siblings share one), so a window is cut by these."""
        store = self.store
        if store.positions is None:
            store.positions = torch.zeros(store.capacity, dtype=torch.long, device=positions.device)
        store.positions.index_copy_(0, self.write, positions)
        return store.positions

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (nothing moves: later ones are overwritten or masked)."""
        self.check()
        self.length = min(self.length, int(length))

    @torch.inference_mode()
    def gather(self, past_len: int, keep) -> None:
        """Keep positions ``[0, past_len)`` and ``past_len + keep`` (host indices into the last forward's new
        positions), moving the kept ones to ``past_len, past_len + 1, ...``.

        Kept positions already in place (a leading run ``keep[i] == i``: the root, and the first-ranked path)
        do not move: when the whole path is in place, as in every round that accepts nothing, a commit launches
        no device work. The index reaches the device by a copy that does not wait for it."""
        self.check()
        keep = torch.as_tensor(keep, dtype=torch.long)
        k, n_new = len(keep), self.length - past_len
        if n_new < 0 or (k and not (0 <= int(keep.min()) and int(keep.max()) < n_new)):
            raise ValueError(f"commit: keep indices must lie in [0, {n_new}) after past_len {past_len}")
        in_place = (keep == torch.arange(k)).numpy()
        start = k if in_place.all() else int(in_place.argmin())
        if start < k:
            index = None
            for buffers in (self.store.keys, self.store.values):
                for full in buffers.values():
                    if index is None or index.device != full.device:
                        index = to_device(past_len + keep[start:], full.device)
                    full[..., past_len + start : past_len + k, :] = full.index_select(-2, index)
            slots = self.store.positions
            if slots is not None:
                slots[past_len + start : past_len + k] = slots.index_select(0, to_device(past_len + keep[start:],
                                                                                         slots.device))
        self.length = past_len + k
