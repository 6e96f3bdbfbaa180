"""TCP ports for the test servers and DDP stores that run beside each other under pytest-xdist.

A port taken from the kernel (``bind(("127.0.0.1", 0))``) and closed again is free only for a moment: it lies in the
kernel's ephemeral range, where every outgoing connection and every gloo pair socket of a DDP job running in another
xdist worker is given its own port. A job's store could then meet a stranger's socket, and a two-node run hung for
240 s in CI. These ports lie below that range, in a block of their own per xdist worker, each checked free."""

from __future__ import annotations

import itertools
import os
import random
import socket

#: ports per xdist worker; the blocks start at BASE
BLOCK, BASE = 1000, 20000
_next = itertools.count(random.randrange(BLOCK))


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, outside the kernel's ephemeral range where it can (else one
    the kernel picks), from this xdist worker's own block (``gw3``: ports 23000-23999)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = BASE + BLOCK * (int(worker[2:]) if worker[2:].isdigit() else 0)
    if start + BLOCK <= _ephemeral_low():
        for _ in range(BLOCK):
            port = start + next(_next) % BLOCK
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
