"""Pipelined decoding (target-row reuse, arXiv 2610.29210, §5.4, App. D.14): the drafter runs in its own worker process,
on its own device or CPU threads, and grows the next pool while the target runs the root pass at the same root.

``PipelinedDrafter`` is a ``Drafter``: the one round (``engine.round.draft_phase``) asks for the pool, runs
the root pass when its strategy needs the root row, then takes the pool. Nothing else changes: the pool does
not depend on the root row, and every draw and verification stays in the target process on its generator,
so every lossless strategy keeps its exactness.

Only drafters that read tokens alone can run this way (standalone causal LMs; ``early-exit:K`` becomes a
standalone K-layer model holding its own copy of the weights). An EAGLE-3 head reads the target's hidden
states of every round, which live in the target process: it is refused with a one-line error.
"""

from __future__ import annotations

import io
import signal
import time
import weakref
from multiprocessing.connection import wait

import numpy as np
import torch

from specrank.decode.core import Drafter, DraftPool, PoolShape, parse_device
from specrank.decode.loading.standalone import CausalLMDrafter
from specrank.decode.worker import serve

START_TIMEOUT_S = 600.0  # starting the worker (its first: importing torch), building the drafter, on a loaded machine
POOL_TIMEOUT_S = 600.0


class PipelineError(ValueError):
    """A drafter that cannot run in a worker process."""


class WorkerError(RuntimeError):
    """The drafter worker died, hung or could not start; the decode is stopped."""


def check_pipelinable(drafter) -> None:
    """Refuse, in one line, a drafter that cannot draft in a worker process."""
    spec = drafter.spec or type(drafter).__name__
    if drafter.hidden_layers is not None:
        raise PipelineError(f"pipeline: drafter {spec} reads the target's hidden states every round, which stay in"
                            " the target process; pipelining runs token-only drafters (standalone:PATH,"
                            " early-exit:K): decode it without pipeline")
    if not isinstance(drafter, CausalLMDrafter):
        raise PipelineError(f"pipeline: drafter {spec} is not a causal LM drafter (standalone:PATH, early-exit:K)")


def drafter_payload(drafter) -> dict:
    """What the worker rebuilds ``drafter`` from: its causal LM (own copy of the weights), vocabulary and spec."""
    check_pipelinable(drafter)
    buffer = io.BytesIO()
    torch.save(drafter.model, buffer)  # the K layers an early-exit drafter shares with the target are copied
    return {"model": buffer.getvalue(), "vocab_size": drafter.vocab_size, "spec": drafter.spec,
            "graphs": drafter._graphs}


def worker_context():
    """The start method of drafter workers: a fork server where the platform has one (Linux, macOS), else a fresh
    interpreter. A fresh interpreter imports torch and transformers for every worker (seconds of CPU each); the
    fork server imports the worker's module once per process and forks each worker from it, and, unlike a plain
    fork, never copies a parent that holds threads or a CUDA context."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return torch.multiprocessing.get_context("spawn")
    ctx = torch.multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["specrank.decode.worker"])
    return ctx


def exit_reason(code: int | None) -> str:
    if code is None:
        return "is not responding"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def stop_worker(process, conn) -> None:
    """Ask the worker to exit, kill it if it does not, and reap it (idempotent)."""
    try:
        if process.is_alive():
            conn.send(("close",))
    except (OSError, ValueError):
        pass
    process.join(5.0)
    if process.is_alive():
        process.kill()
        process.join()
    conn.close()


class PipelinedDrafter(Drafter):
    """``drafter`` moved into a worker process on ``device`` (default: its own) with ``threads`` torch threads.

    ``request_pool`` sends the committed tokens and the root and returns at once; ``receive_pool`` waits for
    the pool, or raises ``WorkerError`` (one line) when the worker dies or exceeds ``timeout`` seconds.
    ``close()`` (or leaving a ``with`` block, or garbage collection) stops and reaps the worker.
    """

    def __init__(self, drafter, device=None, threads: int | None = None, timeout: float = POOL_TIMEOUT_S):
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise PipelineError(f"pipeline: drafter threads must be a positive integer, got {threads!r}")
        check_pipelinable(drafter)
        self.device = parse_device(device if device is not None else drafter.device)
        payload = drafter_payload(drafter)
        self.spec, self.vocab_size, self.timeout = drafter.spec, drafter.vocab_size, float(timeout)
        self.source_hash = getattr(drafter, "source_hash", "")
        self.draft_to_target = None
        self._pending, self._reset, self._in_flight, self._request = np.zeros(0, np.int64), True, False, 0
        ctx = worker_context()
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=serve, args=(child, str(self.device), threads), daemon=True,
                                    name="specrank-drafter")
        self._process.start()
        child.close()  # the worker holds the only other end: its death closes the pipe
        self._finalizer = weakref.finalize(self, stop_worker, self._process, self._conn)
        try:
            self._conn.send(payload)
        except OSError:
            pass  # the worker died before reading it: _reply says how
        del payload
        try:
            self._reply("starting", max(self.timeout, START_TIMEOUT_S))
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def start(self, prompt_ids, target_hidden=None) -> None:
        self._pending, self._reset = np.asarray(prompt_ids, np.int64).reshape(-1), True

    def commit(self, tokens, target_hidden=None) -> None:
        self._pending = np.concatenate([self._pending, np.asarray(tokens, np.int64).reshape(-1)])

    def request_pool(self, root_token, shape: PoolShape = PoolShape()) -> None:
        self._check_alive("drafting")
        self._request += 1  # a pool still in flight (an interrupted round) is dropped when it arrives
        try:
            self._conn.send(("grow", self._request, self._reset, self._pending, int(root_token), shape))
        except OSError:
            self._fail("drafting")
        self._pending, self._reset, self._in_flight = self._pending[:0], False, True

    def receive_pool(self) -> DraftPool:
        if not self._in_flight:
            raise RuntimeError("pipeline: receive_pool() without request_pool()")
        self._in_flight = False
        pool, self.draft_window = self._reply("drafting", self.timeout)
        return pool

    def grow_pool(self, root_token, shape: PoolShape = PoolShape()) -> DraftPool:
        self.request_pool(root_token, shape)
        return self.receive_pool()

    def close(self) -> None:
        """Stop and reap the worker."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _reply(self, doing: str, timeout: float):
        """The reply to the last request; its error re-raised; death or silence as a ``WorkerError``. Replies
        to earlier requests (left unread by an interrupted decode) are dropped."""
        deadline = time.monotonic() + timeout
        while True:
            ready = wait([self._conn, self._process.sentinel], max(0.0, deadline - time.monotonic()))
            if self._conn in ready:
                try:
                    kind, request, *body = self._conn.recv()
                except (EOFError, OSError):
                    self._fail(doing)
                if request != self._request:
                    continue
                if kind == "error":
                    raise body[0]
                return body  # ("ready", 0, pid) or ("pool", request, pool, window)
            if ready or time.monotonic() >= deadline:  # the worker exited, or kept silent too long
                self._fail(doing, None if ready else timeout)

    def _check_alive(self, doing: str) -> None:
        if not self._process.is_alive():
            self._fail(doing)

    def _fail(self, doing: str, timeout: float | None = None):
        pid = self._process.pid
        if timeout:
            self._process.kill()  # hung: asking it to exit would wait in vain
        self._process.join(1.0)
        reason = f"gave no reply within {timeout:g} s" if timeout else exit_reason(self._process.exitcode)
        self.close()
        raise WorkerError(f"drafter worker (pid {pid}) {reason} while {doing}; decoding stopped")
