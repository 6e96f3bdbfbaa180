"""The LMDB pack format (version 2): one safe, resumable, verifiable file of samples.

This module holds the format itself (record and meta layout, checksums, the msgpack codec of general samples,
shard manifests); :mod:`~lightning_gpu_boost.core.lmdb.pack` writes packs, :mod:`~lightning_gpu_boost.core.lmdb.reader`
reads them, :mod:`~lightning_gpu_boost.core.lmdb.verify` checks them.

Layout (documented in ``docs/lmdb_format.md``):

- one LMDB file (``subdir=False``) with two named databases, ``records`` and ``meta``;
- record keys: the sample index as 8-byte big-endian unsigned integers (so keys sort in index order);
- record values: a 22-byte header ``>BBqQI`` (format version, codec, label or -1, payload length, CRC32)
  followed by the payload. Version 2: the CRC32 covers everything a read returns (the header's first 18 bytes:
  version, codec, label, length; then the payload), and readers check it on every read by default; version 1
  (packs written before): it covers the payload only. Readers read both. The payload is the original encoded bytes (codec ``raw``: files are never re-encoded) or a
  msgpack-encoded sample (codec ``msgpack``: dicts of arrays, numbers and strings; arrays as dtype/shape/bytes;
  never pickle);
- meta keys: ``schema_version``, ``length``, ``classes``, ``class_to_idx``, ``fingerprint`` (of the source),
  ``progress`` (next index, rewritten with every commit), ``meta_crc`` (version 2: CRC32 of every other meta key
  and value but ``progress``, checked when a pack is opened) and ``complete``, written last.

A pack is written to ``<dst>.partial`` and renamed to ``<dst>`` only once complete, so a crashed pack is detectable
(no ``<dst>``, or no ``complete`` record) and resumable from its last commit.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any, NamedTuple

from lightning_gpu_boost._imports import require

__all__ = ['CODECS', 'CODEC_NAMES', 'CRC_PREFIX', 'CorruptRecordError', 'HEADER', 'IncompletePackError', 'KEY', 'MANIFEST_FORMAT', 'META', 'READABLE_VERSIONS', 'RECORDS', 'Record', 'SCHEMA_VERSION', 'StalePackError', 'crc32', 'decode_record', 'encode_record', 'is_manifest', 'meta_crc', 'pack_sample', 'record_crc', 'shard_path', 'unpack_sample']

SCHEMA_VERSION = 2
#: versions this reader reads (1: the CRC covers the payload only)
READABLE_VERSIONS = (1, 2)
HEADER = struct.Struct(">BBqQI")
#: the header's bytes that the version-2 CRC covers before the payload (all but the CRC itself)
CRC_PREFIX = HEADER.size - 4
_HEADER_SIZE, _UNPACK_HEADER = HEADER.size, HEADER.unpack_from
KEY = struct.Struct(">Q")
CODECS = {"raw": 0, "msgpack": 1}
CODEC_NAMES = {v: k for k, v in CODECS.items()}
RECORDS, META = b"records", b"meta"


_CRC32: list[Any] = []


def _crc32_function() -> Any:
    if not _CRC32:
        try:
            from isal import isal_zlib

            _CRC32.append(isal_zlib.crc32)
        except ImportError:
            _CRC32.append(zlib.crc32)
    return _CRC32[0]


def crc32(data: Any, value: int = 0) -> int:
    """The CRC-32 of ``data`` (zlib's polynomial, ``zlib.crc32``'s arguments and result), computed by ISA-L where
    ``isal`` (python-isal, in the ``lmdb`` extra) is installed: with the CPU's carry-less multiply it checks a record
    about 13x faster than zlib (64 against 4.8 GB/s on 77 KB values on the CPU CI machine), and one record at a time,
    zlib's check was most of a warm read (1,846 MB/s with it, 9,449 without, on the H100 machine). zlib elsewhere."""
    return (_CRC32[0] if _CRC32 else _crc32_function())(data, value)


class IncompletePackError(RuntimeError):
    """The pack was interrupted before it completed."""


class CorruptRecordError(RuntimeError):
    """A record's CRC32 does not match what it holds (label, codec, length or payload)."""


class StalePackError(RuntimeError):
    """The file at a pack's path was replaced (removed and packed again, copied over) after a reader opened it."""


def record_crc(value: bytes | bytearray | memoryview, version: int = SCHEMA_VERSION) -> int:
    """The CRC32 a record of ``version`` stores: of the header's first 18 bytes and the payload (version 2), or of
    the payload alone (version 1)."""
    view = memoryview(value)
    if version == 1:
        return crc32(view[HEADER.size :])
    return crc32(view[HEADER.size :], crc32(view[:CRC_PREFIX]))


