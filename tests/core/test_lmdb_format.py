from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.cli import main
from lightning_gpu_boost.core import lmdb_format as lf
from lightning_gpu_boost.core.images import make_jpeg_folder, scan_image_folder
from tests.helpers import ROOT


@pytest.fixture
def tree(tmp_path):
    return make_jpeg_folder(
        tmp_path / "src", n=24, num_classes=3, size_range=(64, 80, 48, 64), workers=2, progress=False
    )


def _records(path):
    reader = lf.PackReader(path)
    return [reader.read(i, lambda r: (bytes(r.payload), r.label)) for i in range(len(reader))]


@pytest.mark.parametrize("workers", [None, 0, 3])
def test_round_trip_is_byte_identical(tree, tmp_path, workers):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", commit_every=5, progress=False, workers=workers)
    samples, classes, _ = scan_image_folder(tree)
    assert _records(path) == [(open(p, "rb").read(), label) for p, label in samples]
    reader = lf.PackReader(path, check_crc=True)
    assert reader.meta("classes") == classes and reader.meta("class_to_idx")["class_002"] == 2
    assert lf.verify(path)["ok"] and not os.path.exists(f"{path}.partial")


def test_general_samples_never_pickle(tmp_path):
    samples = [
        {"x": np.arange(6, dtype=np.float16).reshape(2, 3), "t": torch.ones(2), "n": i, "s": "ü"}
        for i in range(4)
    ]
    path = lf.pack_dataset(samples, tmp_path / "s.lmdb", progress=False)
    got = lf.PackReader(path).read(3, lambda r: lf.unpack_sample(r.payload))
    assert (
        got["n"] == 3 and got["s"] == "ü" and got["x"].dtype == np.float16 and got["t"].tolist() == [1.0, 1.0]
    )
    with pytest.raises(TypeError, match="Cannot store a object"):
        lf.pack_sample({"bad": object()})


class Reads(Dataset):
    def __init__(self, path):
        self.reader = lf.PackReader(path)

    def __len__(self):
        return len(self.reader)

    def __getitem__(self, i):
        return torch.tensor(self.reader.read(i, lambda r: r.label))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_under_fork_and_spawn(tree, tmp_path, context):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    lf.PackReader(path).read(0)  # opened in the parent before the workers start
    loader = DataLoader(Reads(path), batch_size=4, num_workers=2, multiprocessing_context=context)
    assert sorted(int(x) for b in loader for x in b) == sorted(
        label for _, label in scan_image_folder(tree)[0]
    )


def test_sigkill_then_resume_equals_an_uninterrupted_pack(tree, tmp_path):
    dst = tmp_path / "killed.lmdb"
    script = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from lightning_gpu_boost.core import lmdb_format as lf
commit = lf.PackWriter.commit
def slow(self):
    commit(self)
    print("committed", self.next_index, flush=True)
    time.sleep(0.3)
lf.PackWriter.commit = slow
lf.pack_image_folder({str(tree)!r}, {str(dst)!r}, commit_every=3, progress=False)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("committed") and int(line.split()[1]) >= 9:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not dst.exists() and os.path.exists(f"{dst}.partial")
    with pytest.raises(FileExistsError, match="interrupted pack; pass resume=True"):
        lf.pack_image_folder(tree, dst, progress=False)
    with pytest.raises(FileNotFoundError, match="--resume"):
        lf.PackReader(dst)
    lf.pack_image_folder(tree, dst, resume=True, progress=False)
    clean = lf.pack_image_folder(tree, tmp_path / "clean.lmdb", progress=False)
    assert lf.verify(dst)["ok"] and _records(dst) == _records(clean)


def test_flipped_byte_names_the_record(tree, tmp_path):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    target = open(scan_image_folder(tree)[0][5][0], "rb").read()[
        -200:-160
    ]  # entropy-coded: unique to record 5
    data = bytearray(path.read_bytes())
    assert data.count(target) == 1
    at = data.find(target)
    data[at + 3] ^= 0xFF
    broken = tmp_path / "broken.lmdb"
    broken.write_bytes(bytes(data))
    summary = lf.verify(broken)
    assert not summary["ok"] and any("Record 5 is corrupt" in e for e in summary["errors"])
    with pytest.raises(lf.CorruptRecordError, match="Record 5 is corrupt"):
        lf.PackReader(broken, check_crc=True).read(5)


def test_truncated_file_is_an_error(tree, tmp_path):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    truncated = tmp_path / "truncated.lmdb"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(lf.CorruptRecordError, match="is truncated"):
        lf.verify(truncated)


