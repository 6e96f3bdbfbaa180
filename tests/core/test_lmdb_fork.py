"""Forking a process that reads a pack in other threads: the children read (no hang), a child that never reads
never touches the inherited environments, and a fork that cannot wait says so in the child instead of hanging."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is Linux's here")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    root = tmp_path_factory.mktemp("fork")
    src = make_jpeg_folder(root / "src", n=24, num_classes=2, size_range=(64, 80, 48, 64), progress=False)
    return str(pack_image_folder(src, root / "train.lmdb", progress=False))


def _read_label(pack: str, index: int, out) -> None:
    from lightning_gpu_boost.core.lmdb import open_pack

    try:
        out.put(open_pack(pack).read(index, lambda r: r.label))
    except Exception as e:  # the parent asserts on what came back
        out.put(repr(e))


def _run_children(pack: str, n: int, target=_read_label) -> list:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    got = []
    for i in range(n):
        child = ctx.Process(target=target, args=(pack, i % 24, out))
        child.start()
        child.join(timeout=30)
        if child.exitcode is None:  # hung: clean up, then fail
            child.kill()
            child.join()
            pytest.fail(f"child {i} forked while another thread read the pack hung")
        got.append(out.get(timeout=10))
    return got


def test_children_forked_while_another_thread_reads_the_same_pack_read_it(pack):
    """py-lmdb's close waits for the calls other threads are in; a child inherits them unfinished. Before the fork
    gate, every one of 100 children forked beside a reading thread hung when it opened the pack."""
    from lightning_gpu_boost.core.lmdb import open_pack

    reader = open_pack(pack)
    expected = [reader.read(i % 24, lambda r: r.label) for i in range(12)]
    stop = threading.Event()

    def spin() -> None:  # as DALI's reading threads do
        r, i = open_pack(pack), 0
        while not stop.is_set():
            r.read(i % len(r))
            i += 1

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    try:
        assert _run_children(pack, 12) == expected
    finally:
        stop.set()
        for t in threads:
            t.join()


def _report_inherited(pack: str, index: int, out) -> None:
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader

    out.put((len(lmdb_reader._INHERITED), len(lmdb_reader._ENVS)))


def test_a_child_that_never_reads_leaves_the_inherited_environments_alone(pack):
    from lightning_gpu_boost.core.lmdb import open_pack

    open_pack(pack).read(0)
    inherited, opened = _run_children(pack, 1, target=_report_inherited)[0]
    assert inherited >= 1 and opened == 0  # set aside, not closed: closed only where this process opens a pack


def test_a_fork_that_cannot_wait_for_a_read_says_so_in_the_child(pack, monkeypatch):
    """A thread stuck inside an LMDB call (a storage stall): the fork goes on after FORK_WAIT_S, and the child's
    first read raises an error that names the way out instead of hanging."""
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader
    from lightning_gpu_boost.core.lmdb import sharded

    sharded.open_pack(pack).read(0)
    monkeypatch.setattr(lmdb_reader, "FORK_WAIT_S", 0.2)
    inside, leave = threading.Event(), threading.Event()

    def stuck() -> None:
        with lmdb_reader._GATE[0]:
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=stuck, daemon=True)
    t.start()
    inside.wait(10)
    try:
        start = time.monotonic()
        got = _run_children(pack, 1)[0]
        assert time.monotonic() - start >= 0.2
        assert "forked while another thread" in got and "multiprocessing_context='spawn'" in got
    finally:
        leave.set()
        t.join()
    assert _run_children(pack, 1) == [sharded.open_pack(pack).read(0, lambda r: r.label)]  # quiet again
