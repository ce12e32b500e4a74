"""How a policy's functions read parameters by name: ``params[QUIT_AFTER]``.

A policy lays its parameters out in the order it declares them, one int64 slot each. For
every function it runs, :func:`bind` makes a copy whose globals also hold each parameter's
name as its slot number, so ``params[QUIT_AFTER]`` reads the slot that the policy's own
array (``Policy.param_array``) fills with QUIT_AFTER, wherever the table puts it. Numba
takes an integer global as a constant, so the compiled daemon indexes exactly as with a
literal, and ``kernels/compiler.py``'s cache key, which hashes the integers a function
reads, follows the layout.

A copy per policy, not names written into the function's module: two policies that share a
function may lay their parameters out differently. The copy sees the module as it is when
the policy is made, so make the policy after everything its functions use.

:func:`bind` refuses what would read the wrong value: ``params[3]`` (a position, which a
reordered table silently changes), ``params[NAME]`` for a NAME the policy does not
declare, and a parameter named like a module global that the function reads.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
import textwrap
import types
from typing import Callable, Dict, Mapping, Tuple

__all__ = ["bind", "unbound"]

_BOUND: Dict[Tuple[Callable, Tuple[Tuple[str, int], ...]], Callable] = {}


def unbound(fn: Callable) -> Callable:
    """The function as its author wrote it (``fn`` itself unless :func:`bind` made it, or
    :func:`~pydfccl.sched.signatures.adapt` from one of an older signature)."""
    return getattr(fn, "_pydfccl_unbound", fn)


def bind(fn: Callable, slots: Mapping[str, int], policy: str = "") -> Callable:
    """``fn`` reading each parameter name as its slot in ``slots``; the same object for the
    same function and layout, so that a policy with new values keeps its compiled daemon.
    ``fn`` may be a function as written, one adapted from an older signature, or a bound
    copy (whose code is bound again)."""
    source = getattr(fn, "_pydfccl_source", fn)   # a bound copy's: the code it copied
    layout = tuple(slots.items())
    bound = _BOUND.get((source, layout))
    if bound is None:
        _check_reads(source, slots, policy)
        scope = dict(source.__globals__)
        scope.update(slots)
        bound = types.FunctionType(source.__code__, scope, source.__name__,
                                   source.__defaults__, source.__closure__)
        bound.__kwdefaults__ = source.__kwdefaults__
        bound.__qualname__ = source.__qualname__
        bound.__module__ = source.__module__
        bound.__doc__ = source.__doc__
        bound._pydfccl_unbound = unbound(source)
        bound._pydfccl_source = source
        _BOUND[(source, layout)] = bound
    return bound


def _check_reads(fn: Callable, slots: Mapping[str, int], policy: str) -> None:
    where = f"policy {policy!r}, {fn.__qualname__}"
    for name in slots:
        if name in fn.__code__.co_names and name in fn.__globals__:
            raise ValueError(f"{where}: parameter {name} has the name of a global the "
                             f"function reads ({fn.__module__}.{name}); rename one")
    tree = _syntax(fn)
    if tree is None or not tree.args.args:
        return
    params = tree.args.args[0].arg
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id == params):
            continue
        index = node.slice
        if isinstance(index, ast.Name) and index.id in slots:
            if not isinstance(node.ctx, ast.Load):
                raise ValueError(f"{where}: writes {params}[{index.id}]; parameters are "
                                 "read-only")
            continue
        read = f"{where}: reads {params}[{ast.unparse(index)}]"
        if isinstance(index, ast.Constant):
            raise ValueError(f"{read} by position; read it by name, as in params[QUIT_AFTER]")
        if isinstance(index, ast.Name):
            raise ValueError(f"{read}, which the policy does not declare (it declares "
                             f"{sorted(slots)})")
        raise ValueError(f"{read}; index {params} with a declared parameter's name")


def _syntax(fn: Callable):
    """The function's definition as a syntax tree, or None when its source is not at hand
    (a lambda, a function typed into a prompt)."""
    code = fn.__code__
    linecache.checkcache(code.co_filename)     # as inspect does: an edited file is read anew
    text = "".join(linecache.getlines(code.co_filename, fn.__globals__))
    node = _definitions(code.co_filename, text).get(code.co_firstlineno) if text else None
    if node is not None and node.name == fn.__name__:
        return node
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    return node if isinstance(node, ast.FunctionDef) else None


@functools.lru_cache(maxsize=64)
def _definitions(filename: str, text: str) -> dict:
    """Every function definition of a source file by the line its code starts on (its
    first decorator's, or its ``def``), parsed once: ``inspect.getsource`` tokenizes the
    file anew for each function, and binding the package's own policies did that 30 times
    in every process (a third of ``import pydfccl``)."""
    try:
        tree = ast.parse(text, filename)
    except (SyntaxError, ValueError):
        return {}
    return {min([node.lineno] + [d.lineno for d in node.decorator_list]): node
            for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
