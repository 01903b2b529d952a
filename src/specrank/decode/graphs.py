"""Forward passes captured as CUDA graphs, one per shape, replayed with new inputs.

A decoding round launches the same passes with the same shapes every round once its KV cache is static
(``decode.kv_cache``): the tree pass over B + 1 rows, the drafter's steps over each level's frontier, the
root step. Eager, each pass is hundreds of small kernels whose launches the host issues one by one; at
batch one the GPU then idles between them. A graph replays the whole pass with one launch.

``torch.cuda.CUDAGraph`` is used directly rather than ``torch.compile(mode="reduce-overhead")``: a
capture takes one eager pass (tens of milliseconds at 8B), where compiling a 32-layer model costs minutes
for each shape, and a replay runs exactly the eager kernels, so float32 greedy output stays bit for bit
the eager path's (a compiler fuses and reorders sums).

A pass is ``fn(context, *tensors) -> tuple of tensors``. Its first call with a new key copies the inputs
into buffers of its own, runs it once (the real result; its cache writes are the ones the capture replays,
so running it twice writes the same values), captures it, and replays. Later calls copy their inputs into
the buffers and replay. Outputs are cloned, since the next replay overwrites them and a round keeps some
rows across passes. Graphs of one model share one memory pool: they never run at the same time.

On the CPU there is nothing to capture: with ``capture=False`` the same fixed-shape pass runs eagerly on
the buffers (what the tests exercise: static inputs, full-capacity masks, cache positions as inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specrank.decode.core import additive_mask, to_device

MAX_CAPTURED_ROWS = 1024  # larger passes (a prompt's prefill) run eagerly: one each, and their shapes vary


@dataclass
class CapturedPass:
    inputs: tuple[torch.Tensor, ...]  # the pass's own input buffers
    outputs: tuple[torch.Tensor, ...]
    graph: object | None  # torch.cuda.CUDAGraph, None when run eagerly on the buffers


class CapturedPasses:
    """A model's captured passes by key (the key names every shape and option a pass depends on)."""

    def __init__(self):
        self.passes: dict = {}
        self.pool = None  # the memory pool the graphs share
        self.captures = 0  # passes captured (a test reads it: a decode captures each shape once)
        self.store, self.generation = None, -1  # the KV store, and its generation, whose buffers the passes hold

    def clear(self) -> None:
        """Forget every pass (their buffers moved: a KV store grew)."""
        self.passes.clear()

    def run(self, key, fn: Callable, context, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """``fn(context, *tensors)`` through the pass captured under ``key`` (captured on first use)."""
        entry = self.passes.get(key)
        if entry is None:
            entry = self.passes[key] = self._capture(fn, context, tensors)
        else:
            for buffer, t in zip(entry.inputs, tensors):
                buffer.copy_(t)
            if entry.graph is None:
                entry.outputs = fn(context, *entry.inputs)
            else:
                entry.graph.replay()
        return tuple(None if t is None else t.clone() for t in entry.outputs)

    def _capture(self, fn, context, tensors) -> CapturedPass:
        inputs = tuple(t.clone() for t in tensors)
        self.captures += 1
        if not inputs[0].is_cuda:
            return CapturedPass(inputs, fn(context, *inputs), None)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture: libraries set up their handles and workspaces
            fn(context, *inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = fn(context, *inputs)
        self.pool = graph.pool()
        graph.replay()
        return CapturedPass(inputs, outputs, graph)


def padded_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    """(n, k) additive mask -> (n, ``width``), every later position hidden (-inf), built on the mask's device."""
    full = torch.full((mask.shape[0], width), float("-inf"), dtype=mask.dtype, device=mask.device)
    full[:, : mask.shape[1]] = mask
    return full


def cached_pass(cache, n: int, device, fn: Callable, tensors: tuple, mask: torch.Tensor, dtype,
                passes: CapturedPasses | None = None, key=()) -> tuple:
    """``fn(cache, *tensors, mask, write)`` for ``n`` new positions through a ``StaticKVCache``.

    ``mask`` (n, past + n) is additive (0 attend, -inf not), on any device; ``write`` (n,) are the new
    positions' cache slots. With ``passes`` (graphs on, ``n`` small enough) the pass reads the cache's whole
    capacity under a padded mask and runs captured under ``key`` plus its shape; else eagerly over
    ``past + n`` positions. A prompt's first pass (its prefill, on an empty cache) always runs eagerly: its
    length is the prompt's, a shape that seldom comes back."""
    captured = passes is not None and cache.length > 0 and n <= MAX_CAPTURED_ROWS
    write = cache.begin(n, device, full=captured)
    mask = to_device(mask, device)
    if captured:
        store = cache.store
        if passes.store is not store or passes.generation != store.generation:  # other buffers: recapture
            passes.clear()
            passes.store, passes.generation = store, store.generation
        out = passes.run((key, n, store.capacity), fn, cache,
                         (*tensors, additive_mask(padded_mask(mask, store.capacity), dtype), write))
    else:
        out = fn(cache, *tensors, additive_mask(mask, dtype), write)
    cache.end(n)
    return out
