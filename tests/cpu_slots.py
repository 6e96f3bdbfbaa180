"""CPU slots for pytest-xdist: ``-n auto`` starts one worker more than there are CPUs, and every test holds one of
the CPU slots (one per CPU) while it runs, except the tests marked ``waits``.

Those tests spend most of their time asleep (loaders that sleep to be slow, time budgets, waiting for workers), and
on a machine with few CPUs each left its CPU idle for as long as it ran (on the 2-CPU CI machine, about an eighth of
the run). With a slot of their own they run beside as many CPU-bound tests as there are CPUs, and no more CPU-bound
tests than CPUs ever run at once, as before.

A slot is a POSIX record lock (``fcntl.lockf``) on one of the files of this run's slot folder: such a lock belongs
to the process that took it, so a DataLoader worker forked during a test (which may outlive it) never holds one.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

#: how often a worker waiting for a slot tries again
POLL_S = 0.02


class Slots:
    """``count`` slots shared by the xdist workers of the run ``run_id``."""

    def __init__(self, run_id: str, count: int) -> None:
        self.folder = Path(tempfile.gettempdir()) / f"pytest-cpu-slots-{run_id}"
        self.folder.mkdir(exist_ok=True)
        self.count = count
        self._held: int | None = None

    def acquire(self) -> None:
        while True:
            for i in range(self.count):
                fd = os.open(self.folder / f"slot{i}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue
                self._held = fd
                return
            time.sleep(POLL_S)

    def release(self) -> None:
        if self._held is not None:
            fd, self._held = self._held, None
            os.close(fd)  # closing the file releases this process's lock on it
