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

A capture that raises (an operation a graph cannot hold, a library that syncs inside the pass) must not end
a user's decode: that pass runs eagerly on its buffers from then on, exactly as on the CPU, and one line on
stderr names its shape and the error. The pass's output is the eager one either way.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch

from specrank.decode.core import additive_mask, to_device
from specrank.errors import first_line

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
        self.failed: set = set()  # keys whose capture raised: run eagerly on their buffers, never captured again
        self.store, self.generation = None, -1  # the KV store, and its generation, whose buffers the passes hold

    def clear(self) -> None:
        """Forget every pass (their buffers moved: a KV store grew)."""
        self.passes.clear()

    def run(self, key, fn: Callable, context, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """``fn(context, *tensors)`` through the pass captured under ``key`` (captured on first use)."""
        entry = self.passes.get(key)
        if entry is None:
            entry = self.passes[key] = self._capture(fn, context, tensors, key)
        else:
            for buffer, t in zip(entry.inputs, tensors):
                buffer.copy_(t)
            if entry.graph is None:
                entry.outputs = fn(context, *entry.inputs)
            else:
                entry.graph.replay()
        return tuple(None if t is None else t.clone() for t in entry.outputs)

    def _capture(self, fn, context, tensors, key=None) -> CapturedPass:
        inputs = tuple(t.clone() for t in tensors)
        self.captures += 1
        if key in self.failed or not can_capture(inputs[0]):
            return CapturedPass(inputs, fn(context, *inputs), None)
        try:
            outputs, graph = capture_graph(fn, context, inputs, self.pool)
        except Exception as exc:  # noqa: BLE001 - whatever broke the capture, the eager pass is still right
            self.failed.add(key)
            print(f"specrank: CUDA graph capture failed for pass {describe(key, inputs)}; running it eagerly from "
                  f"now on ({type(exc).__name__}: {first_line(exc)})", file=sys.stderr)
            return CapturedPass(inputs, fn(context, *inputs), None)
        self.pool = graph.pool()
        return CapturedPass(inputs, outputs, graph)


def can_capture(tensor: torch.Tensor) -> bool:
    """Whether a pass on ``tensor``'s device can be captured as a CUDA graph."""
    return tensor.is_cuda


def capture_graph(fn, context, inputs: tuple, pool) -> tuple:
    """Capture ``fn(context, *inputs)`` as a CUDA graph in ``pool``; -> (outputs, graph), the graph replayed once
    so that the outputs hold this call's result."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: libraries set up their handles and workspaces
        fn(context, *inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn(context, *inputs)
    graph.replay()
    return outputs, graph


def describe(key, inputs: tuple) -> str:
    """A pass's shape in one phrase: its rows, the keys it reads and its options (the capture key)."""
    rows = inputs[0].shape[0] if inputs and inputs[0].dim() else "?"
    return f"rows={rows} key={key!r}"


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
