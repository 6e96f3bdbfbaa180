"""Run a script or a code string as a program of its own, in a process forked from one that has imported torch and
Lightning already (multiprocessing's fork server, preloaded): each run is a separate process with its own working
folder, environment, ``__main__`` and exit status, as ``python script.py`` would be, without paying the ~4 s that
importing torch and Lightning costs a fresh interpreter on the 2-core CI machine.

The fork server itself runs nothing but imports, so no thread pool of torch's exists in it when it forks.
Used by the docs' tests (code blocks and examples); tests of import-time behaviour keep fresh interpreters."""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = ["torch", "lightning.pytorch", "lightning_gpu_boost"]


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _main(kind: str, what: str, cwd: str, env: dict[str, str], log: str, args: tuple[str, ...] = ()) -> None:
    import gc
    import warnings

    gc.freeze()  # as tests/conftest.py does: no full collection of this run walks what the server imported

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    warnings.simplefilter("ignore")  # as PYTHONWARNINGS=ignore does for a fresh interpreter
    multiprocessing.set_start_method(None, force=True)  # the platform's default, not the fork server it came from
    sys.path.insert(0, cwd if kind == "code" else str(Path(what).parent))
    sys.path.insert(1, str(ROOT))
    run_as_main(kind, what, args)


def run_as_main(kind: str, what: str, args: tuple[str, ...] = ()) -> NoReturn:
    """Run a script (``kind="path"``) or a code string (``"code"``) as ``__main__`` with ``args`` on its command
    line, then end this process with its exit status, as ``python`` would (also used by ``tests/fresh_python.py``)."""
    import runpy
    import traceback

    sys.argv = [what, *args] if kind == "path" else ["-c", *args]
    code = 0
    try:
        if kind == "path":
            runpy.run_path(what, run_name="__main__")
        else:
            exec(compile(what, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class WarmProcess:
    """A script (``path``, as ``__main__``) or ``code`` (as ``python -c``) running in ``cwd`` with ``env`` (default:
    this process's) in a process forked from the preloaded fork server; :meth:`wait` gives its exit status and
    everything it wrote to stdout and stderr. Several run at once (the ranks of a DDP job)."""

    def __init__(self, *, path: str | os.PathLike | None = None, code: str | None = None, cwd: str | os.PathLike,
                 env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:  # fmt: skip
        if (path is None) == (code is None):
            raise ValueError("give path or code")
        kind, what = ("path", str(path)) if path is not None else ("code", code)
        with tempfile.NamedTemporaryFile(prefix="warm-python-", suffix=".log", delete=False) as f:
            self.log = f.name
        self.proc = _context().Process(target=_main, args=(kind, what, str(cwd), dict(env or os.environ), self.log,
                                                                     tuple(args)))
        self.proc.start()

    def wait(self, timeout: float = 240) -> tuple[int, str]:
        try:
            self.proc.join(timeout)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
                return -9, Path(self.log).read_text(errors="replace") + f"\n(timed out after {timeout} s)"
            return self.proc.exitcode, Path(self.log).read_text(errors="replace")
        finally:
            os.unlink(self.log)


def run_python(
    *, path: str | os.PathLike | None = None, code: str | None = None, cwd: str | os.PathLike,
    env: dict[str, str] | None = None, timeout: float = 240, args: tuple[str, ...] = (),
) -> tuple[int, str]:  # fmt: skip
    """Run ``path`` (a script, as ``__main__``) or ``code`` (as ``python -c``) with command-line ``args`` in ``cwd``
    with ``env`` (default: this process's); returns the exit status and everything it wrote to stdout and stderr."""
    return WarmProcess(path=path, code=code, cwd=cwd, env=env, args=args).wait(timeout)
