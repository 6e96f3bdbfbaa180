"""LMDB packs: one safe file per dataset (no pickle, a CRC per record), written resumably and read fast.

One module per job: :mod:`.format` (the record and metadata layout), :mod:`.writer` (:class:`PackWriter`),
:mod:`.pack` (the packers), :mod:`.reader` (:class:`PackReader`, the fork gate, the block read-ahead),
:mod:`.pages` (LMDB's B-tree pages read without LMDB), :mod:`.page_cache` (a small pack read into memory whole),
:mod:`.sharded` (:class:`ShardedPackReader`, :func:`open_pack`) and :mod:`.verify`. The names below are the
public ones; ``lmdb`` itself (py-lmdb, the ``lmdb`` extra) is imported when a pack is opened.
"""

from lightning_gpu_boost.core.lmdb.format import (
    CODECS,
    CRC_PREFIX,
    HEADER,
    KEY,
    MANIFEST_FORMAT,
    META,
    READABLE_VERSIONS,
    RECORDS,
    SCHEMA_VERSION,
    CorruptRecordError,
    IncompletePackError,
    Record,
    StalePackError,
    crc32,
    decode_record,
    encode_record,
    is_manifest,
    meta_crc,
    pack_sample,
    record_crc,
    shard_path,
    unpack_sample,
)
from lightning_gpu_boost.core.lmdb.pack import (
    bad_samples_report_path,
    pack_dataset,
    pack_image_folder,
    pack_workers,
)
from lightning_gpu_boost.core.lmdb.reader import PackReader, close_readers, file_identity
from lightning_gpu_boost.core.lmdb.sharded import ShardedPackReader, open_pack
from lightning_gpu_boost.core.lmdb.verify import verify, verify_file
from lightning_gpu_boost.core.lmdb.writer import PackWriter

__all__ = [
    "CODECS", "CRC_PREFIX", "HEADER", "KEY", "MANIFEST_FORMAT", "META", "READABLE_VERSIONS", "RECORDS",
    "SCHEMA_VERSION", "CorruptRecordError", "IncompletePackError", "PackReader", "PackWriter", "Record",
    "ShardedPackReader", "StalePackError", "bad_samples_report_path", "close_readers", "crc32", "decode_record",
    "encode_record", "file_identity", "is_manifest", "meta_crc", "open_pack", "pack_dataset", "pack_image_folder",
    "pack_sample", "pack_workers", "record_crc", "shard_path", "unpack_sample", "verify", "verify_file",
]  # fmt: skip
