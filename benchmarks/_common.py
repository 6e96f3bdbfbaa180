"""What every benchmark script shares: its common arguments and the demo JPEG tree."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_gpu_boost.core.images import make_jpeg_folder


def parser_for(doc: str | None) -> argparse.ArgumentParser:
    """A parser with ``--data``, ``--images``, ``--batch-size`` and ``--out``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=".demo-data", help="folder of the generated demo JPEGs")
    parser.add_argument("--images", type=int, default=8000, help="demo JPEGs (100 classes)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--out", default="benchmarks/results", help="where the JSON and Markdown results go")
    return parser


def demo_tree(args: argparse.Namespace) -> Path:
    """The demo JPEG tree for ``args.images`` images (generated once, then reused)."""
    return make_jpeg_folder(f"{args.data}/jpeg-{args.images}-100", n=args.images, num_classes=100)
