"""PackReader: records read in DataLoader workers (fork and spawn) and threads; its caches never outlive the file
they cache (a pack replaced at the same path is read fresh by a new reader, and a reader that opened the old file
raises, naming the pack); forking while other threads read (the children read, never hang, and a child that never
reads leaves the inherited environments alone)."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time

import pytest
from torch.utils.data import DataLoader

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.images import make_jpeg_folder, scan_image_folder
from lightning_gpu_boost.core.lmdb import StalePackError, pack_image_folder
from lightning_gpu_boost.datamodules import LMDBDataModule
from tests.core.lmdb.shared import Reads

linux_fork = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is Linux's here")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_under_fork_and_spawn(tree, tmp_path, context):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    lf.PackReader(path).read(0)  # opened in the parent before the workers start
    loader = DataLoader(Reads(path), batch_size=4, num_workers=2, multiprocessing_context=context)
    assert sorted(int(x) for b in loader for x in b) == sorted(
        label for _, label in scan_image_folder(tree)[0]
    )


def test_threads_read_through_their_own_transactions(tree, tmp_path):

    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    reader = lf.PackReader(path)
    expected = [reader.read(i) for i in range(len(reader))]
    got, txns = {}, []

    def work(k):
        got[k] = [reader.read(i) for i in range(len(reader))]
        txns.append(reader._txn())  # kept alive: ids of freed objects are reused

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(v == expected for v in got.values()) and len({id(t) for t in txns}) == 3


@pytest.fixture
def two_trees(tmp_path):
    small = dict(size_range=(40, 56, 32, 48), progress=False)
    return (make_jpeg_folder(tmp_path / "a", n=20, num_classes=2, **small),
            make_jpeg_folder(tmp_path / "b", n=12, num_classes=3, **small))  # fmt: skip


def _repack(tree, pack):
    os.remove(pack)
    pack_image_folder(tree, pack, progress=False)


def test_a_pack_rebuilt_at_the_same_path_is_read_fresh(two_trees, tmp_path):
    pack = pack_image_folder(two_trees[0], tmp_path / "p.lmdb", progress=False)
    old = LMDBDataModule(str(pack), image_size=16, batch_size=4, num_workers=0)
    assert (len(old.train_dataset()), old.num_classes) == (20, 2)
    next(iter(old.train_dataloader()))
    _repack(two_trees[1], pack)
    new = LMDBDataModule(str(pack), image_size=16, batch_size=4, num_workers=0)
    assert (len(new.train_dataset()), new.num_classes) == (12, 3)
    labels = [int(label) for _, batch in new.train_dataloader() for label in batch]
    assert sorted(set(labels)) == [0, 1, 2] and len(labels) == 12


def test_workers_of_a_reader_opened_before_the_rebuild_raise_naming_the_pack(two_trees, tmp_path):
    pack = pack_image_folder(two_trees[0], tmp_path / "p.lmdb", progress=False)
    old = LMDBDataModule(str(pack), image_size=16, batch_size=4, num_workers=2, persistent_workers=False)
    dataset = old.train_dataset()
    _repack(two_trees[1], pack)
    batches = iter(DataLoader(dataset, batch_size=4, num_workers=2))
    try:
        with pytest.raises(StalePackError, match="p.lmdb.*was replaced"):
            next(batches)
    finally:  # now, not whenever the traceback that holds the iterator is collected (10 s of joins then)
        batches._shutdown_workers()


def test_a_long_lived_reader_raises_once_its_file_is_replaced(two_trees, tmp_path, monkeypatch):
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader
    from lightning_gpu_boost.core.lmdb import sharded

    monkeypatch.setattr(lmdb_reader, "CHECK_EVERY", 2)
    pack = pack_image_folder(two_trees[0], tmp_path / "p.lmdb", progress=False)
    reader = sharded.open_pack(pack)
    reader.read(0)
    _repack(two_trees[1], pack)
    with pytest.raises(StalePackError, match="was replaced"):
        for i in range(4):
            reader.read(i)
    os.remove(pack)
    with pytest.raises(StalePackError, match="removed"):
        reader.check_current()


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


@linux_fork
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


@linux_fork
def test_a_child_that_never_reads_leaves_the_inherited_environments_alone(pack):
    from lightning_gpu_boost.core.lmdb import open_pack

    open_pack(pack).read(0)
    inherited, opened = _run_children(pack, 1, target=_report_inherited)[0]
    assert inherited >= 1 and opened == 0  # set aside, not closed: closed only where this process opens a pack


@linux_fork
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
