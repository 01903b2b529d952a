"""``mlflow server`` or ``mlflow ui`` as a child process on 127.0.0.1 (the tests' tracking server, the
screenshot script's UI): started on a free port, waited for until ``/health`` answers, stopped with its workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_mlflow(command: str, args: list[str], log: Path, cwd=None, start_timeout: float = 90.0):
    """Run ``mlflow COMMAND ARGS`` (``server`` or ``ui``) on a free local port, output to ``log``; yield its URL.

    A process that exits or does not answer within ``start_timeout`` seconds is a RuntimeError ending with the
    tail of its log. The process group is stopped on exit (the server's uvicorn worker shares it).
    """
    port = free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", "mlflow", command, "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           *args]
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=1):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        tail = Path(log).read_bytes()[-2000:].decode(errors="replace")
                        raise RuntimeError(f"mlflow {command} did not start: {tail}") from None
                    time.sleep(0.25)
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
