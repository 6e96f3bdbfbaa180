"""The ``lightning-gpu-boost`` command line: ``demo``, ``bench``, ``doctor``, ``pack``, ``verify``."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from lightning_gpu_boost.cli._args import OneLineParser

    parser = OneLineParser(prog="lightning-gpu-boost", description="Keep the GPU busy in PyTorch Lightning.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error (anywhere on the line)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)  # subcommands parse with OneLineParser too
    from lightning_gpu_boost.cli import bench, demo, doctor, lmdb

    demo.add_arguments(commands.add_parser("demo", help=demo.__doc__.splitlines()[0]))
    bench.add_arguments(
        commands.add_parser(
            "bench", help="the headline table on this machine, side by side in one run", description=bench.__doc__
        )
    )
    doctor.add_arguments(
        commands.add_parser(
            "doctor",
            help="measure your loader, copy and step, name the bottleneck",
            description=doctor.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    lmdb.add_pack_arguments(
        commands.add_parser("pack", help="pack a class-per-folder image tree into one LMDB file")
    )
    lmdb.add_verify_arguments(
        commands.add_parser("verify", help="check a pack's structure and every record's CRC")
    )
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lightning-gpu-boost")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "unknown (not installed)"


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that a user's input causes (a missing file, a wrong value, a damaged or interrupted pack)."""
    from lightning_gpu_boost.core.bad_samples import BadSampleError
    from lightning_gpu_boost.core.lmdb import CorruptRecordError, IncompletePackError

    return (OSError, ValueError, KeyError, ImportError, IncompletePackError, CorruptRecordError, BadSampleError)


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error prints one line (``lightning-gpu-boost: error: ...``) and returns 2, with the
    traceback only under ``--debug``; our own bugs keep their traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # accepted after the subcommand too
    argv = [a for a in argv if a != "--debug"] + (["--debug"] if debug else [])
    parser = build_parser()
    if debug:
        argv = ["--debug", *argv[:-1]]
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SystemExit as err:
        if isinstance(err.code, str) and not args.debug:
            print(f"lightning-gpu-boost: error: {err.code}", file=sys.stderr)
            return 2
        raise
    except Exception as err:
        if args.debug or not isinstance(err, user_errors()):
            raise
        print(f"lightning-gpu-boost: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
