"""Verifying LMDB packs: every record read by key through the reader training uses, keys ``0..n-1`` all resolving, and
with ``decode=True`` every image decoded; one JSON-able summary on every outcome."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning_gpu_boost._imports import require
from lightning_gpu_boost.core.lmdb.format import KEY, RECORDS, is_manifest
from lightning_gpu_boost.core.lmdb.reader import PackReader
from lightning_gpu_boost.core.lmdb.sharded import ShardedPackReader

__all__ = ['verify', 'verify_file']


def verify(path: str | os.PathLike, decode: bool = False) -> dict[str, Any]:
    """Check a pack (or every shard of a sharded pack, see :func:`verify_file`); returns one summary."""
    if is_manifest(path):
        try:
            reader = ShardedPackReader(path)
        except Exception as err:
            return {"path": str(path), "records": 0, "bytes": 0, "ok": False, "errors": [f"cannot open: {err}"]}
        parts = [verify_file(Path(path).parent / shard["path"], decode) for shard in reader.shards]
        errors = [f"{part['path']}: {e}" for part in parts for e in part["errors"]]
        if sum(part["records"] for part in parts) != reader.length:
            errors.append(f"the manifest says {reader.length} records but the shards hold a different number")
        summary = {"path": str(path), "records": sum(p["records"] for p in parts),
                   "bytes": sum(p["bytes"] for p in parts), "shards": len(parts), "ok": not errors,
                   "errors": errors[:20]}  # fmt: skip
        if decode:
            summary["undecodable_records"] = sum(p.get("undecodable_records", 0) for p in parts)
            summary["undecodable"] = [u for p in parts for u in p.get("undecodable", [])][:100]
        return summary
    return verify_file(path, decode)


def verify_file(path: str | os.PathLike, decode: bool = False) -> dict[str, Any]:
    """Check one pack file the way training reads it, and its structure.

    Opens it through :class:`PackReader` (metadata and its CRC), reads every record ``0..length-1`` by key with the
    CRC checked (what a DataLoader worker does), and walks the records in key order (every B-tree page reachable,
    no key outside ``0..length-1``; ``lmdb.verify`` where the binding has it). Never raises for a damaged or
    foreign file: ``summary["ok"]`` is False and ``summary["errors"]`` says what is wrong (at most 20 lines;
    ``bad_records`` counts them all). ``decode``: every image record is also decoded in full; the undecodable ones
    are listed by index and original path (``undecodable``, at most 100; ``undecodable_records`` counts them)."""
    summary: dict[str, Any] = {"path": str(path), "records": 0, "bytes": 0, "bad_records": 0, "ok": False}
    errors: list[str] = []
    try:
        reader = PackReader(path)
    except Exception as err:  # not a pack, truncated, damaged header or metadata, missing, incomplete
        summary["errors"] = [f"cannot open: {err}"]
        return summary
    lmdb = require("lmdb")
    if hasattr(lmdb, "verify"):
        try:
            lmdb.verify(str(path))
        except Exception as err:  # structure damaged
            errors.append(f"structure: {err}")
    bad: set[int] = set()
    for index in range(reader.length):  # by key, as training reads
        try:
            reader.read(index, lambda record: None)
        except Exception as err:
            bad.add(index)
            errors.append(str(err))
    count, total = 0, 0
    try:
        with reader._begin(RECORDS) as txn:
            for raw_key, value in txn.cursor():
                index = KEY.unpack(bytes(raw_key))[0] if len(raw_key) == KEY.size else -1
                if not 0 <= index < reader.length:
                    errors.append(f"a record key outside 0..{reader.length - 1}: {bytes(raw_key)!r}")
                count += 1
                total += len(value)
    except Exception as err:
        errors.append(f"structure: {err}")
    if count != reader.length:
        errors.append(f"the pack says {reader.length} records but holds {count}")
    if reader.length == 0:
        errors.append("the pack holds no record (every file of its source was left out)")
    summary.update(records=count, bytes=total, bad_records=len(bad), ok=not errors, errors=errors[:20])
    if decode:
        undecodable = _undecodable(reader, bad)
        summary.update(undecodable_records=len(undecodable), undecodable=undecodable[:100])
        summary["ok"] = summary["ok"] and not undecodable
    return summary


def _undecodable(reader: PackReader, skip: set[int]) -> list[dict[str, Any]]:
    """Image records that do not decode in full (``verify --decode``), by index and original path."""
    from lightning_gpu_boost.core.bad_samples import check_image, decode_problem

    if reader.meta("kind") != "image_folder":
        return []
    found = []
    for index in range(reader.length):
        if index in skip:
            continue
        problem = reader.read(index, lambda r: check_image(r.payload) or decode_problem(r.payload))
        if problem is not None:
            found.append({"index": index, "path": reader.source_path(index), "reason": problem})
    return found
