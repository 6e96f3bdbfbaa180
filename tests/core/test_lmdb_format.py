from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.cli import main
from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.images import make_jpeg_folder, scan_image_folder
from lightning_gpu_boost.core.lmdb import pack as lw
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


@pytest.mark.parametrize("workers", [0, 3])
def test_windows_of_a_few_kilobytes_reuse_two_buffers_and_every_record_stays_right(tree, tmp_path, monkeypatch,
                                                                                   workers):  # fmt: skip
    assert lw._windows([5, 5, 5, 5, 5], 1, most=10, most_bytes=10 + 2 * lw.HEADER.size) == [(1, 3), (3, 5)]
    assert lw._windows([50, 1], 0, most=10, most_bytes=10) == [(0, 1), (1, 2)]  # a large record: a window alone
    assert lw._windows([1, 1, 1], 0, most=2) == [(0, 2), (2, 3)]
    monkeypatch.setattr(lw, "WINDOW_BYTES", 6000)  # 2-3 records per window: each buffer is reused many times
    grown = []
    slices = lw._Arenas.slices

    def spy(self, sizes):
        out = slices(self, sizes)
        grown.append([id(b) for b in self._buffers])
        return out

    monkeypatch.setattr(lw._Arenas, "slices", spy)
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False, workers=workers)
    samples, _, _ = scan_image_folder(tree)
    assert len(grown) >= 8 and len({i for ids in grown[-2:] for i in ids} | {i for i in grown[2]}) <= 4
    assert _records(path) == [(open(p, "rb").read(), label) for p, label in samples]
    assert lf.verify(path)["ok"]


def test_sigkill_then_resume_equals_an_uninterrupted_pack(tree, tmp_path):
    dst = tmp_path / "killed.lmdb"
    script = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from lightning_gpu_boost.core import lmdb as lf
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
    summary = lf.verify(truncated)  # a summary on every outcome, never a traceback
    assert not summary["ok"] and summary["errors"], summary
    for name, data in (("empty.lmdb", b""), ("text.lmdb", b"not an lmdb file\n" * 100)):
        (tmp_path / name).write_bytes(data)
        summary = lf.verify(tmp_path / name)
        assert not summary["ok"] and summary["errors"][0].startswith("cannot open"), summary
    assert not lf.verify(tmp_path / "missing.lmdb")["ok"]


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
    for thread in threading.enumerate():  # the request runs in a daemon thread, chunk by chunk
        if thread.name == "lgb-pack-prefetch":
            thread.join(10)
    assert advised and set(advised) == {os.POSIX_FADV_WILLNEED}
    asked = len(advised)
    lf.PackReader(path).read(1)  # once per file and process (tree): not asked for again while it stays open
    assert len(advised) == asked and not any(t.name == "lgb-pack-prefetch" for t in threading.enumerate())
    lf.close_readers(path)


def test_reading_threads_follow_the_file_size():
    assert lf.pack_workers([4_000] * 10) == 0 and lf.pack_workers([100_000] * 10) == 2 and lf.pack_workers([]) == 2


