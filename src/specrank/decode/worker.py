"""The drafter worker process of pipelined decoding: rebuilds the drafter from its payload, then grows one pool per
request (target-row reuse, arXiv 2610.29210, App. D.14: the target sends the newly committed tokens, the drafter returns
its pool).

Messages from the target process: the payload dict once, then ``("grow", request, reset, tokens, root,
shape)`` (``reset``: ``tokens`` is a new prompt, else the committed tokens since the last request) or
``("close",)``. Replies, tagged with the request number (0 for the start): ``("ready", 0, pid)`` once, then
``("pool", request, DraftPool, (start, end))`` or ``("error", request, exception)``.
The worker exits on ``close`` or when the target process's end of the pipe closes.
"""

from __future__ import annotations

import io
import os
import pickle
import time

import torch

from specrank.decode.loading.standalone import CausalLMDrafter


def build_drafter(payload: dict, device: str):
    """A causal LM drafter on ``device`` from ``payload`` (the pickled module bytes, vocabulary size, spec)."""
    # Our own payload, written by ``pipeline.drafter_payload`` in the parent: a whole module, not weights only.
    model = torch.load(io.BytesIO(payload["model"]), map_location="cpu", weights_only=False)
    drafter = CausalLMDrafter(model.to(device).eval().requires_grad_(False), payload["vocab_size"], payload["spec"])
    drafter.graphs = payload.get("graphs")  # the caller's choice; None: by the worker's device
    return drafter


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (the parent re-raises the same type), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")


def serve(conn, device: str, threads: int | None) -> None:
    """The worker's main loop (the worker process's target)."""
    try:
        if threads:
            torch.set_num_threads(threads)
        drafter = build_drafter(conn.recv(), device)
    except EOFError:
        return
    except Exception as exc:
        conn.send(("error", 0, portable(exc)))
        return
    conn.send(("ready", 0, os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the target process is gone
            return
        if message[0] == "close":
            return
        _, request, reset, tokens, root, shape = message
        try:
            start = time.perf_counter()
            (drafter.start if reset else drafter.commit)(tokens)
            pool = drafter.grow_pool(root, shape)
            reply = ("pool", request, pool, (start, time.perf_counter()))
        except Exception as exc:
            reply = ("error", request, portable(exc))
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
