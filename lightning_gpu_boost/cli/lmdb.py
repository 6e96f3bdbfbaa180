"""``lightning-gpu-boost pack`` and ``lightning-gpu-boost verify``: LMDB packs from the command line."""

from __future__ import annotations

import argparse
import json


def add_pack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="class-per-folder image tree")
    parser.add_argument("dst", help="the pack file to write (written as DST.partial, renamed when complete)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted pack (DST.partial)")
    parser.add_argument("--workers", type=int, help="reader threads (default: none, reading between commits, for files under 32 KiB on average, else 2; more add GIL contention when files are in the page cache; raise it on network filesystems)")
    parser.add_argument("--commit-every", type=int, default=1000, help="records per commit")
    parser.add_argument(
        "--shard-size", type=int, help="records per file: DST becomes a JSON manifest of the shards"
    )
    parser.set_defaults(func=run_pack)


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a pack written by `lightning-gpu-boost pack`")
    parser.set_defaults(func=run_verify)


def run_pack(args: argparse.Namespace) -> int:
    from lightning_gpu_boost.core.lmdb_format import pack_image_folder

    if args.commit_every < 1:
        raise SystemExit(f"--commit-every must be >= 1, got {args.commit_every}.")
    path = pack_image_folder(args.src, args.dst, resume=args.resume, workers=args.workers,
                             commit_every=args.commit_every, shard_size=args.shard_size)  # fmt: skip
    print(f"packed {args.src} -> {path}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from lightning_gpu_boost.core.lmdb_format import verify

    summary = verify(args.file)
    print(json.dumps(summary, indent=1))
    return 0 if summary["ok"] else 1
