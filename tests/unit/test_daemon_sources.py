"""The daemon's cache key covers what it is compiled from: every module of the package
that the kernels import, directly or through another, is among the key's sources or is
one of the host-side modules the key leaves out. A module missed would let an edit to a
kind's code or the preempted mark load a stale daemon from the cache, or a stale shipped
cubin."""

import ast
from pathlib import Path

from pydfccl.kernels import compiler

PACKAGE = Path(compiler.__file__).resolve().parent.parent


def _module_file(name: str) -> Path | None:
    path = PACKAGE.parent.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate.resolve()
    return None


def _imported_files(path: Path) -> set[Path]:
    """The package's modules that ``path`` imports (``from . import x`` names a module too)."""
    package = list(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {f for f in map(_module_file, names)
                  if f is not None and f.is_relative_to(PACKAGE)}
    return found


def _left_out(path: Path) -> bool:
    relative = path.relative_to(PACKAGE).as_posix()
    return (path.name == "__init__.py" and not path.read_text().strip()
            or path.parent.name == "kernels" and path.name in compiler._HOST_ONLY
            or relative in compiler._NOT_COMPILED)


def test_every_module_the_kernels_import_is_keyed_or_left_out_on_purpose():
    keyed = {p.resolve() for p in compiler._SOURCES}
    seen, todo = set(), list(keyed)
    while todo:
        path = todo.pop()
        if path in seen or _left_out(path):
            continue
        seen.add(path)
        todo.extend(_imported_files(path))
    unkeyed = sorted(p.relative_to(PACKAGE).as_posix() for p in seen - keyed)
    assert not unkeyed, f"compiled into the daemon but not in its cache key: {unkeyed}"
    assert {p.relative_to(PACKAGE).as_posix() for p in keyed} >= {
        "kernels/daemon.py", "protocol/collectives.py", "sched/signatures.py"}
