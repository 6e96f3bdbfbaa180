"""The ``lightning-gpu-boost`` command line: ``demo`` (and later ``doctor``, ``bench``, ``pack``, ``verify``)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightning-gpu-boost", description="Keep the GPU busy in PyTorch Lightning.")
    commands = parser.add_subparsers(dest="command", required=True)
    from lightning_gpu_boost.cli import demo

    demo.add_arguments(commands.add_parser("demo", help=demo.__doc__.splitlines()[0]))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
