"""Every test starts without an MLflow tracking URI and leaves none behind.

MLflow keeps the URI in a global and in ``$MLFLOW_TRACKING_URI`` (``mlflow.set_tracking_uri`` writes
both), so one test that sets it would send every later test's default store there; and a developer's
own ``$MLFLOW_TRACKING_URI`` must not receive test runs.
"""

import os
import sys
from pathlib import Path

import pytest

# Under pytest-xdist (`make test` runs two workers on two cores) each worker computes on one thread: two torch
# thread pools of two threads each would fight over the cores. Set before torch is first imported; the CLI's own
# --threads still sets what a test asks for.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(key, "1")
    # Ray starts its workers at niceness 15: beside the other xdist worker (niceness 0) a Ray test would wait for
    # it to finish. Its local test clusters run at the tests' own priority.
    os.environ.setdefault("RAY_worker_niceness", "0")

MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@pytest.fixture(autouse=True)
def no_mlflow_uri(monkeypatch):
    for key in MLFLOW_ENV:
        monkeypatch.delenv(key, raising=False)
    yield
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
    for key in MLFLOW_ENV:
        os.environ.pop(key, None)


@pytest.fixture(autouse=True)
def benchmark_results_elsewhere(monkeypatch, tmp_path_factory):
    """Benchmarks run by tests (tiny shapes) write their results file outside ``benchmarks/results``."""
    monkeypatch.setenv("SPECRANK_BENCH_RESULTS", str(tmp_path_factory.mktemp("bench-results")))


def pytest_configure(config):
    """Refuse, in one line, the pytest and pytest-xdist releases that do not keep an ``xdist_group`` on one worker.

    A module that shares a costly fixture carries an ``xdist_group`` mark; pytest-xdist keeps a group on one worker
    by adding ``@<group>`` to its tests' ids, which pytest 9.2 no longer lets pytest-xdist 3.8 do
    (pytest-dev/pytest-xdist#1386): each grouped module would build its fixture on both workers. Without xdist
    (an engine's own venv running its marked tests) there is no group to keep."""
    try:
        import xdist
    except ImportError:
        return

    versions = [tuple(int(p) for p in v.split(".")[:2]) for v in (pytest.__version__, xdist.__version__)]
    if config.getoption("dist", "no") == "loadgroup" and versions[0] >= (9, 2) and versions[1] <= (3, 8):
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} does not keep "
                                "--dist loadgroup groups together (pytest-dev/pytest-xdist#1386): install the test "
                                "extra's pytest (<9.2)")


def pytest_sessionstart(session):
    """Under pytest-xdist, the controller compiles the numba kernels in a process of its own while the workers
    collect (``tests/warm_kernels.py``): in a fresh clone the workers' first tests then find them cached. Should it
    fail, each process compiles what it calls, as it would without it."""
    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    import subprocess

    config.warm_kernels = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("warm_kernels.py"))], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1"))


def pytest_unconfigure(config):
    warm = getattr(config, "warm_kernels", None)
    if warm is not None and warm.poll() is None:
        warm.kill()
        warm.wait()


# The modules whose tests take tens of seconds each (a study, Ray clusters, a subprocess killed mid-run).
LONG_MODULES = ("test_study", "test_scale", "test_optional_packages", "test_tracking_browse")


def pytest_collection_modifyitems(items):
    """The long tests first (those that run the embedded SmolLM2, marked ``slow``, and the modules above): two
    xdist workers then end together instead of one waiting on a long test handed out last. Order within each part
    is kept, so the run is the same on every worker."""
    def long(item) -> bool:
        return item.get_closest_marker("slow") is not None or item.module.__name__ in LONG_MODULES
    items.sort(key=lambda item: not long(item))
