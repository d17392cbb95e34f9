"""The package layout holds its rules: no two modules import each other (directly or through a
longer cycle), no package imports one above it in the order of layers (the architecture page's
list), counting imports made only for type checking and imports inside functions, and no
hand-written module grows past about 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
ARCHITECTURE = ROOT / "docs" / "contributing" / "architecture.md"
MAX_LINES = 500

# The packages (and top-level modules) of ``inferd``, bottom to top: each may import those on
# the layers below it, never one above; those on one layer import none of each other. ``inferd``
# is the package's own ``__init__`` (the public face). The architecture page lists the same.
LAYERS: list[list[str]] = [
    ["core", "version", "install"],
    ["config", "security"],
    ["backends"],
    ["scheduling"],
    ["plane"],
    ["repository"],
    ["observability", "torchserve", "dashboard"],
    ["protocols", "workers"],
    ["app"],
    ["bench", "optimize", "demo", "pytriton"],
    ["tune"],
    ["cli", "inferd"],
    ["__main__"],
]


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


def _unit(module: str) -> str:
    """The entry of ``LAYERS`` a module belongs to: its package below ``inferd``, or itself
    when it is a module at the top (``inferd`` for the package's ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "inferd"


def _upward(edges: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Every import of a module by one on its own layer or below, ``importer -> imported``
    (a package's own modules excepted)."""
    level = {unit: n for n, units in enumerate(layers) for unit in units}
    found = []
    for name in sorted(edges):
        for target in sorted(edges[name]):
            low, high = _unit(name), _unit(target)
            if low != high and level[high] >= level[low]:
                found.append(f"{name} -> {target}")
    return found


def test_every_package_has_a_layer() -> None:
    modules = _modules()
    placed = [unit for units in LAYERS for unit in units]
    assert len(placed) == len(set(placed))
    assert sorted({_unit(name) for name in modules}) == sorted(placed)


def test_no_package_imports_one_above_it_or_beside_it() -> None:
    modules = _modules()
    edges = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _upward(edges, LAYERS) == []


def test_the_layer_finder_sees_an_import_up_and_one_beside() -> None:
    edges = {
        "inferd.a.x": {"inferd.a", "inferd.b.y"},  # its own package; up
        "inferd.b.y": {"inferd.v"},  # down
        "inferd.c.z": {"inferd", "inferd.b.y"},  # beside; down
    }
    layers = [["a", "v"], ["b"], ["c", "inferd"]]
    assert _upward(edges, layers) == ["inferd.a.x -> inferd.b.y", "inferd.c.z -> inferd"]


def test_the_architecture_page_lists_the_same_layers() -> None:
    text = ARCHITECTURE.read_text()
    block = text.split("<!-- layers -->", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    rows = [line.split("│", 1)[0].split() for line in block.strip().splitlines()]
    listed = [[unit.rstrip("/") for unit in row] for row in reversed(rows) if row]
    assert listed == LAYERS


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
