"""No silent wrong data: flip every byte of a small pack, then verify it and read it as training does (CPU).

    python benchmarks/integrity.py --jobs 2        # every byte of every page (about 80 minutes on 2 CPUs)
    python benchmarks/integrity.py --sample 600    # 600 offsets per page kind and pack (the committed run)
    python benchmarks/integrity.py --sample 20 --no-write   # CI: every page kind, in seconds

Two packs of ~20 records: an image-folder pack (codec ``raw``: JPEG bytes and labels, read through
``LMDBImageDataset(train=False)``, the dataset ``LMDBDataModule`` uses, with its default settings) and a pack of
general samples (codec ``msgpack``: dicts of arrays, numbers and strings, read through ``LMDBSampleDataset``).
For each offset, one bit of that byte is flipped in a copy of the pack; a forked child then runs ``verify`` and
reads every record and the class names, and the parent compares what came back with the source:

- ``silent_wrong_reads``: a read returned a sample, label or class name that differs from the source, with no
  error (the bar: 0);
- ``verify_missed_flips_that_change_reads``: ``verify`` said ok, but a read differed or failed (the bar: 0);
- a child that crashes (LMDB trusts its pages) counts as detected, and is reported.

Pages are classified from their LMDB headers (meta, branch, leaf, overflow head, overflow data). Also measured:
a tree with ``a/up -> ..``, ``a/self -> .`` and a second link to one file (records and labels after ``pack``), the
default checksum's cost against decoding a record, and every wrong constructor value of
``tests/constructor_cases.py`` (refused at construction, naming the argument).
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.datamodules.lmdb import LMDBImageDataset, LMDBSampleDataset

PAGE = 4096
KINDS = {0x01: "branch", 0x02: "leaf", 0x04: "overflow_head", 0x08: "meta", 0x20: "leaf2"}


def page_kinds(data: bytes) -> list[str]:
    """The kind of every page of an LMDB file, from its header (``mp_flags`` at byte 10); pages that follow an
    overflow head (``mp_pages`` at byte 12) are its data."""
    kinds: list[str] = []
    n = len(data) // PAGE
    i = 0
    while i < n:
        flags = struct.unpack_from("<H", data, i * PAGE + 10)[0]
        kind = next((name for bit, name in KINDS.items() if flags & bit), "other")
        kinds.append(kind)
        if kind == "overflow_head":
            count = struct.unpack_from("<I", data, i * PAGE + 12)[0]
            extra = max(0, min(count - 1, n - i - 1))
            kinds += ["overflow_data"] * extra
            i += extra
        i += 1
    return kinds


class Samples(torch.utils.data.Dataset):
    """General samples of every type msgpack records hold."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        return {"x": rng.normal(size=(8, 8)).astype(np.float32), "tokens": torch.arange(i, i + 50),
                "label": i % 3, "name": f"sample-{i}", "weight": 0.5 + i}  # fmt: skip


def read_all(kind: str, path: str) -> object:
    """What training reads: every record and the class names (or the exception, by type and message)."""
    try:
        if kind == "image":
            ds = LMDBImageDataset(path, image_size=32, train=False)
            return {"classes": ds.classes, "records": [(ds[i][0].numpy().tobytes(), int(ds[i][1]))
                                                      for i in range(len(ds))]}  # fmt: skip
        ds = LMDBSampleDataset(path)
        return {"records": [pickle.dumps(_plain(ds[i])) for i in range(len(ds))]}
    except Exception as err:
        return ("error", type(err).__name__)


def _plain(sample: object) -> object:
    if isinstance(sample, dict):
        return {k: _plain(v) for k, v in sorted(sample.items())}
    if isinstance(sample, torch.Tensor):
        return ("tensor", sample.dtype, tuple(sample.shape), sample.numpy().tobytes())
    if isinstance(sample, np.ndarray):
        return ("array", sample.dtype.str, sample.shape, sample.tobytes())
    return sample


