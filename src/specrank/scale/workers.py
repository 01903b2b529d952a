"""The workers and the driver's loop: ``ShardWorker`` actors, one shard in flight each, per-worker timing, lost
shards reported with their causes, and Ctrl-C that returns only once no worker can write any more."""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from tqdm import tqdm

from specrank.scale.session import ScaleError, Workers, first_line, ray_session

STOP_TIMEOUT_S = 30.0  # how long Ctrl-C waits for killed workers to be gone


@dataclass(frozen=True)
class Shard:
    """One unit of work: ``payload`` for the worker, ``label`` naming it in reports (its prompts), ``units``
    of the progress bar."""

    payload: object
    label: str
    units: int = 1


class ShardWorker:
    """The Ray actor: ``factory()`` builds the work once (loads the models); ``run(payload)`` runs one shard.

    The work object has ``run(payload) -> dict`` of numbers (summed per worker) and may have ``info() -> dict``
    (what the driver checks is the same on every worker, e.g. the models' hashes)."""

    def __init__(self, factory: Callable[[], object], threads: int | None):
        import torch
        from transformers.utils import logging as hf_logging

        start = time.perf_counter()
        if threads:
            torch.set_num_threads(threads)
        hf_logging.disable_progress_bar()  # no weight-loading bars: the driver's is the one bar
        self.work = factory()
        self.load_seconds = time.perf_counter() - start

    def info(self) -> dict:
        import ray

        info = self.work.info() if hasattr(self.work, "info") else {}
        return {"pid": os.getpid(), "ip": ray.util.get_node_ip_address(), "load_seconds": self.load_seconds,
                "work": info}

    def run(self, payload) -> dict:
        started = time.time()
        t0 = time.perf_counter()
        stats = self.work.run(payload) or {}
        return {"stats": stats, "seconds": time.perf_counter() - t0, "started": started, "ended": time.time()}


@dataclass
class WorkerTiming:
    """Per worker: shards run, seconds inside them, and Ray's own share (submit -> result back, minus the shard)."""

    index: int
    pid: int
    ip: str
    load_seconds: float
    shards: int = 0
    seconds: float = 0.0  # inside shards
    round_trip: float = 0.0  # from submitting each shard to holding its result
    scheduling: float = 0.0  # submit -> start (wall clocks: exact on one host only)
    transfer: float = 0.0  # end -> result back at the driver
    stats: dict = field(default_factory=dict)
    died: str | None = None

    @property
    def overhead(self) -> float:
        """Seconds of Ray scheduling and result transfer over this worker's shards."""
        return self.round_trip - self.seconds

    def line(self) -> str:
        share = self.overhead / self.round_trip if self.round_trip else 0.0
        extra = "".join(f", {v:g} {k}" for k, v in self.stats.items() if isinstance(v, int))
        state = f"; {self.died}" if self.died else ""
        return (f"worker {self.index} (pid {self.pid} on {self.ip}): loaded in {self.load_seconds:.1f} s, "
                f"{self.shards} shards in {self.seconds:.1f} s{extra}, Ray overhead {100 * share:.2f}%{state}")


@dataclass
class Outcome:
    """What a run did: per-worker timing, wall seconds, and the shards lost with their causes or never started."""

    timings: list[WorkerTiming]
    wall: float
    lost: list[tuple[Shard, str]] = field(default_factory=list)
    not_started: list[Shard] = field(default_factory=list)
    done: list[dict] = field(default_factory=list)  # per finished shard: shard, worker, seconds, round_trip, stats

    def totals(self) -> dict:
        """Every worker's stats summed."""
        out = {}
        for t in self.timings:
            for k, v in t.stats.items():
                out[k] = out.get(k, 0) + v
        return out

    def check(self) -> None:
        """Report (stderr, one line each) and raise for shards lost to dead workers or left unstarted."""
        if not (self.lost or self.not_started):
            return
        for shard, cause in self.lost:
            print(f"lost {shard.label}: {cause}", file=sys.stderr)
        for shard in self.not_started:
            print(f"not started (no worker left): {shard.label}", file=sys.stderr)
        names = "; ".join(s.label for s, _ in self.lost) or "none"
        more = f" and {len(self.not_started)} not started" if self.not_started else ""
        raise ScaleError(f"{len(self.lost)} shard(s) lost when workers died{more}: {names}; "
                         f"rerun the same command to finish them")


