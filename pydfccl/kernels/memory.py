"""Memory access for the daemon: the one place that differs between a GPU and the simulator.

Everything the daemon touches is reached through a 64-bit address (an ``int64``): its own
device memory, a peer rank's memory, mapped host memory and the user's buffers. On the GPU
the functions below are Numba intrinsics emitting PTX with the memory-ordering semantics
the protocol needs (``ld.acquire.sys`` that LLVM cannot hoist out of a spin loop,
``st.release.sys``, ``atom.add``); under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)
they are plain-Python twins that read and write the same addresses with ctypes, which is
how one simulated rank process sees another's shared-memory buffers without copies.

The rest of ``pydfccl.kernels`` imports only these names and never asks which one it got.
"""

import ctypes
import threading
import time

import numpy as np
from numba import cuda, types
from numba.cuda import config

__all__ = [
    "SIMULATOR",
    "as_array",
    "load_acquire",
    "load_volatile",
    "store_release",
    "store_volatile",
    "atomic_add",
    "atomic_add_gpu",
    "fence_sys",
    "fence_gpu",
    "backoff",
    "now_ns",
]

SIMULATOR = bool(config.ENABLE_CUDASIM)

if SIMULATOR:
    _atomic_lock = threading.Lock()

    def as_array(addr, n, dtype):
        """A 1-D array of ``n`` elements of ``dtype`` at ``addr`` (no copy)."""
        dt = np.dtype(dtype)
        if n <= 0:
            return np.empty(0, dt)
        buf = (ctypes.c_char * (int(n) * dt.itemsize)).from_address(int(addr))
        return np.frombuffer(buf, dtype=dt)

    def load_acquire(addr):
        return ctypes.c_int64.from_address(int(addr)).value

    load_volatile = load_acquire

    def store_release(addr, value):
        ctypes.c_int64.from_address(int(addr)).value = int(value)

    store_volatile = store_release

    def atomic_add(addr, value):
        """Adds ``value`` to the int64 at ``addr`` and returns the old value."""
        with _atomic_lock:
            cell = ctypes.c_int64.from_address(int(addr))
            old = cell.value
            cell.value = old + int(value)
            return old

    atomic_add_gpu = atomic_add

    def fence_sys():
        pass

    fence_gpu = fence_sys

    def now_ns():
        return time.perf_counter_ns()

    def backoff():
        # A simulated spin costs a Python loop; sleeping leaves the CPU to the other ranks.
        time.sleep(20e-6)

else:
    from llvmlite import ir
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.arrayobj import make_array, populate_array

    _i64 = ir.IntType(64)

    def _asm(builder, text, constraints, args, ret=None):
        fnty = ir.FunctionType(ret or ir.VoidType(), [a.type for a in args])
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)

    @intrinsic
    def as_array(typingctx, addr, n, dtype):
        """A 1-D C-contiguous array of ``n`` elements of ``dtype`` at ``addr`` (no copy)."""
        elem = dtype.instance_type if isinstance(dtype, types.NumberClass) else dtype.dtype
        arrty = types.Array(elem, 1, "C")
        sig = arrty(addr, n, dtype)

        def codegen(context, builder, sig, args):
            address, count, _ = args
            ary = make_array(arrty)(context, builder)
            data_t = context.get_data_type(elem)
            ptr = builder.inttoptr(address, data_t.as_pointer())
            itemsize = context.get_constant(types.intp, context.get_abi_sizeof(data_t))
            count = context.cast(builder, count, sig.args[1], types.intp)
            populate_array(ary, data=ptr, shape=cgutils.pack_array(builder, [count]),
                           strides=cgutils.pack_array(builder, [itemsize]),
                           itemsize=itemsize, meminfo=None)
            return ary._getvalue()

        return sig, codegen

    def _load(ptx):
        @intrinsic
        def load(typingctx, addr):
            def codegen(context, builder, sig, args):
                return _asm(builder, ptx, "=l,l,~{memory}", [args[0]], _i64)

            return types.int64(addr), codegen

        return load

    def _store(ptx):
        @intrinsic
        def store(typingctx, addr, value):
            def codegen(context, builder, sig, args):
                value = context.cast(builder, args[1], sig.args[1], types.int64)
                _asm(builder, ptx, "l,l,~{memory}", [args[0], value])
                return context.get_dummy_value()

            return types.none(addr, value), codegen

        return store

    # Generic addressing, so one instruction serves device, peer and mapped host memory.
    load_acquire = _load("ld.acquire.sys.b64 $0, [$1];")
    load_volatile = _load("ld.volatile.b64 $0, [$1];")
    store_release = _store("st.release.sys.b64 [$0], $1;")
    store_volatile = _store("st.volatile.b64 [$0], $1;")

    def _atomic_add(ptx):
        @intrinsic
        def atomic(typingctx, addr, value):
            def codegen(context, builder, sig, args):
                value = context.cast(builder, args[1], sig.args[1], types.int64)
                return _asm(builder, ptx, "=l,l,l,~{memory}", [args[0], value], _i64)

            return types.int64(addr, value), codegen

        return atomic

    # Add to the int64 at an address and return the old value: at system scope, or at GPU
    # scope for counters that only this GPU's threads touch.
    atomic_add = _atomic_add("atom.add.acq_rel.sys.u64 $0, [$1], $2;")
    atomic_add_gpu = _atomic_add("atom.add.acq_rel.gpu.u64 $0, [$1], $2;")

    @intrinsic
    def fence_sys(typingctx):
        def codegen(context, builder, sig, args):
            _asm(builder, "fence.acq_rel.sys;", "~{memory}", [])
            return context.get_dummy_value()

        return types.none(), codegen

    @intrinsic
    def fence_gpu(typingctx):
        """Orders memory for observers on this GPU only: much cheaper than ``fence_sys``
        when every peer is a daemon on the same device."""
        def codegen(context, builder, sig, args):
            _asm(builder, "fence.acq_rel.gpu;", "~{memory}", [])
            return context.get_dummy_value()

        return types.none(), codegen

    @intrinsic
    def now_ns(typingctx):
        """The GPU's nanosecond clock ``%globaltimer``, re-read on every call (it ticks every
        64 ns on the H200: scripts/probe_timer.py, 2026-11-29)."""
        def codegen(context, builder, sig, args):
            return _asm(builder, "mov.u64 $0, %globaltimer;", "=l,~{memory}", [], _i64)

        return types.int64(), codegen

    @cuda.jit(device=True)
    def backoff():
        cuda.nanosleep(32)