def check(kind: str, path: str) -> tuple[bool, object]:
    """In a forked child: (verify's ok, what training reads); ("crash", signal) where the child died."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            result = (bool(lf.verify(path)["ok"]), read_all(kind, path))
        except BaseException as err:
            result = (False, ("error", type(err).__name__))
        with os.fdopen(w, "wb") as f:
            pickle.dump(result, f)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        payload = f.read()
    _, status = os.waitpid(pid, 0)
    if not payload:
        return False, ("crash", status)
    return pickle.loads(payload)


COUNTS = ("tried", "unchanged_reads", "detected_by_read", "detected_by_verify", "crashes", "silent_wrong_reads",
          "verify_missed_flips_that_change_reads")  # fmt: skip


def _flip_one(kind: str, data: bytes, reference: object, off: int, target: Path) -> dict[str, int]:
    """Flip one bit of byte ``off``, write the copy to ``target``, verify and read it: the outcome's counts."""
    flipped = bytearray(data)
    flipped[off] ^= 1 << (off % 8)
    target.write_bytes(flipped)
    ok, got = check(kind, str(target))
    outcome = {"tried": 1}
    if isinstance(got, tuple) and got and got[0] == "crash":
        outcome["crashes"] = 1
    elif isinstance(got, tuple):  # a read raised: detected
        outcome["detected_by_read"] = 1
    elif got != reference:
        outcome["silent_wrong_reads"] = 1
    else:
        outcome["unchanged_reads"] = 1
    changed = got != reference
    if not ok and changed:
        outcome["detected_by_verify"] = 1
    if ok and changed:
        outcome["verify_missed_flips_that_change_reads"] = 1
    return outcome


_JOB: dict = {}


def _job_init(kind: str, data: bytes, reference: object, work: Path) -> None:
    _JOB.update(kind=kind, data=data, reference=reference, target=work / f"{kind}-{os.getpid()}.lmdb")


def _job_run(item: tuple[str, int]) -> tuple[str, int, dict[str, int]]:
    page_kind, off = item
    return page_kind, off, _flip_one(_JOB["kind"], _JOB["data"], _JOB["reference"], off, _JOB["target"])


def sweep(kind: str, pack: Path, offsets_per_kind: int | None, work: Path, seed: int = 0, jobs: int = 1) -> dict:
    data = pack.read_bytes()
    kinds = page_kinds(data)
    reference = read_all(kind, str(pack))
    assert not isinstance(reference, tuple), reference
    by_kind: dict[str, list[int]] = {}
    for page, k in enumerate(kinds):
        by_kind.setdefault(k, []).extend(range(page * PAGE, min(len(data), (page + 1) * PAGE)))
    rng = random.Random(seed)
    if offsets_per_kind is not None:
        by_kind = {k: sorted(rng.sample(v, min(offsets_per_kind, len(v)))) for k, v in by_kind.items()}
    counts = dict.fromkeys(COUNTS, 0)
    examples: list[dict] = []
    per_kind = {k: dict.fromkeys(counts, 0) for k in by_kind}
    items = [(k, off) for k, offsets in by_kind.items() for off in offsets]
    if jobs > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(jobs, _job_init, (kind, data, reference, work)) as pool:
            results = list(pool.imap(_job_run, items, chunksize=64))
    else:
        _job_init(kind, data, reference, work)
        results = [_job_run(item) for item in items]
    for k, off, outcome in results:
        for name, v in outcome.items():
            counts[name] += v
            per_kind[k][name] += v
        if (outcome.get("silent_wrong_reads") or outcome.get("verify_missed_flips_that_change_reads")) and \
                len(examples) < 10:  # fmt: skip
            examples.append({"offset": off, "page": off // PAGE, "page_kind": k,
                             "verify_ok": not outcome.get("detected_by_verify")})  # fmt: skip
    return {"file_bytes": len(data), "pages": dict(sorted({k: kinds.count(k) for k in set(kinds)}.items())),
            "counts": counts, "per_page_kind": per_kind, "examples": examples}  # fmt: skip


def dir_loops(work: Path) -> dict:
    import warnings

    root = make_jpeg_folder(work / "loops", n=20, num_classes=2, size_range=(40, 60, 40, 60), workers=1,
                            progress=False)  # fmt: skip
    a = root / "class_000"
    for name, target in (("up", ".."), ("self", ".")):
        if not (a / name).is_symlink():
            os.symlink(target, a / name)
    first = sorted(a.glob("*.jpg"))[0]
    if not (a / "twice.jpg").is_symlink():
        os.symlink(first.name, a / "twice.jpg")
    files = {p.read_bytes(): int(p.parent.name[-3:]) for p in root.glob("class_*/*.jpg") if not p.is_symlink()}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        start = time.perf_counter()
        pack = lf.pack_image_folder(root, work / "loops.lmdb", progress=False)
        seconds = time.perf_counter() - start
    reader = lf.PackReader(pack)
    got = [reader.read(i, lambda r: (bytes(r.payload), r.label)) for i in range(len(reader))]
    return {"files": len(files), "records": len(got), "pack_s": seconds,
            "wrong_labels": sum(1 for payload, label in got if files.get(payload) != label)}  # fmt: skip


