"""Benchmark results: the environment record and the JSON + Markdown files under ``benchmarks/results/``."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from lightning_gpu_boost.core.cpus import usable_cpus

__all__ = ['bar', 'environment', 'gpu_tag', 'write_result']


def gpu_tag(env: dict[str, Any] | None = None) -> str:
    """Short name of the machine's GPUs for file names: ``h200``, ``2xh200`` where the process sees two, ``cpu``;
    of :func:`environment`'s record ``env`` where given (results merged on another machine), else of this one."""
    if env is None:
        available = torch.cuda.is_available()
        name, count = (torch.cuda.get_device_name(0), torch.cuda.device_count()) if available else (None, 0)
    else:
        name, count = env.get("gpu"), env.get("gpu_count") or 1
    if not name:
        return "cpu"
    name = name.lower()
    short = next((tag for tag in ("h200", "h100", "a100", "l40s", "l4", "a10g", "v100", "t4") if tag in name),
                 name.replace("nvidia", "").strip().split()[0])  # fmt: skip
    return f"{count}x{short}" if count > 1 else short


def _package_root() -> Path:
    """The folder that holds the ``lightning_gpu_boost`` package (its checkout, where it is one)."""
    return Path(__file__).resolve().parents[2]


def _git_commit() -> str | None:
    """``$GIT_COMMIT`` where set (a copied checkout's ``.git`` may be stale), else the commit of the package's own
    checkout (``git rev-parse HEAD`` there, not in whatever repository encloses the working directory), else
    ``None`` (an installed package)."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    root = _package_root()
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5,
                             check=True)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def package_source_sha() -> str:
    """SHA-256 (first 16 hex digits) of the package's Python sources, by path and content: which code ran, even
    where no commit can be read (a copied checkout whose ``.git`` is stale, an installed package)."""
    import hashlib

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cpu_model() -> str | None:
    """The CPU's model name (Linux), which sets single-process figures such as a plain DataLoader's."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _package_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lightning-gpu-boost")
    except PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """GPU, CPU count, library versions and git commit of this run."""
    from importlib.metadata import version

    env: dict[str, Any] = {
        "date": _dt.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_count": torch.cuda.device_count(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "lightning": version("lightning"),
        "git_commit": _git_commit(),
        "lightning_gpu_boost": _package_version(),
        "package_source_sha": package_source_sha(),
    }
    for name, module in (("dali", "nvidia.dali"), ("torchvision", "torchvision"), ("pillow", "PIL")):
        try:
            env[name] = __import__(module, fromlist=["__version__"]).__version__
        except ImportError:
            env[name] = None
    return env


def bar(
    value: float, target: float, unit: str, higher_is_better: bool = True, strict: bool = False
) -> dict[str, Any]:
    """One bar of an issue: ``{value, target, unit, pass}`` (``strict``: the target itself does not pass)."""
    if strict:
        ok = value > target if higher_is_better else value < target
    else:
        ok = value >= target if higher_is_better else value <= target
    return {"value": round(float(value), 4), "target": target, "unit": unit, "pass": bool(ok)}


def write_result(
    script: str,
    figures: dict[str, Any],
    bars: dict[str, dict[str, Any]],
    out_dir: str | os.PathLike | None = None,
    env: dict[str, Any] | None = None,
    tag: str | None = None,
) -> Path:
    """Write ``<out_dir>/<script>-<date>-<gpu>.json`` and a ``.md`` table beside it; returns the JSON path.
    ``env`` and ``tag``: the environment and GPU tag of the machine that measured, where the file is written on
    another (results merged from a lent machine's calls); this machine's by default."""
    env = env if env is not None else environment()
    out = Path(out_dir or "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{script}-{env['date']}-{tag or gpu_tag(env)}.json"
    path.write_text(
        json.dumps({"script": script, "environment": env, "figures": figures, "bars": bars}, indent=2)
    )
    lines = [f"# {script} ({env['date']}, {env['gpu'] or 'CPU'}, {env['cpu_count']} CPUs)", ""]
    lines += ["| environment | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in env.items()]
    lines += ["", "| bar | value | target | unit | pass |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {b['value']} | {b['target']} | {_cell(b['unit'])} | {b['pass']} |" for k, b in bars.items()]
    lines += ["", "| figure | value |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in _flatten(figures).items()]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return path


def _cell(value: Any) -> str:
    """A Markdown table cell: ``|`` escaped, one line."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = round(value, 3) if isinstance(value, float) else value
    return flat
