"""The results file every benchmark writes: ``benchmarks/results/NAME.json`` with the command, the commit, the
machine, the date and the figures, so a number quoted in the docs names the file it comes from (docs/benchmarks.md).

``SPECRANK_BENCH_RESULTS`` moves the directory (the tests point it at a temporary one, so a tiny-shape run never
overwrites a real result)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from specrank.atomic import atomic_write

ROOT = Path(__file__).resolve().parent.parent


def results_dir() -> Path:
    return Path(os.environ.get("SPECRANK_BENCH_RESULTS", ROOT / "benchmarks" / "results"))


def commit() -> str:
    """The checkout's commit, ``+dirty`` when tracked files outside ``benchmarks/results`` changed (a benchmark that
    writes its results file after each part must not call its own later writes dirty); ``unknown`` outside a git
    checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def cpu_model() -> str:
    """The CPU's model as ``lscpu`` names it (this machine's kind varies: an AVX2 EPYC or an AVX-512/AMX Xeon, and
    timings differ between them), ``unknown`` where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name:")),
                "unknown")


def machine() -> dict:
    info = {"platform": platform.platform(), "processor": platform.machine(), "cpu_model": cpu_model(),
            "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def write_results(name: str, figures, argv=None) -> Path:
    """Write ``figures`` (JSON-serializable) as ``results_dir()/NAME.json`` atomically; return the path."""
    argv = sys.argv if argv is None else argv
    record = {"command": "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(argv[0], ROOT), *argv[1:]]),
              "commit": commit(), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "figures": figures}
    text = json.dumps(record, indent=2, default=float) + "\n"
    return atomic_write(results_dir() / f"{name}.json", lambda tmp: Path(tmp).write_text(text))