def death_cause(exc: BaseException) -> str:
    """A short cause of a worker's death from Ray's long message: the creation error, or the exit detail."""
    text = str(exc)
    if "creation task" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return f"failed to start: {lines[-1]}"
    if "OUT_OF_MEMORY" in text or "low on memory" in text:
        return "died: killed by Ray's memory monitor (out of memory)"
    marker = "Worker exit detail: "
    if marker not in text:
        return f"died: {first_line(exc)}"
    detail = text.split(marker, 1)[1].split(". ", 1)[0]
    # a process that vanishes (SIGKILL, the kernel's OOM killer, a segfault) only closes its connection
    return f"died: {detail} (killed, out of memory or crashed)" if "connection error" in detail else f"died: {detail}"


class Pool:
    """``workers.n`` ShardWorker actors, each holding ``factory()``'s work."""

    def __init__(self, ray, workers: Workers, factory: Callable[[], object]):
        self.ray = ray
        threads = workers.threads or default_threads(ray, workers)
        check_resources(ray, workers, threads)
        remote = ray.remote(max_restarts=0, max_task_retries=0)(ShardWorker)
        options = {"num_cpus": threads, "num_gpus": 1 if workers.gpu else 0}
        self.actors = [remote.options(**options).remote(factory, threads) for _ in range(workers.n)]
        try:
            infos = ray.get([a.info.remote() for a in self.actors])
        except ray.exceptions.RayError as exc:  # its model load raised, it died, or Ray could not place it
            self.kill()
            raise ScaleError(f"a worker {death_cause(exc)}") from None
        except BaseException:
            self.kill()
            raise
        self.timings = [WorkerTiming(i, d["pid"], d["ip"], d["load_seconds"]) for i, d in enumerate(infos)]
        self.infos = [d["work"] for d in infos]
        self.here = ray.util.get_node_ip_address()
        each = f"{threads} CPU{'s' if threads > 1 else ''}" + (" and 1 GPU" if workers.gpu else "")
        started = ", ".join(f"pid {t.pid} on {t.ip}" for t in self.timings)
        print(f"{workers.n} workers ({each} each): {started}", file=sys.stderr, flush=True)

    def same_info(self) -> dict:
        """The workers' common ``info()``; a one-line error naming what differs between two of them."""
        first = self.infos[0]
        for i, info in enumerate(self.infos[1:], 1):
            differ = sorted(k for k in set(first) | set(info) if first.get(k) != info.get(k))
            if differ:
                self.kill()
                raise ScaleError(f"workers 0 and {i} load different models or libraries (differ in: "
                                 f"{', '.join(differ)})")
        return first

    def run(self, shards: list[Shard], total: int, done: int = 0, progress: bool = True,
            postfix: Callable[[dict], dict] | None = None, tidy: Callable[[list], None] | None = None,
            unit: str = "prompt") -> Outcome:
        """Run ``shards`` (one in flight per worker) with a bar over ``total`` units (``done`` already done).
        ``tidy(unfinished shards)`` runs once no worker can write any more (their killed writes' temporary
        files are the caller's to remove). A shard that raises stops the run with its error."""
        bar = tqdm(total=total, initial=done, unit=unit, disable=not progress, dynamic_ncols=True)
        queue, inflight, idle = deque(shards), {}, list(range(len(self.actors)))[::-1]
        outcome, start, error = Outcome(self.timings, 0.0), time.perf_counter(), None
        try:
            while inflight or (queue and idle and error is None):
                while queue and idle and error is None:
                    w, shard = idle.pop(), queue.popleft()
                    inflight[self.actors[w].run.remote(shard.payload)] = (w, shard, time.time(), time.perf_counter())
                ready, _ = self.ray.wait(list(inflight), num_returns=1)
                w, shard, submitted, t0 = inflight.pop(ready[0])
                timing = self.timings[w]
                try:
                    result = self.ray.get(ready[0])
                except self.ray.exceptions.RayTaskError as exc:  # the shard's own code raised
                    error = error or exc
                    idle.append(w)
                    continue
                except self.ray.exceptions.RayError as exc:  # the worker died, its node, or Ray killed it for memory
                    timing.died = death_cause(exc)
                    outcome.lost.append((shard, f"worker {w} (pid {timing.pid} on {timing.ip}) {timing.died}"))
                    self._kill(self.actors[w])  # never handed another shard
                    continue
                round_trip = time.perf_counter() - t0
                self._account(timing, result, submitted, round_trip)
                outcome.done.append({"shard": shard, "worker": w, "seconds": result["seconds"],
                                     "round_trip": round_trip, "stats": result["stats"]})
                idle.append(w)
                bar.update(shard.units)
                if postfix is not None:
                    bar.set_postfix(postfix(outcome.totals()))
            outcome.not_started = list(queue) if error is None else []
        except BaseException:  # Ctrl-C: no worker may still be writing once we return
            self.kill()
            self._wait_gone(list(inflight))
            raise
        finally:
            bar.close()
            outcome.wall = time.perf_counter() - start
            if tidy is not None:
                tidy([s for s, _ in outcome.lost] + [s for _, s, _, _ in inflight.values()])
        if error is not None:
            raise remote_cause(error)
        return outcome

    @staticmethod
    def _account(timing: WorkerTiming, result: dict, submitted: float, round_trip: float) -> None:
        timing.shards += 1
        timing.seconds += result["seconds"]
        timing.round_trip += round_trip
        timing.scheduling += max(result["started"] - submitted, 0.0)
        timing.transfer += max(time.time() - result["ended"], 0.0)
        for k, v in result["stats"].items():
            timing.stats[k] = timing.stats.get(k, 0) + v

    def kill(self) -> None:
        """Kill every worker at once (SIGKILL: a shard being written leaves only its temporary file)."""
        for actor in self.actors:
            self._kill(actor)

    def _kill(self, actor) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # already dead, or its node gone
            pass

    def _wait_gone(self, refs) -> None:
        """Wait until the killed workers' shards have failed and their local processes have exited."""
        if refs:
            self.ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT_S)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for t in self.timings:
            while t.ip == self.here and pid_alive(t.pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    def close(self) -> None:
        """Stop the workers (after a run: they are idle)."""
        self.kill()
        self._wait_gone([])


def remote_cause(exc) -> BaseException:
    """The exception a shard raised inside its worker, as if raised here (the CLI reports it the same way)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def default_threads(ray, workers: Workers) -> int:
    """CPU threads per worker when not given: one beside a GPU, else the cluster's CPUs split evenly."""
    if workers.gpu:
        return 1
    return max(1, int(ray.cluster_resources().get("CPU", 1)) // workers.n)


def check_resources(ray, workers: Workers, threads: int) -> None:
    """Refuse a request the cluster cannot place (Ray would wait for it forever)."""
    have = ray.cluster_resources()
    need = {"CPU": workers.n * threads, "GPU": workers.n if workers.gpu else 0}
    for kind, n in need.items():
        if n > have.get(kind, 0):
            raise ScaleError(f"{workers.n} workers need {n:g} {kind}s ({threads} CPU threads and "
                             f"{int(workers.gpu)} GPU each) but the Ray cluster has {have.get(kind, 0):g}")


@contextmanager
def worker_pool(workers: Workers, factory: Callable[[], object]):
    """Ray and a ``Pool`` of started workers for one run; both are stopped afterwards."""
    with ray_session(workers) as ray:
        pool = Pool(ray, workers, factory)
        try:
            yield pool
        finally:
            pool.close()