def test_a_file_that_grows_while_packed_is_an_error(tree, tmp_path):
    path = next(p for p in sorted(tree.rglob("*.jpg")))
    size = path.stat().st_size
    assert len(lw._read_record(str(path), 3, size)) == lf.HEADER.size + size
    with open(path, "ab") as f:
        f.write(b"more")
    with pytest.raises(OSError, match="changed while it was packed"):
        lw._read_record(str(path), 3, size)


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
    from lightning_gpu_boost.core.lmdb import writer

    monkeypatch.setattr(writer, "_writeback", lambda: started.append)
    lf.pack_image_folder(tree, tmp_path / "pack.lmdb", commit_every=5, progress=False)
    assert len(started) == -(-len(scan_image_folder(tree)[0]) // 5) and all(fd >= 0 for fd in started)


def _tree_with_loops(root):
    from lightning_gpu_boost.core.images import make_jpeg_folder

    make_jpeg_folder(root, n=20, num_classes=2, size_range=(40, 60, 40, 60), workers=1, progress=False)
    a = root / "class_000"
    os.symlink("..", a / "up")  # a link back to the root: the other class's images under this class
    os.symlink(".", a / "self")  # a link to itself
    os.symlink(sorted(a.glob("*.jpg"))[0].name, a / "twice.jpg")  # a second name for one file
    return root


def test_links_into_ancestors_are_not_followed_and_labels_stay_right(tmp_path):
    tree = _tree_with_loops(tmp_path / "src")
    with pytest.warns(UserWarning, match="were not followed"):
        path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    reader = lf.PackReader(path)
    assert len(reader) == 20
    files = {p.read_bytes(): int(p.parent.name[-3:]) for p in tree.glob("class_*/*.jpg") if not p.is_symlink()}
    for i in range(len(reader)):
        payload, label = reader.read(i, lambda r: (bytes(r.payload), r.label))
        assert files[payload] == label


def test_the_checksum_covers_the_label_and_the_metadata(tree, tmp_path):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    data = bytearray(path.read_bytes())
    value = lf.PackReader(path).read(3)  # the whole payload: JPEG headers repeat across files
    at = data.find(value) - lf.HEADER.size + 2 + 7  # the label's last byte, in record 3's header
    data[at] ^= 0x01
    broken = tmp_path / "label.lmdb"
    broken.write_bytes(bytes(data))
    with pytest.raises(lf.CorruptRecordError, match="Record 3 is corrupt"):
        lf.PackReader(broken).read(3)  # checked on every read by default
    summary = lf.verify(broken)
    assert not summary["ok"] and summary["bad_records"] == 1
    data = bytearray(path.read_bytes())
    at = data.find(b"class_001")
    data[at + 8] ^= 0x02  # a class name in the metadata
    broken.write_bytes(bytes(data))
    assert "metadata" in lf.verify(broken)["errors"][0]


def test_version_1_packs_still_read(tree, tmp_path):
    import struct
    import zlib

    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    value = bytearray(lf.encode_record(b"payload", label=7))
    struct.pack_into(">B", value, 0, 1)
    struct.pack_into(">I", value, lf.CRC_PREFIX, zlib.crc32(b"payload"))  # version 1: the payload alone
    record = lf.decode_record(0, bytes(value))
    assert record.label == 7 and bytes(record.payload) == b"payload"
    assert lf.PackReader(path).version == lf.SCHEMA_VERSION == 2


def test_non_utf8_file_names_are_packed(tmp_path):
    from lightning_gpu_boost.core.images import make_jpeg_folder

    tree = make_jpeg_folder(tmp_path / "src", n=4, num_classes=2, size_range=(40, 60, 40, 60), workers=1,
                            progress=False)  # fmt: skip
    first = sorted((tree / "class_000").glob("*.jpg"))[0]
    os.rename(first, os.path.join(os.fsencode(first.parent), b"caf\xe9.jpg"))
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    assert len(lf.PackReader(path)) == 4 and lf.verify(path)["ok"]


def test_cli_user_errors_are_one_line_and_exit_2(tree, tmp_path, capsys):
    from lightning_gpu_boost.cli import main

    assert main(["pack", str(tmp_path / "missing"), str(tmp_path / "out.lmdb")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lightning-gpu-boost: error: ") and "does not exist" in err and "Traceback" not in err
    (tmp_path / "empty.lmdb").write_bytes(b"")
    assert main(["verify", str(tmp_path / "empty.lmdb")]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert not summary["ok"] and summary["errors"][0].startswith("cannot open")
    with pytest.raises(FileNotFoundError):
        main(["--debug", "pack", str(tmp_path / "missing"), str(tmp_path / "out.lmdb")])


def test_pack_max_side_resizes_large_images_upright_and_keeps_small_ones(tmp_path):
    import io

    from PIL import Image

    from lightning_gpu_boost.cli import main
    from lightning_gpu_boost.core.bad_samples import add_unusual_images
    from lightning_gpu_boost.core.images import make_jpeg_folder

    root = make_jpeg_folder(tmp_path / "src", n=6, num_classes=2, size_range=(300, 400, 200, 260), progress=False)
    small = root / "class_000" / "small.jpg"
    Image.new("RGB", (40, 30), (200, 10, 10)).save(small, quality=95)
    unusual = add_unusual_images(root / "class_001")  # 64 x 48: below max_side, kept as they are
    big_rotated = root / "class_001" / "big-rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 300 wide x 400 high, shown 400 wide x 300 high
    Image.new("RGB", (300, 400), (10, 200, 10)).save(big_rotated, exif=exif.tobytes(), quality=95)
    assert main(["pack", str(root), str(tmp_path / "p.lmdb"), "--max-side", "64", "--quality", "80"]) == 0
    reader = lf.open_pack(tmp_path / "p.lmdb")
    assert reader.meta("max_side") == 64 and reader.meta("quality") == 80 and not reader.meta("bad_samples")
    paths = [reader.source_path(i) for i in range(len(reader))]
    for i, rel in enumerate(paths):
        data, source = reader.read(i), (root / rel).read_bytes()
        if min(Image.open(io.BytesIO(source)).size) <= 64:
            assert data == source, rel  # small enough: the original bytes
        else:
            stored = Image.open(io.BytesIO(data))
            assert min(stored.size) == 64 and stored.mode == "RGB" and stored.format == "JPEG", rel
    rotated = Image.open(io.BytesIO(reader.read(paths.index("class_001/big-rotated.jpg"))))
    assert rotated.size == (85, 64)  # upright: 400 x 300 shown -> 85 x 64
    assert len(unusual) == 6
    with pytest.raises(ValueError, match="max_side"):
        lf.pack_image_folder(root, tmp_path / "q.lmdb", max_side=0)


def test_crc32_is_zlibs_whichever_computes_it(tmp_path, monkeypatch):
    """lmdb_format.crc32 (ISA-L's where python-isal is installed) gives zlib.crc32's values, so a pack written with
    one reads with the other, and a flipped byte is caught by both."""
    import zlib

    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8).tobytes()
    for view in (data, memoryview(data)[7:], bytearray(data[:5])):
        assert lf.crc32(view) == zlib.crc32(view) and lf.crc32(view, 12345) == zlib.crc32(view, 12345)
    samples = [(bytes([i]) * (5_000 + i), i % 3) for i in range(20)]
    pack = lw.pack_dataset(samples, tmp_path / "p.lmdb", progress=False)
    from lightning_gpu_boost.core.lmdb import format as lmdb_format

    monkeypatch.setattr(lmdb_format, "_CRC32", [zlib.crc32])  # read back with zlib's
    reader = lf.open_pack(pack)
    assert all(reader.read(i, lambda r: len(r.payload)) > 5_000 for i in range(20))  # each CRC checked, none raised
    value = bytearray(lf.encode_record(b"x" * 100))
    value[-1] ^= 1
    for impl in ([zlib.crc32], []):
        monkeypatch.setattr(lmdb_format, "_CRC32", list(impl))
        with pytest.raises(lf.CorruptRecordError):
            lf.decode_record(0, bytes(value))
