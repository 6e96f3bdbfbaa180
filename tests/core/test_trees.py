"""Trees as users have them: files that are no regular files (a FIFO, a link to a device) named like images, class
folders and files whose names are not UTF-8, a bad file whose name reads like a good one, a damaged meta page."""

from __future__ import annotations

import os
import threading

import pytest

from lightning_gpu_boost.core.images import make_jpeg_folder, scan_image_folder
from lightning_gpu_boost.core.lmdb import PackReader, pack_image_folder, verify


@pytest.fixture
def tree(tmp_path):
    return make_jpeg_folder(tmp_path / "src", n=8, num_classes=2, size_range=(40, 56, 32, 48), progress=False)


def _in_time(fn, seconds=30):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) where it does not end in time."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as err:  # handed to the test
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not end in {seconds} s (a FIFO opened?)"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_special_files_are_listed_never_opened(tree, tmp_path):
    os.mkfifo(tree / "class_000" / "fifo.jpg")
    os.symlink("/dev/zero", tree / "class_001" / "zero.jpg")
    with pytest.warns(UserWarning, match="not regular files.*fifo.jpg.*zero.jpg"):
        samples, _, _ = _in_time(lambda: scan_image_folder(tree))
    assert len(samples) == 8
    pack = _in_time(lambda: pack_image_folder(tree, tmp_path / "p.lmdb", progress=False))
    reader = PackReader(pack)
    bad = {entry["path"]: entry["reason"] for entry in reader.meta("bad_samples")}
    assert "a FIFO" in bad[os.path.join("class_000", "fifo.jpg")]
    assert "a device" in bad[os.path.join("class_001", "zero.jpg")]
    assert len(reader) == 8 and verify(pack)["ok"]


def test_the_image_datamodule_never_opens_a_fifo(tree):
    from lightning_gpu_boost.datamodules import ImageFolderDataModule

    os.mkfifo(tree / "class_000" / "fifo.jpg")
    dm = ImageFolderDataModule(str(tree), image_size=16, batch_size=4, num_workers=0)
    with pytest.warns(UserWarning, match="fifo.jpg"):
        batches = _in_time(lambda: list(dm.train_dataloader()))
    assert sum(len(labels) for _, labels in batches) == 8


def test_names_that_are_not_utf8_pack_escaped_and_keep_their_records(tree, tmp_path):
    raw = os.fsencode(tree)
    os.rename(os.path.join(raw, b"class_001"), os.path.join(raw, b"caf\xe9"))  # a class folder in Latin-1
    folder = os.path.join(raw, b"caf\xe9")
    good = sorted(os.listdir(folder))[0]
    os.rename(os.path.join(folder, good), os.path.join(folder, b"\xfe" + good[1:]))  # a good file, not UTF-8
    # a broken file whose name, read as text with replacement characters, equals the good file's
    with open(os.path.join(folder, b"\xff" + good[1:]), "wb") as f:
        f.write(b"not an image")
    pack = pack_image_folder(tree, tmp_path / "p.lmdb", progress=False)
    reader = PackReader(pack)
    assert reader.meta("classes") == ["caf\\xe9", "class_000"]
    bad = reader.meta("bad_samples")
    assert len(bad) == 1 and "\\xff" in bad[0]["path"]
    # every record keeps its own name: the stored name's file holds the record's bytes
    for index in range(len(reader)):
        name = reader.source_path(index)
        path = os.path.join(raw, name.encode("utf-8").decode("unicode_escape").encode("latin-1"))
        with open(path, "rb") as f:
            assert reader.read(index) == f.read(), name


def test_a_damaged_meta_page_is_named_damaged_not_interrupted(tree, tmp_path):
    pack = pack_image_folder(tree, tmp_path / "p.lmdb", progress=False)
    data = bytearray(pack.read_bytes())
    data[128] ^= 0x01  # one flipped bit in the first meta page: LMDB falls back to an older transaction's state
    damaged = tmp_path / "damaged.lmdb"
    damaged.write_bytes(bytes(data))
    summary = verify(damaged)
    text = " ".join(summary["errors"])
    assert not summary["ok"] and "damaged" in text and "resume" not in text, text
    partial = tmp_path / "copy.lmdb.partial"  # a real .partial file is an interrupted pack
    partial.write_bytes(bytes(data))
    assert "resume it" in " ".join(verify(partial)["errors"])
