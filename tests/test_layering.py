"""The package's layering, read from its source: no import circle (imports inside functions count: a circle that
lives only because one of its imports is deferred breaks the day someone hoists it), no core module that imports
Lightning, a callback or a DataModule, and no module over 600 lines (the watchdog's callback over 350)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "lightning_gpu_boost"
MAX_LINES = 600
#: modules held to a smaller size: the watchdog's callback is an adapter, its work lives in core
SMALLER = {"lightning_gpu_boost.callbacks.gpu_util_watchdog": 350}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, at any level (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = {id(n) for node in ast.walk(tree) if _type_checking(node) for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_inits(circle: list[str]) -> bool:
    """A package and the submodules its ``__init__`` re-exports (each submodule importing a sibling through the
    package) is how a package's front door works, not a circle between layers."""
    heads = {m for m in circle if any(o.startswith(m + ".") for o in circle)}
    return len(heads) == 1 and all(m in heads or m.startswith(next(iter(heads)) + ".") for m in circle)


def test_no_import_circle(graph):
    circles = [c for c in _circles(graph) if not _package_inits(c)]
    assert not circles, circles


def test_core_imports_no_lightning_callback_or_datamodule():
    modules = _modules()
    bad = []
    for name, path in modules.items():
        if not name.startswith("lightning_gpu_boost.core"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])  # fmt: skip
            for imported in names:
                if imported.split(".")[0] in ("lightning", "pytorch_lightning") or imported.startswith(
                    ("lightning_gpu_boost.callbacks", "lightning_gpu_boost.datamodules", "lightning_gpu_boost.strategies")
                ):
                    bad.append(f"{name} imports {imported}")
    assert not bad, bad


def test_no_module_over_its_size():
    big = []
    for name, path in _modules().items():
        lines = len(path.read_text().splitlines())
        if lines > SMALLER.get(name, MAX_LINES):
            big.append(f"{name}: {lines} lines (at most {SMALLER.get(name, MAX_LINES)})")
    assert not big, big


def test_no_stack_frames_read():
    readers = [name for name, path in _modules().items() if "sys._getframe" in path.read_text()]
    assert not readers, readers
