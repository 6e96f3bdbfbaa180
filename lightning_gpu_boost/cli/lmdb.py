"""``lightning-gpu-boost pack`` and ``lightning-gpu-boost verify``: LMDB packs from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from lightning_gpu_boost.cli._args import SEED_MAX, at_least, between

__all__ = ['add_pack_arguments', 'add_verify_arguments', 'run_pack', 'run_verify']


def add_pack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="class-per-folder image tree")
    parser.add_argument("dst", help="the pack file to write (written as DST.partial, renamed when complete)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted pack (DST.partial)")
    parser.add_argument("--workers", type=at_least(0), help="reader threads (default: none, reading between commits, for files under 32 KiB on average, else 2; more add GIL contention when files are in the page cache; raise it on network filesystems)")
    parser.add_argument("--commit-every", type=at_least(1), default=1000, help="records per commit")
    parser.add_argument(
        "--shard-size", type=at_least(1), help="records per file: DST becomes a JSON manifest of the shards"
    )
    parser.add_argument(
        "--on-bad", choices=("skip", "fail"), default="skip",
        help="a file that is empty, not an image, truncated or unreadable: skip it and list it in the pack's metadata "
             "and DST.bad-samples.json (default), or fail at once naming it",
    )  # fmt: skip
    parser.add_argument(
        "--check", choices=("structure", "decode", "none"), default="structure",
        help="how each file is checked as it is read: its format's structure (default, microseconds), also a "
             "reduced decode (catches damage inside the compressed data; about a reduced decode per file), or not",
    )  # fmt: skip
    parser.add_argument(
        "--max-side", type=at_least(8),
        help="store images whose shorter side is larger resized to this many pixels and re-encoded as JPEG (as FFCV "
             "does; e.g. 256 for 224 crops); smaller images keep their bytes",
    )  # fmt: skip
    parser.add_argument("--quality", type=between(1, 100), default=90, help="JPEG quality of resized images (default 90)")
    parser.add_argument(
        "--shuffle-seed", type=between(0, SEED_MAX),
        help="write the records in a random order by this seed instead of class by class, so that a block-shuffled "
             "read (LMDBDataModule(order='block')) mixes classes in every batch",
    )  # fmt: skip
    parser.set_defaults(func=run_pack)


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a pack written by `lightning-gpu-boost pack`")
    parser.add_argument(
        "--decode", action="store_true",
        help="also decode every image record; undecodable ones are listed by index and original path",
    )  # fmt: skip
    parser.set_defaults(func=run_verify)


def run_pack(args: argparse.Namespace) -> int:
    from lightning_gpu_boost.core.lmdb import bad_samples_report_path, open_pack, pack_image_folder

    path = pack_image_folder(args.src, args.dst, resume=args.resume, workers=args.workers,
                             commit_every=args.commit_every, shard_size=args.shard_size, on_bad=args.on_bad,
                             check=args.check, max_side=args.max_side, quality=args.quality,
                             shuffle_seed=args.shuffle_seed)  # fmt: skip
    reader = open_pack(path)
    bad = reader.meta("bad_samples") or []
    resized = f", images resized to a shorter side of at most {args.max_side} px" if args.max_side else ""
    print(f"packed {args.src} -> {path}: {len(reader)} records{resized}")
    if bad:
        shown = "\n".join(f"  {entry['path']}: {entry['reason']}" for entry in bad[:10])
        more = f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else ""
        print(f"skipped {len(bad)} bad files (listed in {bad_samples_report_path(path)}):\n{shown}{more}")
    if not len(reader):
        print(f"lightning-gpu-boost: error: {path} keeps no record: every file of {args.src} was left out.",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from lightning_gpu_boost.core.lmdb import verify

    summary = verify(args.file, decode=args.decode)
    print(json.dumps(summary, indent=1))
    return 0 if summary["ok"] else 1
