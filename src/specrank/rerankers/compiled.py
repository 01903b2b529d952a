"""Compiled inference of a LightGBM booster: treelite translates the trees to C, tl2cgen builds a shared
library once (cached by the model text's sha256 under ``$SPECRANK_CACHE/treelite``), and rows are scored by
calling the library's per-row ``predict`` through ctypes into preallocated buffers.

Why not ``treelite.gtil.predict`` or tl2cgen's own ``Predictor``: on ~10 rows their per-call setup (a
DMatrix, a thread pool, a JSON config) costs more than the trees (``benchmarks/bench_online.py`` times
them). The per-row call sums the trees in LightGBM's order, so margins match ``Booster.predict`` to
rounding. A large ensemble compiles to megabytes of branches, and single-threaded LightGBM can then be
as fast, so ``faster_than_lightgbm`` times both at load. Where treelite, tl2cgen or a C compiler is
missing, ``compile_booster`` says why and the reranker keeps LightGBM's own ``predict``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specrank.files import cache_root

MISSING = -1  # tl2cgen's Entry union: an int of -1 in the low word marks a missing value


def cache_dir() -> Path:
    return cache_root() / "treelite"


def model_sha256(booster) -> str:
    return hashlib.sha256(booster.model_to_string().encode()).hexdigest()


class CompiledTrees:
    """A booster's trees in a shared library: ``raw(m)`` (n, F) float64 -> (n,) margins (no sigmoid)."""

    def __init__(self, path: Path, n_features: int, sha256: str):
        self.path, self.sha256 = Path(path), sha256
        self.lib = ctypes.CDLL(str(path))
        if self.lib.get_num_feature() != n_features:
            raise OSError(f"{path.name}: built for {self.lib.get_num_feature()} features, the model has {n_features}")
        self.fn = self.lib.predict
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.fn.restype = None
        self.n_features = n_features
        self._grow(16)

    def _grow(self, rows: int) -> None:
        self.entries = np.zeros((rows, self.n_features), np.float64)  # tl2cgen Entry = 8 bytes (float64 model)
        self.low = self.entries.view(np.int32).reshape(rows, self.n_features, 2)[..., 0]  # low word (little endian)
        self.out = np.zeros(rows, np.float64)

    def raw(self, m: np.ndarray) -> np.ndarray:
        """(n,) margins of the rows of ``m`` (n, F); None when a present value's low word reads as missing."""
        n = len(m)
        if n > len(self.out):
            self._grow(max(n, 2 * len(self.out)))
        entries, low, out = self.entries[:n], self.low[:n], self.out[:n]
        entries[:] = m
        if (low == MISSING).any():  # a present float64 whose low word is -1 would read as missing
            return None
        low[np.isnan(m)] = MISSING
        out[:] = 0.0
        base, row_bytes, out_base = entries.ctypes.data, 8 * self.n_features, out.ctypes.data
        for i in range(n):  # one C call per row; each sums every tree
            self.fn(base + i * row_bytes, 1, out_base + 8 * i)
        return out.copy()


def compile_booster(booster, cache: Path | None = None) -> tuple[CompiledTrees | None, str]:
    """(compiled trees, how) or (None, why not): the library is built once per model sha256."""
    sha = model_sha256(booster)
    path = Path(cache or cache_dir()) / f"{sha}.so"
    try:
        if not path.exists():
            build(booster, path)
        return CompiledTrees(path, booster.num_feature(), sha), f"compiled trees ({path})"
    except Exception as exc:  # noqa: BLE001  (no treelite, no compiler, a failed build: LightGBM predicts)
        return None, f"LightGBM predict (no compiled trees: {type(exc).__name__}: {str(exc).splitlines()[0][:160]})"


def build(booster, path: Path) -> None:
    """Translate with treelite, compile with tl2cgen into a temporary file, then move it onto ``path``."""
    import tl2cgen
    import treelite

    print(f"compiling {booster.num_trees()} trees to {path} (once per model)", file=sys.stderr, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        with native_output_to_stderr():
            model = treelite.frontend.from_lightgbm(booster)
            jobs = max(1, min(8, booster.num_trees() // 100))
            tl2cgen.export_lib(model, toolchain=os.environ.get("CC", "gcc"), libpath=tmp,
                               params={"parallel_comp": jobs} if jobs > 1 else {}, nthread=1, verbose=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def native_output_to_stderr():
    """Send what native code writes to standard output (treelite's and tl2cgen's C++ log lines) to standard error,
    so that a command's standard output (a benchmark's JSON) stays its own."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def faster_than_lightgbm(trees: CompiledTrees, booster, rows: int, calls: int = 30) -> tuple[bool, str]:
    """(the library is faster, the timing line): median of ``calls`` scorings of ``rows`` random rows each."""
    m = np.random.default_rng(0).normal(size=(rows, trees.n_features))

    def median_ms(fn) -> float:
        fn()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1000 * float(np.median(times))

    lib = median_ms(lambda: trees.raw(m))
    own = median_ms(lambda: booster.predict(m, raw_score=True, num_threads=1))
    return lib < own, f"{rows} rows: library {lib:.3f} ms, LightGBM {own:.3f} ms"
