"""Memory access for the daemon: the one place that differs between a GPU and the simulator.

Everything the daemon touches is reached through a 64-bit address (an ``int64``): its own
device memory, a peer rank's memory, mapped host memory and the user's buffers. On the GPU
the functions below are Numba intrinsics emitting PTX with the memory-ordering semantics
the protocol needs (``ld.acquire.sys`` that LLVM cannot hoist out of a spin loop,
``st.release.sys``, ``atom.add``); under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)
they are plain-Python twins that read and write the same addresses with ctypes, which is
how one simulated rank process sees another's shared-memory buffers without copies.

The data movers also reach memory 16 bytes at a time (``load16``/``store16``: one
``ld.global.v2.u64``/``st.global.v2.u64`` per thread, plain, never ``.nc``: slots are written
by peer daemons) and take the elements of its two 8-byte words apart in registers
(``lane``, ``with_lane``); the twins check the 16-byte alignment the GPU requires.

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
    "clock_cycles",
    "as_array",
    "load_acquire",
    "load_volatile",
    "store_release",
    "store_volatile",
    "load16",
    "store16",
    "lane",
    "with_lane",
    "atomic_add",
    "atomic_add_gpu",
    "atomic_max_gpu",
    "atomic_cas_gpu",
    "fence_sys",
    "fence_gpu",
    "backoff",
    "now_ns",
    "sm_id",
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

    def _aligned16(addr):
        addr = int(addr)
        if addr & 15:
            raise ValueError(f"16-byte access at {addr:#x}, which is not 16-byte aligned")
        return addr

    def load16(addr):
        """The 16 bytes at ``addr`` (16-byte aligned) as two int64 words (low, high)."""
        addr = _aligned16(addr)
        return (ctypes.c_int64.from_address(addr).value,
                ctypes.c_int64.from_address(addr + 8).value)

    def store16(addr, lo, hi):
        """Writes the 16 bytes (``lo``, ``hi``) at ``addr`` (16-byte aligned)."""
        addr = _aligned16(addr)
        ctypes.c_int64.from_address(addr).value = int(lo)
        ctypes.c_int64.from_address(addr + 8).value = int(hi)

    def lane(word, dtype, k):
        """Element ``k`` of the int64 ``word`` read as ``8 // itemsize`` elements of
        ``dtype`` (element 0 in the low bits), as a numpy scalar of ``dtype``, as an array
        element is."""
        return np.array([word], np.int64).view(dtype)[k]

    def with_lane(word, dtype, k, value):
        """``word`` with element ``k`` of ``dtype`` replaced by ``value``, cast to ``dtype``
        as an array store casts it."""
        words = np.array([word], np.int64)
        words.view(dtype)[k] = value
        return int(words[0])

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

    def atomic_max_gpu(addr, value):
        """Raises the int64 at ``addr`` to ``value`` if lower; returns the old value."""
        with _atomic_lock:
            cell = ctypes.c_int64.from_address(int(addr))
            old = cell.value
            cell.value = max(old, int(value))
            return old

    def atomic_cas_gpu(addr, expected, value):
        """Writes ``value`` to the int64 at ``addr`` if it holds ``expected``; returns the
        old value (equal to ``expected`` when the write happened)."""
        with _atomic_lock:
            cell = ctypes.c_int64.from_address(int(addr))
            old = cell.value
            if old == int(expected):
                cell.value = int(value)
            return old

    def fence_sys():
        pass

    fence_gpu = fence_sys

    def now_ns():
        return time.perf_counter_ns()

    def clock_cycles():
        """The simulator has no SM clock: nanoseconds stand in for cycles."""
        return time.perf_counter_ns()

    def sm_id():
        """The simulator has no multiprocessors: every block reports 0."""
        return 0

    _spin = threading.local()
    BACKOFF_FIRST_NS = 20_000     # the first sleep of a wait
    BACKOFF_MOST_NS = 500_000     # the longest
    BACKOFF_NEW_WAIT_NS = 200_000  # the thread's CPU since its last sleep: a new wait

    def backoff():
        # A simulated spin costs a Python loop; sleeping leaves the CPU to the other ranks.
        # A wait that goes on sleeps longer each time (doubling, up to BACKOFF_MOST_NS): a
        # rank waiting seconds for a late peer would otherwise spend a quarter of a core.
        # Work done since the last sleep (the thread's CPU time, whatever the load) starts
        # a new wait at BACKOFF_FIRST_NS.
        cpu = time.thread_time_ns()
        pause = getattr(_spin, "pause", BACKOFF_FIRST_NS)
        if cpu - getattr(_spin, "cpu", 0) > BACKOFF_NEW_WAIT_NS:
            pause = BACKOFF_FIRST_NS
        time.sleep(pause * 1e-9)
        _spin.pause = min(2 * pause, BACKOFF_MOST_NS)
        _spin.cpu = time.thread_time_ns()

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

    _v2i64 = ir.VectorType(_i64, 2)

    def _i32(i):
        return ir.Constant(ir.IntType(32), i)

    def _global16(builder, address):
        """``address`` as a pointer to 16 bytes in the global state space, which holds this
        GPU's memory, peers' memory and mapped host memory alike (a generic address of
        global memory is its global address)."""
        return builder.inttoptr(address, _v2i64.as_pointer(1))

    def _element_type(dtype):
        return dtype.instance_type if isinstance(dtype, types.NumberClass) else dtype.dtype

    @intrinsic
    def load16(typingctx, addr):
        """The 16 bytes at ``addr`` (16-byte aligned) as two int64 words (low, high): one
        plain ``ld.global.v2.u64``. Plain, not ``.nc``: the data may have been written by
        another agent; the wait before the move fenced, and a barrier ordered this thread."""
        sig = types.UniTuple(types.int64, 2)(addr)

        def codegen(context, builder, sig, args):
            address = context.cast(builder, args[0], sig.args[0], types.int64)
            value = builder.load(_global16(builder, address), align=16)
            words = [builder.extract_element(value, _i32(i)) for i in range(2)]
            return context.make_tuple(builder, sig.return_type, words)

        return sig, codegen

    @intrinsic
    def store16(typingctx, addr, lo, hi):
        """Writes the 16 bytes (``lo``, ``hi``) at ``addr`` (16-byte aligned): one plain
        ``st.global.v2.u64``."""
        sig = types.none(addr, lo, hi)

        def codegen(context, builder, sig, args):
            address = context.cast(builder, args[0], sig.args[0], types.int64)
            value = ir.Constant(_v2i64, ir.Undefined)
            for i in range(2):
                word = context.cast(builder, args[1 + i], sig.args[1 + i], types.int64)
                value = builder.insert_element(value, word, _i32(i))
            builder.store(value, _global16(builder, address), align=16)
            return context.get_dummy_value()

        return sig, codegen

    # An element of a word is taken out and put back with shifts: registers only, even
    # where ``k`` is not a constant (a vector element at a variable index goes through
    # local memory).
    def _lane_bits(context, elem):
        return 8 * context.get_abi_sizeof(context.get_data_type(elem))

    @intrinsic
    def lane(typingctx, word, dtype, k):
        """Element ``k`` of the int64 ``word`` read as ``8 // itemsize`` elements of
        ``dtype`` (element 0 in the low bits)."""
        elem = _element_type(dtype)
        sig = elem(word, dtype, k)

        def codegen(context, builder, sig, args):
            bits = _lane_bits(context, elem)
            value = context.cast(builder, args[0], sig.args[0], types.int64)
            shift = builder.mul(context.cast(builder, args[2], sig.args[2], types.int64),
                                ir.Constant(_i64, bits))
            small = builder.trunc(builder.lshr(value, shift), ir.IntType(bits))
            return builder.bitcast(small, context.get_data_type(elem))

        return sig, codegen

    @intrinsic
    def with_lane(typingctx, word, dtype, k, value):
        """``word`` with element ``k`` of ``dtype`` replaced by ``value``, cast to ``dtype``
        as an array store casts it."""
        elem = _element_type(dtype)
        sig = types.int64(word, dtype, k, value)

        def codegen(context, builder, sig, args):
            bits = _lane_bits(context, elem)
            old = context.cast(builder, args[0], sig.args[0], types.int64)
            shift = builder.mul(context.cast(builder, args[2], sig.args[2], types.int64),
                                ir.Constant(_i64, bits))
            item = context.cast(builder, args[3], sig.args[3], elem)
            item = builder.zext(builder.bitcast(item, ir.IntType(bits)), _i64) \
                if bits < 64 else builder.bitcast(item, _i64)
            mask = builder.shl(ir.Constant(_i64, (1 << bits) - 1 if bits < 64 else -1), shift)
            kept = builder.and_(old, builder.not_(mask))
            return builder.or_(kept, builder.shl(item, shift))

        return sig, codegen

    # Generic addressing, so one instruction serves device, peer and mapped host memory.
    load_acquire = _load("ld.acquire.sys.b64 $0, [$1];")
    load_volatile = _load("ld.volatile.b64 $0, [$1];")
    store_release = _store("st.release.sys.b64 [$0], $1;")
    store_volatile = _store("st.volatile.b64 [$0], $1;")

    def _atomic(ptx):
        @intrinsic
        def atomic(typingctx, addr, value):
            def codegen(context, builder, sig, args):
                value = context.cast(builder, args[1], sig.args[1], types.int64)
                return _asm(builder, ptx, "=l,l,l,~{memory}", [args[0], value], _i64)

            return types.int64(addr, value), codegen

        return atomic

    # Add to (or raise to a maximum) the int64 at an address and return the old value: at
    # system scope, or at GPU scope for words that only this GPU's threads touch.
    atomic_add = _atomic("atom.add.acq_rel.sys.u64 $0, [$1], $2;")
    atomic_add_gpu = _atomic("atom.add.acq_rel.gpu.u64 $0, [$1], $2;")
    atomic_max_gpu = _atomic("atom.max.acq_rel.gpu.s64 $0, [$1], $2;")

    @intrinsic
    def atomic_cas_gpu(typingctx, addr, expected, value):
        """Compare-and-swap of the int64 at an address, at GPU scope; returns the old value."""
        def codegen(context, builder, sig, args):
            exp = context.cast(builder, args[1], sig.args[1], types.int64)
            value = context.cast(builder, args[2], sig.args[2], types.int64)
            return _asm(builder, "atom.cas.acq_rel.gpu.b64 $0, [$1], $2, $3;",
                        "=l,l,l,l,~{memory}", [args[0], exp, value], _i64)

        return types.int64(addr, expected, value), codegen

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
        64 ns on an H200)."""
        def codegen(context, builder, sig, args):
            return _asm(builder, "mov.u64 $0, %globaltimer;", "=l,~{memory}", [], _i64)

        return types.int64(), codegen

    @intrinsic
    def clock_cycles(typingctx):
        """This SM's cycle counter ``%clock64``: finer than ``now_ns``, for the step
        profile (``step_profile.py``); cycles of one SM, not comparable across SMs."""
        def codegen(context, builder, sig, args):
            return _asm(builder, "mov.u64 $0, %clock64;", "=l,~{memory}", [], _i64)

        return types.int64(), codegen

    @intrinsic
    def sm_id(typingctx):
        """The multiprocessor this thread runs on (``%smid``): which daemon blocks share an
        SM, for the launch event."""
        def codegen(context, builder, sig, args):
            sm = _asm(builder, "mov.u32 $0, %smid;", "=r", [], ir.IntType(32))
            return builder.zext(sm, _i64)

        return types.int64(), codegen

    @cuda.jit(device=True)
    def backoff():
        cuda.nanosleep(32)
