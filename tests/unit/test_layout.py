"""The package layout holds its rules: no two modules import each other (directly or through a
longer cycle), counting imports made only for type checking and imports inside functions, and
no hand-written module grows past about 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in (SRC / "inferd").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _generated(path: Path) -> bool:
    return path.stem.endswith(("_pb2", "_pb2_grpc"))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every inferd module ``name`` imports anywhere in its file (the module itself when an
    import names a module, else the package whose attribute it takes)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_another_that_imports_it_back() -> None:
    modules = _modules()
    edges = {
        name: _imports(name, path, modules)
        for name, path in modules.items()
        if not _generated(path)
    }
    assert _cycles(edges) == []


def test_the_cycle_finder_sees_type_only_and_function_level_imports(tmp_path: Path) -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from inferd.core.types import InferRequest\n"
        "def f():\n    from inferd.core import errors\n"
    )
    modules = {"inferd.core.types": source, "inferd.core.errors": source, "m": source}
    assert _imports("m", source, modules) == {"inferd.core.types", "inferd.core.errors"}


def test_no_hand_written_module_is_over_500_lines() -> None:
    long = {
        name: count
        for name, path in _modules().items()
        if not _generated(path) and (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_at_most_eight_modules_sit_at_the_top() -> None:
    top = sorted(p.name for p in (SRC / "inferd").glob("*.py"))
    assert len(top) <= 8, top
    assert "cli.py" in top  # the entry point ``inferd`` (pyproject's [project.scripts])
