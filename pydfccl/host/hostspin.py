"""Waiting for a completion without holding the GIL.

A thread blocked in ``Future.result()`` learns of its collective's completion by watching
the next completion-queue stamp. Watching it from Python means sleeping between looks
(microseconds each, and the GIL taken back every time), which with several rank threads in
one process turns into GIL hand-offs that cost far more than the collective. These machine
code loops watch the stamp with atomic loads, called through ``ctypes`` (which releases the
GIL for the call), so the other ranks' threads run while one waits and the waiter sees the
stamp within a few hundred nanoseconds.

A call watches for a fixed time, ``CALL_SECONDS``, not a fixed number of looks, and the
caller checks its timeout and errors in Python between calls. Each return takes the GIL
back; at a look every few tenths of a nanosecond, a call of 20,000 looks returned every
8 us, so eight ranks waiting in one process took the GIL some 100,000 times a second
between them, and a rank thread filling or checking its buffers waited behind them. How
many looks make ``CALL_SECONDS`` is measured once a process (``spins_per_call``).

The loops are written in LLVM IR and compiled with llvmlite's JIT when first needed, in
9 ms on a CPU of the CI kind: as ``numba.njit`` functions loaded from Numba's disk cache
they cost every process 0.04-0.06 s to import and 0.15 s more at the first call there, and
wrote that cache into the installed package.
"""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np

__all__ = ["wait_for_stamp", "wait_for_any_stamp", "warm_up", "spins_per_call",
           "CALL_SECONDS"]

# How long one call watches before it returns to the caller's Python (timeouts, errors): a
# stamp is seen at once either way; a longer call takes the GIL less often.
CALL_SECONDS = 1e-4
CALIBRATION_SPINS = 100_000      # looks timed to size a call (tens of microseconds)

_loops: dict | None = None       # set once, whole, by _compiled
_loops_lock = threading.Lock()


def _counted_loop(builder, fn, count, body):
    """``for i in range(count): body(builder, i)``; ``body`` may return from ``fn``."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    entry = builder.block
    head, look, step, out = (fn.append_basic_block(n) for n in ("head", "look", "step", "out"))
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    builder.cbranch(builder.icmp_signed("<", i, count), look, out)
    builder.position_at_end(look)
    body(builder, i)
    builder.branch(step)
    builder.position_at_end(step)
    i.add_incoming(builder.add(i, ir.Constant(i64, 1)), step)
    builder.branch(head)
    builder.position_at_end(out)


def _stamp_reached(builder, fn, addr, want, found):
    """Return ``found`` from ``fn`` if the int64 at ``addr`` is at least ``want``, read with
    an acquire load (never hoisted out of the loop; it sees what the daemon wrote before its
    release store of the stamp)."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    ptr = builder.inttoptr(addr, ir.PointerType(i64))
    value = builder.load_atomic(ptr, "acquire", 8)
    hit = fn.append_basic_block("hit")
    miss = fn.append_basic_block("miss")
    builder.cbranch(builder.icmp_signed(">=", value, want), hit, miss)
    builder.position_at_end(hit)
    builder.ret(found)
    builder.position_at_end(miss)


def _module():
    """The IR of ``wait_for_stamp(addr, want, spins)`` (1: reached, 0: not yet) and
    ``wait_for_any_stamp(addrs, wants, n, spins)`` (the index of the first of ``n`` stamps
    that reached its want, -1: none yet)."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    ptr64 = ir.PointerType(i64)
    module = ir.Module(name="pydfccl_hostspin")

    one = ir.Function(module, ir.FunctionType(i64, [i64, i64, i64]), "wait_for_stamp")
    addr, want, spins = one.args
    b = ir.IRBuilder(one.append_basic_block("entry"))
    _counted_loop(b, one, spins,
                  lambda b, _: _stamp_reached(b, one, addr, want, ir.Constant(i64, 1)))
    b.ret(ir.Constant(i64, 0))

    any_ = ir.Function(module, ir.FunctionType(i64, [ptr64, ptr64, i64, i64]),
                       "wait_for_any_stamp")
    addrs, wants, n, spins = any_.args
    b = ir.IRBuilder(any_.append_basic_block("entry"))

    def each_stamp(b, j):
        _stamp_reached(b, any_, b.load(b.gep(addrs, [j])), b.load(b.gep(wants, [j])), j)

    _counted_loop(b, any_, spins, lambda b, _: _counted_loop(b, any_, n, each_stamp))
    b.ret(ir.Constant(i64, -1))
    return module


def _compiled() -> dict:
    """The two loops as ctypes functions, compiled once a process (the lock only until
    then: every waiter's call comes here)."""
    global _loops
    if _loops is not None:
        return _loops
    with _loops_lock:
        if _loops is None:
            import llvmlite.binding as llvm

            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
            module = llvm.parse_assembly(str(_module()))
            module.verify()
            engine = llvm.create_mcjit_compiler(module, machine)
            engine.finalize_object()
            i64, p = ctypes.c_int64, ctypes.c_void_p
            loops = dict(
                engine=engine,                # the code lives as long as its engine
                one=ctypes.CFUNCTYPE(i64, i64, i64, i64)(
                    engine.get_function_address("wait_for_stamp")),
                any=ctypes.CFUNCTYPE(i64, p, p, i64, i64)(
                    engine.get_function_address("wait_for_any_stamp")))
            loops["spins"] = _calibrated(loops["one"])
            _loops = loops
        return _loops


def _calibrated(one) -> int:
    """The looks that take about ``CALL_SECONDS``, from the fastest of three timed calls
    on a word that never changes. A call slowed by the machine's load makes fewer looks a
    call, never more (a shorter call, as before; never a late timeout)."""
    word = np.zeros(1, np.int64)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        one(word.ctypes.data, 1, CALIBRATION_SPINS)
        best = min(best, time.perf_counter() - t0)
    return max(1000, int(CALIBRATION_SPINS * CALL_SECONDS / max(best, 1e-9)))


def spins_per_call() -> int:
    """The ``spins`` that make a call of ``wait_for_stamp`` watch for about
    ``CALL_SECONDS`` when the stamp does not come."""
    return _compiled()["spins"]


def wait_for_stamp(addr: int, want: int, spins: int) -> bool:
    """Watch the int64 at ``addr`` until it is at least ``want`` or ``spins`` looks have
    passed, without the GIL; return whether it got there."""
    return bool(_compiled()["one"](addr, want, spins))


def wait_for_any_stamp(addrs: np.ndarray, wants: np.ndarray, spins: int) -> int:
    """Watch several int64s at once (``addrs``, ``wants``: int64 arrays of one length);
    return the index of the first that reached its ``wants`` entry, or -1 after ``spins``
    rounds."""
    addrs = np.ascontiguousarray(addrs, np.int64)
    wants = np.ascontiguousarray(wants, np.int64)
    if addrs.shape != wants.shape or addrs.ndim != 1:
        raise ValueError(f"addrs and wants must be 1-d and of one length, got shapes "
                         f"{addrs.shape} and {wants.shape}")
    return int(_compiled()["any"](addrs.ctypes.data, wants.ctypes.data, addrs.size, spins))


def warm_up() -> None:
    """Compile both loops (and size a call) now rather than in the first ``result()``."""
    _compiled()
