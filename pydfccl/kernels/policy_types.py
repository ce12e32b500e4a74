"""A policy's functions type-checked as the daemon compiles them, in a second.

The daemon (``make_daemon`` in :mod:`.daemon`) compiles each function as a CUDA device
function and calls it with int64 values and the parameters as an int64 array in shared
memory; the GPU has no Python objects and no allocator (Numba's runtime, NRT, is off).
:func:`check_policy_types` compiles each function with Numba on the CPU with the very same
argument types and NRT off, so what cannot compile for the device (a Python dict or list,
a global that is not a number, a float budget) is refused here, with the line, in about a
second, where compiling the whole daemon to PTX takes minutes. The simulator runs the
functions as plain Python, so a communicator on the simulator calls this check first
(:func:`pydfccl.host.daemons.daemon_for`): a policy that cannot compile fails there at
once, as it would on a GPU.

That second was paid by every simulated rank process, each a fresh interpreter. A function
that passed leaves a mark in the kernel cache directory, named by a hash of what the check
depends on (its source, the numbers it reads, its role and that role's arguments, this
module's code, Numba's version), and a later process skips the compile. Only functions
whose result the hash decides are marked: no closure, and every global they read a number
(a function they call could change unseen).
"""

from __future__ import annotations

import hashlib
import inspect
import linecache
import re
from functools import lru_cache
from pathlib import Path

from ..sched.signatures import ARGS

__all__ = ["PolicyTypeError", "DEVICE_SIGNATURES", "check_policy_types", "check_function"]

# The argument types of each call in daemon.py: ``params`` is the block's shared int64
# array (C-contiguous); is_head, try_count (st[S_TRIES]), threshold (st[S_THRESH]), waited
# (spin_wait's int64), priority (tasks[T_PRIO]), memo (tasks[T_MEMO]), seq, coll and idle
# (now_ns() - ...) are int64 words. The names and their order: sched.signatures.ARGS.
_ARGS = ARGS
DEVICE_SIGNATURES = {name: len(args) for name, args in _ARGS.items()}
# this module's code, part of a pass mark's hash: a changed check marks afresh
_CHECKER = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


class PolicyTypeError(ValueError):
    """A policy function the device cannot compile; the message names the function, its
    file and line, and why."""


def _signature(nargs: int):
    from numba import types

    return (types.Array(types.int64, 1, "C"),) + (types.int64,) * (nargs - 1)


_LOCATIONS = (re.compile(r'File "([^"]+)", line (\d+)'), re.compile(r" at (\S+) \((\d+)\)"))


def _where(fn, message: str):
    """(file, line) of the function's own line the error points at, else its first."""
    code = fn.__code__
    base = code.co_filename.replace("\\", "/").rsplit("/", 1)[-1]
    last = None
    for pattern in _LOCATIONS:
        for path, line in pattern.findall(message):
            if path.replace("\\", "/").rsplit("/", 1)[-1] == base and \
                    int(line) >= code.co_firstlineno:
                last = int(line)
    return code.co_filename, last or code.co_firstlineno


def _reason(message: str) -> str:
    if "NRT required" in message or re.search(r"DictType|ListType|build_map|build_list|"
                                              r"build_set|unicode_type", message):
        return ("builds a Python object (dict, list, set or string), which the device "
                "cannot allocate: use integer arithmetic and params[NAME]")
    m = re.search(r"Untyped global name '(\w+)'.*?of <class '(\w+)'>", message, re.S)
    if m:
        return (f"reads the global {m.group(1)}, a {m.group(2)}; the device takes only "
                "integer constants (declare a parameter instead)")
    for line in message.splitlines():
        line = line.strip()
        if line and not line.startswith(("Failed in", "During:", "File ", "^")):
            return line
    return message.strip().splitlines()[0] if message.strip() else "does not compile"


def _passed_mark(fn, role: str):
    """The path of the mark that ``fn`` passed in ``role``, or None where the hash of its
    text cannot decide the check's result."""
    import numba

    from .cache_place import cache_dir

    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__closure__", None):
        return None
    reads = {name: fn.__globals__[name] for name in code.co_names if name in fn.__globals__}
    if any(not isinstance(v, (bool, int, float)) for v in reads.values()):
        return None
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    text = "\n".join([role, repr(_ARGS[role]), _CHECKER, numba.__version__, source,
                      repr(sorted(reads.items())), repr(getattr(fn, "__defaults__", None))])
    return cache_dir() / f"policy-check-{hashlib.sha256(text.encode()).hexdigest()[:32]}.ok"


@lru_cache(maxsize=256)
def check_function(fn, role: str) -> None:
    """Compile ``fn`` (a policy's bound function in role ``role``) as the device would;
    PolicyTypeError when it cannot be or returns something other than an integer. A pass
    is marked on disk (``_passed_mark``) and not compiled again."""
    mark = _passed_mark(fn, role)
    if mark is not None and mark.exists():
        return
    _compile_check(fn, role)
    if mark is not None:
        try:
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.touch()
        except OSError:
            pass          # a read-only cache: the check runs again next time


def _compile_check(fn, role: str) -> None:
    import numba
    from numba import types
    from numba.core.errors import NumbaError

    name = getattr(fn, "__qualname__", repr(fn))
    try:
        compiled = numba.njit(_signature(DEVICE_SIGNATURES[role]), _nrt=False,
                              no_cpython_wrapper=True)(fn)
    except NumbaError as exc:
        path, line = _where(fn, str(exc))
        text = linecache.getline(path, line).strip()
        raise PolicyTypeError(f"{role} ({name}, {path}:{line}) {_reason(str(exc))}"
                              + (f": {text}" if text else "")) from None
    returned = compiled.nopython_signatures[0].return_type
    if not isinstance(returned, (types.Integer, types.Boolean)):
        path, line = fn.__code__.co_filename, fn.__code__.co_firstlineno
        raise PolicyTypeError(f"{role} ({name}, {path}:{line}) returns {returned}, not an "
                              "integer (the daemon keeps budgets, keys and counts in int64)")


def check_policy_types(policy) -> None:
    """Every function of ``policy`` compiled with the daemon's argument types; the first
    that cannot be raises :class:`PolicyTypeError` naming the policy."""
    for role, fn in zip(_ARGS, policy.functions):
        try:
            check_function(fn, role)
        except PolicyTypeError as exc:
            raise PolicyTypeError(f"policy {policy.name!r}: {exc}") from None
