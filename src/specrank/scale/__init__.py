"""Shards on Ray workers: the one helper of every stage made of independent shards that each worker writes
atomically itself (``decode`` and lossy runs, ``verify-sweep`` cells, the drafter's self-distillation data).

The driver starts a local Ray (no dashboard, loopback only) or joins a cluster, starts N actors (one GPU each,
or ``threads`` CPUs each) and hands each actor one shard at a time. An actor builds its work once (loads the
models), then runs whole shards, each written atomically into storage the driver also sees. The driver only
schedules, shows one progress bar and collects per-worker timing. A worker that dies loses its one
unfinished shard: the other workers finish the rest, the lost prompts are reported, and a rerun of the same
command redoes exactly those. Ctrl-C kills the workers and waits for them to be gone before the caller
tidies the temporary files of their interrupted writes, so no partial shard is left.

Ray is an optional extra (``pip install 'specrank[ray]'``), imported only here and only when asked for.
"""

from specrank.scale.workers import Outcome, Pool, Shard, ShardWorker, WorkerTiming, worker_pool
from specrank.scale.session import (EXTRA, ScaleError, Workers, add_worker_arguments, check_ray_address, import_ray,
                                    preflight, ray_session, workers_from_args)

__all__ = ["EXTRA", "Outcome", "Pool", "ScaleError", "Shard", "ShardWorker", "WorkerTiming", "Workers",
           "add_worker_arguments", "check_ray_address", "import_ray", "preflight", "ray_session", "worker_pool",
           "workers_from_args"]