def test_clear_errors(tree, tmp_path):
    with pytest.raises(FileNotFoundError, match="No LMDB pack at"):
        lf.PackReader(tmp_path / "missing.lmdb")
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    with pytest.raises(IndexError, match="Index 24 is out of range .* with 24 records"):
        lf.PackReader(path).read(24)
    with pytest.raises(FileExistsError, match="already exists"):
        lf.pack_image_folder(tree, path, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no class folders"):
        lf.pack_image_folder(tmp_path / "empty", tmp_path / "e.lmdb", progress=False)


def test_non_image_files_skipped_and_non_ascii_paths(tree, tmp_path):
    src = tmp_path / "bilder_ü"
    shutil.copytree(tree, src)
    (src / "class_000" / "notes.txt").write_text("not an image")
    os.rename(src / "class_001", src / "klasse_ä")
    path = lf.pack_image_folder(src, tmp_path / "päck.lmdb", progress=False)
    reader = lf.PackReader(path)
    assert reader.meta("ignored_files") == 1 and "klasse_ä" in reader.meta("classes") and len(reader) == 24


def test_cli_pack_and_verify(tree, tmp_path, capsys):
    assert main(["pack", str(tree), str(tmp_path / "cli.lmdb"), "--commit-every", "4"]) == 0
    assert main(["verify", str(tmp_path / "cli.lmdb")]) == 0
    assert '"ok": true' in capsys.readouterr().out


def test_shards_with_a_manifest_read_like_one_pack(tree, tmp_path):
    from lightning_gpu_boost.datamodules import LMDBDataModule

    one = lf.pack_image_folder(tree, tmp_path / "one.lmdb", progress=False)
    sharded = lf.pack_image_folder(tree, tmp_path / "sharded.lmdb", shard_size=10, progress=False)
    assert lf.is_manifest(sharded) and [lf.shard_path(sharded, k).exists() for k in range(4)] == [
        True
    ] * 3 + [False]
    reader = lf.open_pack(sharded)
    ids = [reader.read(i, lambda r: (bytes(r.payload), r.label)) for i in range(len(reader))]
    assert ids == _records(one)
    summary = lf.verify(sharded)
    assert summary["ok"] and summary["shards"] == 3 and summary["records"] == 24
    images, labels = next(
        iter(LMDBDataModule(str(sharded), image_size=16, batch_size=24, num_workers=0).train_dataloader())
    )
    assert sorted(labels.tolist()) == sorted(label for _, label in scan_image_folder(tree)[0])
    # resume: a lost manifest and a lost last shard are rebuilt, finished shards are kept
    mtime = lf.shard_path(sharded, 0).stat().st_mtime_ns
    sharded.unlink()
    lf.shard_path(sharded, 2).unlink()
    lf.pack_image_folder(tree, sharded, shard_size=10, resume=True, progress=False)
    assert lf.shard_path(sharded, 0).stat().st_mtime_ns == mtime and lf.verify(sharded)["ok"]
    assert main(["verify", str(sharded)]) == 0


def test_small_packs_are_read_ahead_whole_at_open(tree, tmp_path, monkeypatch):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    advised = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: advised.append(advice) or real(fd, offset, length, advice))
    lf.close_readers(path)
    lf.PackReader(path, readahead=False).read(0)
    assert advised == []  # readahead=False: the caller expects random reads of a large pack
    lf.close_readers(path)
    lf.PackReader(path).read(0)
    assert advised == [os.POSIX_FADV_WILLNEED]
    lf.close_readers(path)


def test_reading_threads_follow_the_file_size():
    assert lf.pack_workers([4_000] * 10) == 0 and lf.pack_workers([100_000] * 10) == 2 and lf.pack_workers([]) == 2


def test_a_file_that_grows_while_packed_is_an_error(tree, tmp_path):
    path = next(p for p in sorted(tree.rglob("*.jpg")))
    size = path.stat().st_size
    assert len(lf._read_record(str(path), 3, size)) == lf.HEADER.size + size
    with open(path, "ab") as f:
        f.write(b"more")
    with pytest.raises(OSError, match="changed while it was packed"):
        lf._read_record(str(path), 3, size)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fallocate is Linux's")
def test_pack_space_is_reserved_up_front(tree, tmp_path):
    writer = lf.PackWriter(tmp_path / "p.lmdb", "fp", reserve=8 << 20)
    assert os.stat(writer.partial).st_blocks * 512 >= 8 << 20  # allocated, though nothing is written yet
    writer.add(b"x" * 100, 1)
    out = writer.finish({"kind": "test"})
    assert os.path.getsize(out) < 1 << 20  # the unused reservation is given back


def test_threads_read_through_their_own_transactions(tree, tmp_path):
    import threading

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


def test_each_commit_starts_the_writeback(tree, tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(lf, "_writeback", lambda: started.append)
    lf.pack_image_folder(tree, tmp_path / "pack.lmdb", commit_every=5, progress=False)
    assert len(started) == -(-len(scan_image_folder(tree)[0]) // 5) and all(fd >= 0 for fd in started)
