"""Packing a tree (``core/lmdb/pack.py``): byte-identical round trips, resume after SIGKILL, skipped and odd
file names, files that change while packed, resizing, the CLI's pack and its user errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.cli import main
from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.images import make_jpeg_folder, scan_image_folder
from lightning_gpu_boost.core.lmdb import pack as lw
from tests.core.lmdb.shared import _records
from tests.helpers import ROOT


def _tree_with_loops(root):

    make_jpeg_folder(root, n=20, num_classes=2, size_range=(40, 60, 40, 60), workers=1, progress=False)
    a = root / "class_000"
    os.symlink("..", a / "up")  # a link back to the root: the other class's images under this class
    os.symlink(".", a / "self")  # a link to itself
    os.symlink(sorted(a.glob("*.jpg"))[0].name, a / "twice.jpg")  # a second name for one file
    return root


@pytest.mark.parametrize("workers", [None, 0, 3])
def test_round_trip_is_byte_identical(tree, tmp_path, workers):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", commit_every=5, progress=False, workers=workers)
    samples, classes, _ = scan_image_folder(tree)
    assert _records(path) == [(open(p, "rb").read(), label) for p, label in samples]
    reader = lf.PackReader(path, check_crc=True)
    assert reader.meta("classes") == classes and reader.meta("class_to_idx")["class_002"] == 2
    assert lf.verify(path)["ok"] and not os.path.exists(f"{path}.partial")


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


def test_non_utf8_file_names_are_packed(tmp_path):

    tree = make_jpeg_folder(tmp_path / "src", n=4, num_classes=2, size_range=(40, 60, 40, 60), workers=1,
                            progress=False)  # fmt: skip
    first = sorted((tree / "class_000").glob("*.jpg"))[0]
    os.rename(first, os.path.join(os.fsencode(first.parent), b"caf\xe9.jpg"))
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    assert len(lf.PackReader(path)) == 4 and lf.verify(path)["ok"]


def test_an_escaped_name_never_equals_a_real_one(tmp_path):
    tree = make_jpeg_folder(tmp_path / "src", n=4, num_classes=2, size_range=(40, 60, 40, 60), workers=1,
                            progress=False)  # fmt: skip
    one, two = sorted((tree / "class_000").glob("*.jpg"))[:2]
    folder = os.fsencode(one.parent)
    os.rename(one, os.path.join(folder, b"\xfe.jpg"))  # a byte that is not UTF-8
    os.rename(two, os.path.join(folder, b"\\xfe.jpg"))  # a name that reads like its escape
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    names = lf.PackReader(path).meta("paths")
    assert len(names) == len(set(names)) == 4
    assert {"class_000/\\xfe.jpg", "class_000/\\\\xfe.jpg"} <= set(names), names


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
