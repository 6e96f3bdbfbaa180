"""Shared test harness: the ``gpu`` marker, a small synthetic JPEG tree, and BoringModel-style modules."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from lightning_gpu_boost.core.bad_samples import add_broken_files
from lightning_gpu_boost.core.images import make_jpeg_folder

os.environ.setdefault("PL_DISABLE_FORK", "0")


def pytest_collection_finish(session):
    """What collection imported (torch, Lightning, the tests' modules: about 400,000 objects) moves to the garbage
    collector's permanent generation: every full collection afterwards, automatic or a ``gc.collect()`` before
    forking workers, took about 0.2 s walking them (14 s of a 150 s serial run of two test files), and the
    DataLoader workers forked from this process no longer copy their pages by walking them."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _tree_status() -> set[str] | None:
    """``git status --porcelain`` of the checkout the tests run in (``None`` outside a git checkout)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return set(out.splitlines())


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controlling process (or a run without pytest-xdist)
        session.config._tree_before = _tree_status()


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session, exitstatus):
    """A child process left behind (a pool's worker still running when its test timed out) must not keep the run
    from ending: at exit, concurrent.futures joins the workers of every pool it started. And the run leaves the
    checkout as it found it: a file a test wrote outside its ``tmp_path`` fails the run, named."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=10)
    yield  # after pytest-xdist's own: the exit status is settled here
    before = getattr(session.config, "_tree_before", None)
    after = _tree_status() if before is not None else None
    if after is not None and after - before:
        left = sorted(after - before)
        sys.stderr.write(f"\nThe tests left {len(left)} change(s) in the checkout (write under tmp_path): "
                         f"{left[:10]}\n")  # fmt: skip
        session.exitstatus = 1


_RESUME_LINES: list[str] = []


@pytest.fixture
def resume_report():
    """Collects the resume harness's counts for pytest's summary."""
    return _RESUME_LINES.append


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _RESUME_LINES:
        terminalreporter.section("resume harness")
        for line in _RESUME_LINES:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Keep the num_workers cache of the tests apart from the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def jpeg_tree(tmp_path_factory):
    """24 small JPEGs in 3 class folders (deterministic)."""
    from lightning_gpu_boost.core.images import make_jpeg_folder

    root = tmp_path_factory.mktemp("jpegs")
    return make_jpeg_folder(
        root, n=24, num_classes=3, size_range=(80, 120, 64, 96), workers=2, progress=False
    )


@pytest.fixture
def trainer_kwargs(tmp_path):
    """Quiet CPU Trainer arguments."""
    return {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": str(tmp_path),
    }


@pytest.fixture(autouse=True)
def _close_dali_loaders():
    """DALI pipelines and their threads end with the test that made them (a later fork must not inherit them)."""
    yield
    dali = sys.modules.get("lightning_gpu_boost.core.dali")
    if dali is not None:
        dali.close_all()


BROKEN_TREE_GOOD = 294  # + 6 broken files (one per kind) = 2 % broken


@pytest.fixture(scope="module")
def broken_tree(tmp_path_factory):
    """A tree of ``BROKEN_TREE_GOOD`` good JPEGs and one broken file of each kind: ``(root, broken paths)``."""
    root = make_jpeg_folder(tmp_path_factory.mktemp("broken") / "src", n=BROKEN_TREE_GOOD, num_classes=3,
                            size_range=(48, 80, 40, 64), progress=False)  # fmt: skip
    return str(root), add_broken_files(root)


from tests.s3_server import s3, s3_server  # noqa: E402, F401  (fixtures: a real S3 endpoint on 127.0.0.1)
