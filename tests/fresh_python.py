"""Run ``python -c CODE`` as a process of its own that imports Lightning and this package afresh, without paying for
torch's import each time.

Tests of import-time behaviour (which of the package and Lightning is imported first, a script that never imports
the package) need a process where neither Lightning nor the package has been imported: ``tests/warm_python.py``
forks from one that has imported both, so it cannot serve them. Here the process is forked from a server that has
imported torch and ``torch._dynamo`` (about 4 of the 6 s of CPU that ``import lightning.pytorch`` costs a fresh
interpreter on the 2-CPU CI machine; Lightning's import pulls ``torch._dynamo`` in) and ``tests/warm_python.py``
(whose ``run_as_main`` runs each code string), nothing of Lightning, torchmetrics or this package.
``torch._dynamo`` imports pynvml where it is installed, so the test of what the package's own import pulls in keeps
a fresh interpreter (``tests/test_package.py``). The server starts no thread before it forks. Each run gets its own
working folder, environment, ``sys.path`` (``''`` first and the run's ``PYTHONPATH``, as for ``python -c``),
``__main__`` namespace and exit status.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: what the server imports before it forks: torch and what Lightning's import spends most of its time on, nothing
#: of Lightning, torchmetrics (which imports matplotlib) or this package
PRELOAD = ["torch", "torch._dynamo"]

_SERVER = r"""
import json, os, sys
base = [p for p in sys.path if p]
sys.path.insert(0, ROOT)
from tests.warm_python import run_as_main  # imports no torch; the runs' sys.path is their own
for name in PRELOAD:
    __import__(name)
import gc
gc.collect()
gc.freeze()  # as tests/conftest.py does: no full collection of a run walks what the server imported
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = ["", *extra, *base]
        run_as_main("code", req["code"])
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
"""

_lock = threading.Lock()
_server: subprocess.Popen | None = None


def _start() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # each run brings its own
        _server = subprocess.Popen(
            [sys.executable, "-c", f"PRELOAD, ROOT = {PRELOAD!r}, {str(ROOT)!r}\n" + _SERVER], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir(),
        )  # fmt: skip
        atexit.register(_stop, _server)
    return _server


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()


def _read(server: subprocess.Popen, timeout: float) -> dict | None:
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    return json.loads(server.stdout.readline()) if ready else None


def run_fresh(code: str, *, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
              timeout: float = 120) -> tuple[int, str]:  # fmt: skip
    """Run ``code`` as ``python -c code`` would in ``cwd`` (default: this process's) with ``env`` (default: this
    process's); returns the exit status and everything it wrote to stdout and stderr."""
    with tempfile.NamedTemporaryFile(prefix="fresh-python-", suffix=".log", delete=False) as f:
        log = f.name
    request = {"code": code, "cwd": str(cwd or os.getcwd()), "env": dict(os.environ if env is None else env),
               "log": log}  # fmt: skip
    try:
        with _lock:
            server = _start()
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            pid = _read(server, 60)["pid"]
            done = _read(server, timeout)
            if done is None:  # a hang: kill the run, the server reports it and serves the next
                os.kill(pid, signal.SIGKILL)
                _read(server, 10)
                return -9, Path(log).read_text(errors="replace") + f"\n(timed out after {timeout} s)"
            return done["status"], Path(log).read_text(errors="replace")
    finally:
        os.unlink(log)