def checksum_cost(pack: Path) -> dict:
    """A record's read + decode (LMDBImageDataset at 224 px) with and without the default CRC check."""

    def per_record(check: bool) -> float:
        ds = LMDBImageDataset(str(pack), image_size=224, train=False, check_crc=check)
        for i in range(len(ds)):
            ds[i]
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for i in range(len(ds)):
                ds[i]
            best = min(best, (time.perf_counter() - start) / len(ds))
        return best

    off, on = per_record(False), per_record(True)
    reader = lf.PackReader(str(pack))
    values = [reader.read(i, lambda r: bytes(r.payload)) for i in range(len(reader))]
    crc = float("inf")  # timed like the reads above: the best of 5 passes (a pass preempted by other work is dropped)
    for _ in range(5):
        start = time.perf_counter()
        for v in values:
            zlib.crc32(v)
        crc = min(crc, (time.perf_counter() - start) / len(values))
    return {"read_decode_s": off, "read_decode_checked_s": on, "crc_s": crc, "crc_fraction": crc / off,
            "mean_record_bytes": sum(map(len, values)) / len(values)}  # fmt: skip


def constructors(work: Path) -> dict:
    """Every wrong value of ``tests/constructor_cases.py`` for every public constructor: refused at construction
    and named, or not."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from constructor_cases import cases, outcome

    tree = make_jpeg_folder(work / "ctor", n=8, num_classes=2, size_range=(40, 60, 40, 60), workers=1, progress=False)
    pack = lf.pack_image_folder(tree, work / "ctor.lmdb", progress=False)
    tried, problems = 0, []
    for cls, valid, arg, wrong in cases(tree, pack):
        tried += 1
        result = outcome(cls, valid, arg, wrong)
        if result != "named":
            problems.append({"class": cls.__name__, "argument": arg, "value": repr(wrong), "result": result})
    return {"tried": tried, "late_or_unnamed": len(problems), "problems": problems[:20]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=int, help="offsets per page kind (default: every byte of every page)")
    parser.add_argument("--out", default="benchmarks/results", help="where the JSON and Markdown results go")
    parser.add_argument("--no-write", action="store_true", help="print the bars only (the CI smoke run)")
    parser.add_argument("--jobs", type=int, default=1, help="processes that flip and check offsets side by side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        images = make_jpeg_folder(work / "src", n=20, num_classes=3, size_range=(48, 64, 40, 56), workers=1,
                                  progress=False)  # fmt: skip
        image_pack = lf.pack_image_folder(images, work / "images.lmdb", progress=False)
        sample_pack = lf.pack_dataset(Samples(), work / "samples.lmdb", progress=False)
        photos = make_jpeg_folder(work / "big", n=12, num_classes=2, workers=1, progress=False)  # ~70 KiB JPEGs
        cost = checksum_cost(lf.pack_image_folder(photos, work / "big.lmdb", progress=False))
        start = time.perf_counter()
        results = {"image_folder_pack": sweep("image", image_pack, args.sample, work, jobs=args.jobs),
                   "sample_pack": sweep("sample", sample_pack, args.sample, work, jobs=args.jobs)}  # fmt: skip
        loops = dir_loops(work)
        ctor = constructors(work)
    totals = {k: sum(r["counts"][k] for r in results.values()) for k in results["image_folder_pack"]["counts"]}
    kinds = sorted({k for r in results.values() for k in r["pages"]})
    figures = {"sample_per_page_kind": args.sample, "jobs": args.jobs, "sweep_s": time.perf_counter() - start, "packs": results,
               "totals": totals, "page_kinds": kinds, "dir_loop": loops, "checksum_cost": cost, "constructors": ctor}  # fmt: skip
    bars = {
        "byte_flips_tried": bar(totals["tried"], 2000, "flips"),
        "silent_wrong_reads": bar(totals["silent_wrong_reads"], 0, "reads", higher_is_better=False),
        "verify_missed_flips_that_change_reads": bar(
            totals["verify_missed_flips_that_change_reads"], 0, "flips", higher_is_better=False
        ),
        "dir_loop_records": bar(loops["records"], loops["files"], "records"),
        "dir_loop_wrong_labels": bar(loops["wrong_labels"], 0, "records", higher_is_better=False),
        "default_checksum_cost_fraction": bar(cost["crc_fraction"], 0.01, "ratio", higher_is_better=False),
        "constructor_wrong_values_tried": bar(ctor["tried"], 200, "values"),
        "late_or_unnamed_errors": bar(ctor["late_or_unnamed"], 0, "values", higher_is_better=False),
    }
    for name, b in bars.items():
        print(f"{name}: {b['value']} (target {b['target']}, pass={b['pass']})")
    print(f"page kinds: {kinds}; totals: {totals}")
    if args.no_write:
        import json

        print(json.dumps({"bars": bars, "totals": totals, "page_kinds": kinds}))
    else:
        print(f"wrote {write_result('integrity', figures, bars, args.out)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
