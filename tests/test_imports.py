"""Optional dependencies (``_imports.py``): found without importing them; a missing one names its extra."""

from __future__ import annotations

import pytest


def test_missing_optional_dependency_names_the_extra(monkeypatch):
    from lightning_gpu_boost import _imports

    def missing(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(_imports.importlib, "import_module", missing)
    with pytest.raises(ImportError, match=r"pip install 'lightning-gpu-boost\[nvml\]'"):
        _imports.require("pynvml")
    with pytest.raises(ImportError, match=r"dali-cuda13"):
        _imports.require("nvidia.dali")


def test_module_available_never_imports():
    import sys

    from lightning_gpu_boost._imports import module_available

    assert module_available("json") and not module_available("no_such_module_here")
    assert not module_available("no_such_package.sub")  # a missing parent is an answer, not an error
    assert "this_is_not_imported" not in sys.modules


@pytest.mark.parametrize("argv", [["doctor", "--data", "x"], ["bench", "--bogus"], ["demo", "--images", "0"],
                                  ["pack", "--nope"], ["doctor", "--model", "y"]])  # fmt: skip
def test_a_cli_mistake_is_reported_before_torch_is_imported(argv):
    """A mistyped argument is one line in a fraction of a second: nothing heavy is imported to say so."""
    import json
    import subprocess
    import sys

    code = ("import json, sys\nfrom lightning_gpu_boost.cli import main\ntry:\n    rc = main(json.loads(sys.argv[1]))\n"
            "except SystemExit as stop:\n    rc = stop.code\n"
            "print(json.dumps([rc, sorted(m for m in ('torch', 'lightning') if m in sys.modules)]))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=120)
    rc, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert rc == 2 and heavy == [], (argv, out.stderr[-500:])
