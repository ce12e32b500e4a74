"""The policy functions' signatures, one table for the daemon, the model and check-policy,
and functions written for an older signature adapted to the current one.

The budget functions once took neither the collective's priority nor the task's policy
word (``memo``). A function written that way still works: :func:`adapt` makes a copy of it
that takes the new trailing arguments and ignores them. The copy is compiled from the
function's own source, so that Numba compiles it for the device exactly as the original
(a Python wrapper calling the original could not be compiled there); a function whose
source is not at hand (typed into a prompt) is refused with the signature to write.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from typing import Callable, Dict, Tuple

__all__ = ["ARGS", "ROLES", "PREEMPTED", "adapt"]

# Each function's arguments, in the order the daemon passes them (all int64 but ``params``,
# the block's int64 parameter array).
ARGS: Dict[str, Tuple[str, ...]] = {
    "threshold_on_load": ("params", "is_head", "try_count", "priority", "memo"),
    "threshold_after_wait": ("params", "threshold", "waited", "priority"),
    "tries_per_pass": ("params", "is_head", "priority"),
    "order_key": ("params", "priority", "seq", "coll"),
    "should_quit": ("params", "idle"),
    "remember": ("params", "memo", "threshold", "waited", "priority"),
}
ROLES = tuple(ARGS)

# ``waited`` as ``remember`` sees it when the budget ran out and the task was preempted.
PREEMPTED = -1

# The signatures these functions had before; a function of that arity is adapted.
_OLD_ARITY = {"threshold_on_load": 3, "threshold_after_wait": 3, "tries_per_pass": 2}

_ADAPTED: Dict[Tuple[Callable, str], Callable] = {}


def _signature(role: str) -> str:
    return f"{role}({', '.join(ARGS[role])})"


def adapt(fn: Callable, role: str, policy: str = "") -> Callable:
    """``fn`` if it takes ``role``'s arguments; a copy that takes them (and ignores the new
    ones) if it has the role's old signature; else a TypeError naming the function and the
    signature to write."""
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    where = f"policy {policy!r}: {role} ({name})"
    if code is None:
        raise TypeError(f"{where} is not a Python function; write {_signature(role)}")
    nargs = code.co_argcount
    if nargs == len(ARGS[role]) and not code.co_flags & inspect.CO_VARARGS:
        return fn
    if nargs != _OLD_ARITY.get(role) or code.co_flags & inspect.CO_VARARGS:
        raise TypeError(f"{where} takes {nargs} positional arguments; the daemon calls "
                        f"{_signature(role)}")
    if fn.__name__ == "<lambda>":
        raise TypeError(f"{where} is a lambda of the older signature, {nargs} arguments; "
                        f"write {_signature(role)}")
    adapted = _ADAPTED.get((fn, role))
    if adapted is None:
        adapted = _widened(fn, ARGS[role][nargs:], where, role)
        _ADAPTED[(fn, role)] = adapted
    return adapted


def _widened(fn: Callable, extra: Tuple[str, ...], where: str, role: str) -> Callable:
    """``fn`` compiled anew from its source with the arguments ``extra`` appended (under
    names it does not use), its lines where they are in its file, its globals and
    closure its own."""
    code = fn.__code__
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError) as exc:
        raise TypeError(f"{where} has an older signature and its source is not at hand to "
                        f"adapt ({exc}); write {_signature(role)}") from None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef):
        raise TypeError(f"{where} has an older signature and is not a def statement to "
                        f"adapt; write {_signature(role)}")
    node.decorator_list = []
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
        {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    for arg in extra:
        while arg in used:
            arg = "_" + arg
        used.add(arg)
        node.args.args.append(ast.arg(arg=arg))
        if node.args.defaults:
            node.args.defaults.append(ast.Constant(0))
    ast.increment_lineno(tree, code.co_firstlineno - 1)
    body = [node]
    if code.co_freevars:       # defined in a function: give the copy the same free names
        assign = [ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None), lineno=1)
                  for v in code.co_freevars]
        outer = ast.FunctionDef("_outer", ast.arguments([], [], None, [], [], None, []),
                                assign + [node], [], lineno=1)
        body = [outer]
    module = ast.fix_missing_locations(ast.Module(body, []))
    compiled = compile(module, code.co_filename, "exec")
    new = _find_code(compiled, node.name)
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    closure = tuple(cells[v] for v in new.co_freevars) if new.co_freevars else None
    defaults = fn.__defaults__ + (0,) * len(extra) if fn.__defaults__ else None
    adapted = types.FunctionType(new, fn.__globals__, fn.__name__, defaults, closure)
    adapted.__qualname__ = fn.__qualname__
    adapted.__module__ = fn.__module__
    adapted.__doc__ = fn.__doc__
    adapted._pydfccl_unbound = fn
    return adapted


def _find_code(code: types.CodeType, name: str) -> types.CodeType:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                return const
            inner = _find_code(const, name)
            if inner is not None:
                return inner
    return None
