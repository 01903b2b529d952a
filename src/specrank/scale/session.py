"""Ray for one run: the ``Workers`` asked for, Ray imported or a one-line error naming the extra, a cluster
address checked before any model loads, and a local Ray kept on the loopback interface."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

EXTRA = "pip install 'specrank[ray]'"
CONNECT_TIMEOUT_S = 5.0  # an address that does not answer in this long is unreachable


class ScaleError(ValueError):
    """Workers cannot run as asked (no Ray, an unreachable cluster, too few resources), or shards were lost."""


@dataclass(frozen=True)
class Workers:
    """``n`` Ray workers at ``address`` (None: a local Ray), each with one GPU (``gpu``) or ``threads`` CPU threads
    (default: the cluster's CPUs split between the workers)."""

    n: int
    address: str | None = None
    threads: int | None = None
    gpu: bool = False

    def __post_init__(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise ScaleError(f"--workers must be a positive integer, got {self.n!r}")
        if self.threads is not None and self.threads < 1:
            raise ScaleError(f"--threads must be >= 1, got {self.threads}")


def add_worker_arguments(parser) -> None:
    """``--workers`` and ``--ray-address`` (``--threads``, each command's own, is then per worker)."""
    parser.add_argument("--workers", type=int, default=None,
                        help=f"run the shards on N Ray workers: one GPU each with --device cuda, else --threads CPU "
                             f"threads each (default: the CPUs split between them); needs {EXTRA}")
    parser.add_argument("--ray-address", default=None,
                        help="with --workers: join this Ray cluster (HOST:PORT, ray://HOST:PORT or auto) instead of "
                             "starting a local Ray; the output directory must be on storage every node sees")


def workers_from_args(args) -> Workers | None:
    """The ``Workers`` asked for on the command line, or None (one process)."""
    if args.workers is None:
        if args.ray_address is not None:
            raise ScaleError("--ray-address needs --workers N")
        return None
    gpu = str(getattr(args, "device", "cpu")).startswith("cuda")
    if gpu and str(args.device) != "cuda":
        raise ScaleError(f"--workers gives each worker one GPU of its own: use --device cuda, not {args.device}")
    return Workers(args.workers, args.ray_address, args.threads, gpu)


def import_ray(local: bool):
    """The ``ray`` module, or a one-line error naming the extra. A local Ray is kept on the loopback interface."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reports to the network
    if local and "ray" not in sys.modules:
        # Ray advertises the host's outward address unless it believes clusters are off; then every
        # server it starts binds 127.0.0.1 (ray._private.services.get_node_ip_address).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise ScaleError(f"--workers needs Ray, an optional extra: {EXTRA}") from None
    return ray


def check_ray_address(address: str) -> None:
    """Refuse, in one line, a ``HOST:PORT`` / ``ray://HOST:PORT`` address that nothing answers on."""
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise ScaleError(f"--ray-address {address!r}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ScaleError(f"--ray-address {address}: cannot reach a Ray cluster there ({exc.strerror or exc})") from None


def preflight(workers: Workers):
    """Ray imported and the cluster's address answering, or a one-line error: call before any model loads."""
    ray = import_ray(local=workers.address is None)
    if workers.address is not None:
        check_ray_address(workers.address)
    return ray


@contextmanager
def ray_session(workers: Workers, num_cpus: int | None = None):
    """Ray for the duration of a run: joined at ``workers.address``, a fresh local one (temporary files and logs
    in a temporary directory, removed afterwards), or the caller's own if Ray is already initialized."""
    ray = preflight(workers)
    if ray.is_initialized():  # a notebook's or a test's Ray: theirs to shut down
        yield ray
        return
    temp = None
    try:
        if workers.address is not None:
            ray.init(address=workers.address, configure_logging=False)
        else:
            temp = tempfile.mkdtemp(prefix="specrank-ray-")
            ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp, configure_logging=False)
    except (ConnectionError, RuntimeError, TimeoutError) as exc:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
        raise ScaleError(f"cannot start Ray: {first_line(exc)}") from None
    try:
        yield ray
    finally:
        ray.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


