"""The package's shape stays one a newcomer can follow: no import cycles between its modules,
and modules small enough to read in one sitting.

The imports are read from the source (no module is imported): every ``import`` and
``from ... import`` at module level (in the module body, or in an ``if``/``try``/``with``
there, but not inside a function or class, which runs only when called), relative imports
resolved against the module's package. ``from pkg import name`` counts as an import of
``pkg.name`` when that is a module, otherwise of ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pydfccl"
MAX_LINES = 450               # a module outside pydfccl/kernels/
COMMUNICATOR = PACKAGE / "host" / "communicator.py"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def module_level(body: list[ast.stmt]):
    """The import statements run when the module is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody"):
                yield from module_level(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                yield from module_level(handler.body)


def imports_of(name: str) -> set[str]:
    """The package's modules that module ``name`` imports at module level."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in module_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                       for alias in node.names]
        for target in targets:
            # ``import a.b.c`` imports a, a.b and a.b.c; the deepest module of the package
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (the first repeated at the end), or None."""
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_import_reader_resolves_relative_imports():
    """A check of the reader itself: modules known to import one another."""
    assert "pydfccl.host.communicator" in MODULES
    host = imports_of("pydfccl.host.communicator")
    assert host & {m for m in MODULES if m.startswith("pydfccl.host.")}, host
    assert "pydfccl.bootstrap.mpi" in imports_of("pydfccl")   # the rest loads lazily


def test_find_cycle_names_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_in_the_package():
    graph = {name: imports_of(name) for name in MODULES}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_modules_outside_the_kernels_are_small():
    """The device kernels are long by nature (one step loop); the host side is not."""
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values()
            if "kernels" not in p.relative_to(PACKAGE).parts[:1]
            and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    n = len(COMMUNICATOR.read_text().splitlines())
    assert n < MAX_LINES, f"{COMMUNICATOR.relative_to(ROOT)} has {n} lines"