def encode_record(payload: bytes | memoryview, label: int = -1, codec: str = "raw") -> bytes:
    value = bytearray(HEADER.pack(SCHEMA_VERSION, CODECS[codec], label, len(payload), 0) + bytes(payload))
    struct.pack_into(">I", value, CRC_PREFIX, record_crc(value))
    return bytes(value)


class Record(NamedTuple):
    """A record as a read returns it: its index, codec name, label (-1: none) and payload (a view of the pack's
    memory map, valid inside the read's ``decode``). A named tuple: made on every read, at half a dataclass's cost."""

    index: int
    codec: str
    label: int
    payload: memoryview


def meta_crc(items: Any) -> int:
    """CRC32 of a pack's meta keys and values (sorted by key), but ``progress`` and ``meta_crc`` themselves."""
    crc, of = 0, _crc32_function()  # checked at every open: ISA-L's where installed
    for key, value in sorted((bytes(k), bytes(v)) for k, v in items):
        if key not in (b"progress", b"meta_crc"):
            crc = of(value, of(struct.pack(">I", len(value)), of(key + b"\0", crc)))
    return crc


def decode_record(index: int, value: bytes | memoryview, check_crc: bool = True) -> Record:
    """Parse a record value; ``check_crc`` recomputes the CRC32 (raises :class:`CorruptRecordError`)."""
    try:
        version, codec, label, length, crc = _UNPACK_HEADER(value)
    except struct.error:
        raise CorruptRecordError(
            f"Record {index} is truncated ({len(value)} bytes, header needs {HEADER.size})."
        ) from None
    view = value if type(value) is memoryview else memoryview(value)  # a reader's buffers are views already
    payload = view[_HEADER_SIZE:]
    # the usual record, checked inline (small records' reads are mostly Python calls: 4 KB, 3.4 -> 2.6 us a read on
    # the CPU CI machine); anything else, a CRC mismatch included, takes the general checks below, which raise
    if version == SCHEMA_VERSION and len(payload) == length:
        name = CODEC_NAMES.get(codec)
        if name is not None:
            if not check_crc:
                return Record(index, name, label, payload)
            crc32_of = _CRC32[0] if _CRC32 else _crc32_function()
            if crc32_of(payload, crc32_of(view[:CRC_PREFIX])) == crc:
                return Record(index, name, label, payload)
    if version not in READABLE_VERSIONS:
        raise CorruptRecordError(
            f"Record {index} has format version {version}; this reader knows versions "
            f"{', '.join(map(str, READABLE_VERSIONS))} (a damaged record, or a pack from a newer release)."
        )
    if len(payload) != length or codec not in CODEC_NAMES or (check_crc and record_crc(value, version) != crc):
        raise CorruptRecordError(
            f"Record {index} is corrupt: CRC32, codec or length mismatch (stored length {length}, found "
            f"{len(payload)}). Repack the source or restore the file."
        )
    return Record(index, CODEC_NAMES.get(codec) or str(codec), label, payload)


# -------------------------------------------------------------------------------------- general samples


def _pack_default(obj: Any) -> Any:
    import numpy as np

    msgpack = require("msgpack")
    if hasattr(obj, "numpy") and callable(obj.numpy):  # torch tensors
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        data = msgpack.packb([obj.dtype.str, list(obj.shape), obj.tobytes()])
        return msgpack.ExtType(1, data)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(
        f"Cannot store a {type(obj).__name__} in an LMDB pack (dicts of arrays, numbers, strings)."
    )


def _unpack_ext(code: int, data: bytes) -> Any:
    import numpy as np

    msgpack = require("msgpack")
    if code != 1:
        raise ValueError(f"Unknown msgpack extension type {code} in an LMDB pack.")
    dtype, shape, raw = msgpack.unpackb(data)
    return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)


def pack_sample(sample: Any) -> bytes:
    """msgpack encoding of a sample: dicts/lists of numpy arrays, tensors, numbers and strings (never pickle)."""
    return require("msgpack").packb(sample, default=_pack_default, use_bin_type=True)


def unpack_sample(payload: bytes | memoryview) -> Any:
    return require("msgpack").unpackb(bytes(payload), ext_hook=_unpack_ext, raw=False, strict_map_key=False)


# ------------------------------------------------------------------------------------------------- shards

MANIFEST_FORMAT = "lightning-gpu-boost-shards"


def is_manifest(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the JSON manifest of a sharded pack (rather than an LMDB file)."""
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"{"
    except OSError:
        return False


def shard_path(dst: str | os.PathLike, index: int) -> Path:
    return Path(f"{dst}-shard-{index:05d}")
