"""The primitives: one wait loop and one generic data move, with NCCL's verbs as flags.

Every primitive of a collective is ``spin_wait`` (until data from the previous rank and slot
credit from the next rank are there, or the time budget runs out) followed by ``move``
(the whole block copies/reduces one chunk). A step either happens whole or not at all, so a
preempted collective's context is just its step counter.

Verbs (flag sets) as in NCCL's ``prims_simple.h``:

====================  ==========================================
``SEND``              slot_out = user_in
``RECV_REDUCE_SEND``  slot_out = op(slot_in, user_in)
``RECV_REDUCE_COPY_SEND``  v = post(op(slot_in, user_in)); slot_out = user_out = v
``RECV_COPY_SEND``    slot_out = user_out = slot_in
``RECV``              user_out = slot_in
``COPY``              user_out = post(user_in)  (a one-rank collective)
====================  ==========================================

With ``F_ALL`` (a one-shot all_reduce, kernels/plans.py) a step moves to or from every
other rank at once: ``SEND | F_ALL`` copies user_in to a lane of each peer's slot
(``move_all``), ``RECV_REDUCE_COPY | F_ALL`` reduces every rank's input, in rank order,
into user_out (``reduce_all``), and the step waits on the lanes' tail or head words.

``op`` and ``post`` compute in the element type, except for float16 and bfloat16 (kept as
uint16 bits): those compute in float32 and round back to 16 bits after every combine and
after the division of ``avg``, as NCCL does (``numerics.py``).
"""

import numpy as np
from numba import cuda

from .divide import quotient, remainder
from .memory import (as_array, atomic_cas_gpu, backoff, fence_gpu, fence_sys, lane, load16,
                     load_volatile, now_ns, store16, store_volatile, with_lane)
from .numerics import (bfloat16_to_float32, float16_to_float32, float32_to_bfloat16,
                       float32_to_float16)
from ..protocol.codes import DTYPES, OPS

__all__ = [
    "F_RECV", "F_USER_IN", "F_SEND", "F_USER_OUT", "F_POSTDIV",
    "SEND", "RECV_REDUCE_SEND", "RECV_REDUCE_COPY_SEND", "RECV_COPY_SEND", "RECV", "COPY",
    "F_ALL", "SPIN_PREEMPT", "SPIN_ABORT", "ABORT_LOOK_NS", "take_turn", "abort_seen",
    "fence", "ready_now", "first_unready", "spin_wait", "move", "move_all",
]

F_RECV = 1
F_USER_IN = 2
F_SEND = 4
F_USER_OUT = 8
F_POSTDIV = 16
F_ALL = 32          # to or from every other rank (one-shot all_reduce)

SEND = F_USER_IN | F_SEND
RECV_REDUCE_SEND = F_RECV | F_USER_IN | F_SEND
RECV_REDUCE_COPY_SEND = F_RECV | F_USER_IN | F_SEND | F_USER_OUT | F_POSTDIV
RECV_COPY_SEND = F_RECV | F_SEND | F_USER_OUT
RECV = F_RECV | F_USER_OUT
COPY = F_USER_IN | F_USER_OUT | F_POSTDIV

SPIN_PREEMPT = -1
SPIN_ABORT = -2
ABORT_CHECK_MASK = 1023   # look at the abort word every 1024 spins
ABORT_LOOK_NS = 100_000   # one block of a rank reads the host's abort word this often

OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG = (OPS[k] for k in ("sum", "prod", "max", "min", "avg"))


@cuda.jit(device=True)
def fence(local):
    """The fence between a step's data and its flags: GPU scope when every peer is on this
    GPU (``local``), system scope otherwise."""
    if local:
        fence_gpu()
    else:
        fence_sys()


@cuda.jit(device=True)
def first_unready(tail_addr, need_tail, head_addr, need_head, lanes):
    """The first of ``lanes`` lanes whose ``*tail >= need_tail`` or ``*head >= need_head``
    does not hold yet (lane i's words are 8 * i bytes on; a need <= 0 is met), or -1.
    Volatile loads and no fence (``spin_wait`` adds the fence)."""
    for i in range(lanes):
        if need_tail > 0:
            if load_volatile(tail_addr + 8 * i) < need_tail:
                return i
        if need_head > 0:
            if load_volatile(head_addr + 8 * i) < need_head:
                return i
    return -1


@cuda.jit(device=True)
def ready_now(tail_addr, need_tail, head_addr, need_head, lanes):
    """One look: every lane's data and credit are there (``first_unready``)."""
    return first_unready(tail_addr, need_tail, head_addr, need_head, lanes) < 0


@cuda.jit(device=True)
def take_turn(due_at, slack_ns, hold_ns):
    """Whether this block takes a turn that its rank's blocks share: the time in the device
    word ``due_at`` is ``slack_ns`` past, and this block's compare-and-swap moved it
    ``hold_ns`` ahead before a sibling's did. Reads of host memory queue behind one another
    (layout.py), so a rank's blocks take turns at the host words they all watch."""
    t = now_ns()
    due = load_volatile(due_at)
    if t < due + slack_ns:
        return False
    return atomic_cas_gpu(due_at, due, t + hold_ns) == due


@cuda.jit(device=True)
def abort_seen(abort_host, abort_seen_at):
    """Whether the host has set its abort word ``abort_host`` (mapped host memory), as the
    rank's blocks share it in device memory: ``abort_seen_at`` holds 1 once one of them saw
    it set, and the word after it when a block may next read the host's word. Host reads
    queue behind one another (layout.py), so a rank makes one every
    ABORT_LOOK_NS, whichever block wins the turn, instead of one per block."""
    if load_volatile(abort_seen_at) != 0:
        return True
    if not take_turn(abort_seen_at + 8, 0, ABORT_LOOK_NS):
        return False
    if load_volatile(abort_host) == 0:
        return False
    store_volatile(abort_seen_at, 1)
    return True


@cuda.jit(device=True)
def spin_wait(tail_addr, need_tail, head_addr, need_head, lanes, budget_ns, abort_host,
              abort_seen_at, local):
    """The one wait loop. Waits until ``*tail_addr >= need_tail`` and
    ``*head_addr >= need_head`` (a need <= 0 is already met) in each of ``lanes`` lanes,
    polling with volatile loads; once all are met, a fence makes it an acquire (the peer
    wrote its data, then a fence, then the flag). A step that needs nothing (a copy, or a
    send with a free slot not yet used) takes neither the fence nor the clock.

    Returns the nanoseconds waited (>= 0) when ready, SPIN_PREEMPT when the budget
    ``budget_ns`` ran out, SPIN_ABORT when the host set the abort word (``abort_seen``).
    """
    if need_tail <= 0 and need_head <= 0:
        return 0
    start = now_ns()
    spins = 0
    while True:
        ready = ready_now(tail_addr, need_tail, head_addr, need_head, lanes)
        waited = now_ns() - start
        if ready:
            fence(local)
            return waited
        if waited >= budget_ns:
            return SPIN_PREEMPT
        spins += 1
        if (spins & ABORT_CHECK_MASK) == 0:
            if abort_seen(abort_host, abort_seen_at):
                return SPIN_ABORT
        backoff()


@cuda.jit(device=True)
def _combine(op, a, b):
    if op == OP_PROD:
        return a * b
    if op == OP_MAX:
        return max(a, b)
    if op == OP_MIN:
        return min(a, b)
    return a + b


@cuda.jit(device=True)
def _same(v):
    return v


VECTOR_BYTES = 16
UNROLL = 4        # 16-byte vectors a thread loads before it stores any: NCCL's simple protocol


@cuda.jit(device=True)
def _vector_span(n, itemsize, flags, slot_in, user_in, slot_out, user_out):
    """(head, vectors): the block moves elements ``[head, head + vectors * 16 // itemsize)``
    as 16-byte vectors, the ``head`` before and the tail after them one at a time.

    A vector needs every address the step touches 16-byte aligned at it, so they must all
    sit at the same offset from a 16-byte boundary (slots are at 16-byte multiples; a user
    buffer may be anywhere); the head is what it takes to reach the boundary. Otherwise no
    vectors."""
    r = -1
    same = True
    if flags & F_RECV:
        r = slot_in & 15
    if flags & F_USER_IN:
        if r >= 0 and (user_in & 15) != r:
            same = False
        r = user_in & 15
    if flags & F_SEND:
        if r >= 0 and (slot_out & 15) != r:
            same = False
        r = slot_out & 15
    if flags & F_USER_OUT:
        if r >= 0 and (user_out & 15) != r:
            same = False
        r = user_out & 15
    if not same or r < 0 or remainder(r, itemsize) != 0:
        return 0, 0
    head = min(n, quotient((VECTOR_BYTES - r) & 15, itemsize))
    return head, quotient(n - head, quotient(VECTOR_BYTES, itemsize))


@cuda.jit(device=True)
def _store_vector(flags, slot_out, user_out, at, v):
    """Stores the 16 bytes ``v`` (low, high) at byte ``at`` of the step's destinations."""
    if flags & F_SEND:
        store16(slot_out + at, v[0], v[1])
    if flags & F_USER_OUT:
        store16(user_out + at, v[0], v[1])


@cuda.jit(device=True)
def _copy_vectors(nvec, flags, start, slot_in, user_in, slot_out, user_out):
    """A step that reduces nothing: the block copies ``nvec`` 16-byte vectors from byte
    ``start`` of its source (the slot it received, else the user's input) to its
    destinations, whatever the element type.

    A thread loads UNROLL vectors, a block apart, before it stores any, as NCCL's simple
    protocol does: more loads in flight (memory-level parallelism). The last vectors, fewer
    than UNROLL a thread, go one at a time."""
    src = slot_in if flags & F_RECV else user_in
    i = cuda.threadIdx.x
    stride = cuda.blockDim.x
    step = stride * VECTOR_BYTES
    while i + (UNROLL - 1) * stride < nvec:
        at = start + i * VECTOR_BYTES
        v0 = load16(src + at)
        v1 = load16(src + at + step)
        v2 = load16(src + at + 2 * step)
        v3 = load16(src + at + 3 * step)
        _store_vector(flags, slot_out, user_out, at, v0)
        _store_vector(flags, slot_out, user_out, at + step, v1)
        _store_vector(flags, slot_out, user_out, at + 2 * step, v2)
        _store_vector(flags, slot_out, user_out, at + 3 * step, v3)
        i += UNROLL * stride
    while i < nvec:
        at = start + i * VECTOR_BYTES
        _store_vector(flags, slot_out, user_out, at, load16(src + at))
        i += stride


def _make_mover(storage, compute=None, widen=_same, narrow=_same):
    """The generic primitive for elements stored as ``storage`` (a factory, not a template),
    and the one-shot all_reduce's reduction of every rank's input (``reduce_all``).

    The 16-bit floats compute in a wider type (``compute``, float32): every combine widens
    both operands, applies the op and ``narrow``s the result back (round to nearest even)
    before it is sent on or stored, as NCCL reduces half and bfloat16 (``numerics.py``).
    Copies move the stored elements untouched.

    Where the step's addresses allow it (``_vector_span``), the block moves 16-byte vectors
    (``16 // itemsize`` elements each, UNROLL per thread at a time); the elements before and
    after them, and every element of a step whose addresses do not allow it, one at a time.
    Both compute each element with ``element``, so they give the same bits."""
    compute = storage if compute is None else compute
    integer = np.issubdtype(compute, np.integer)
    itemsize = np.dtype(storage).itemsize
    lanes = VECTOR_BYTES // itemsize
    per_word = lanes // 2

    @cuda.jit(device=True)
    def _post(v, divisor):
        if integer:         # C's division, as NCCL's: truncated toward zero
            q = v // divisor
            if q * divisor != v and v < 0:
                q += 1
            return q
        return v / compute(divisor)

    @cuda.jit(device=True)
    def element(flags, op, divisor, s, m):
        """One output element from the received element ``s`` and the user's ``m``."""
        if flags & F_RECV:
            v = s
            if flags & F_USER_IN:
                v = narrow(_combine(op, widen(v), widen(m)))
        else:
            v = m
        if flags & F_POSTDIV:
            v = narrow(_post(widen(v), divisor))
        return v

    @cuda.jit(device=True)
    def operands(flags, slot_in, user_in, at):
        """The received and the user's 16 bytes at byte ``at`` (zeros where the step reads
        none): (slot low, slot high, user low, user high)."""
        slo, shi = 0, 0
        mlo, mhi = 0, 0
        if flags & F_RECV:
            slo, shi = load16(slot_in + at)
        if flags & F_USER_IN:
            mlo, mhi = load16(user_in + at)
        return slo, shi, mlo, mhi

    @cuda.jit(device=True)
    def vector(flags, op, divisor, x):
        """The 16 output bytes (low, high) from ``operands`` ``x``, element by element."""
        slo, shi, mlo, mhi = x
        lo, hi = 0, 0
        for k in range(per_word):     # the two 8-byte words side by side
            lo = with_lane(lo, storage, k, element(flags, op, divisor, lane(slo, storage, k),
                                                  lane(mlo, storage, k)))
            hi = with_lane(hi, storage, k, element(flags, op, divisor, lane(shi, storage, k),
                                                  lane(mhi, storage, k)))
        return lo, hi

    @cuda.jit(device=True)
    def reduce_vectors(nvec, flags, op, divisor, start, slot_in, user_in, slot_out, user_out):
        """As ``_copy_vectors`` (UNROLL vectors' loads in flight, then their computes and
        stores; the rest one at a time), through ``element``."""
        i = cuda.threadIdx.x
        stride = cuda.blockDim.x
        step = stride * VECTOR_BYTES
        while i + (UNROLL - 1) * stride < nvec:
            at = start + i * VECTOR_BYTES
            x0 = operands(flags, slot_in, user_in, at)
            x1 = operands(flags, slot_in, user_in, at + step)
            x2 = operands(flags, slot_in, user_in, at + 2 * step)
            x3 = operands(flags, slot_in, user_in, at + 3 * step)
            _store_vector(flags, slot_out, user_out, at, vector(flags, op, divisor, x0))
            _store_vector(flags, slot_out, user_out, at + step, vector(flags, op, divisor, x1))
            _store_vector(flags, slot_out, user_out, at + 2 * step,
                          vector(flags, op, divisor, x2))
            _store_vector(flags, slot_out, user_out, at + 3 * step,
                          vector(flags, op, divisor, x3))
            i += UNROLL * stride
        while i < nvec:
            at = start + i * VECTOR_BYTES
            _store_vector(flags, slot_out, user_out, at,
                          vector(flags, op, divisor, operands(flags, slot_in, user_in, at)))
            i += stride

    @cuda.jit(device=True)
    def mover(n, flags, op, divisor, slot_in, user_in, slot_out, user_out):
        head, nvec = _vector_span(n, itemsize, flags, slot_in, user_in, slot_out, user_out)
        if nvec > 0:
            start = head * itemsize
            if (flags & F_RECV and flags & F_USER_IN) or flags & F_POSTDIV:
                reduce_vectors(nvec, flags, op, divisor, start, slot_in, user_in, slot_out,
                               user_out)
            else:
                _copy_vectors(nvec, flags, start, slot_in, user_in, slot_out, user_out)
        # the head and the tail, one element at a time
        src = as_array(slot_in, n if flags & F_RECV else 0, storage)
        mine = as_array(user_in, n if flags & F_USER_IN else 0, storage)
        dst = as_array(slot_out, n if flags & F_SEND else 0, storage)
        out = as_array(user_out, n if flags & F_USER_OUT else 0, storage)
        skip = nvec * lanes
        j = cuda.threadIdx.x
        stride = cuda.blockDim.x
        while j < n - skip:
            i = j if j < head else j + skip
            s = src[i] if flags & F_RECV else storage(0)
            m = mine[i] if flags & F_USER_IN else storage(0)
            v = element(flags, op, divisor, s, m)
            if flags & F_SEND:
                dst[i] = v
            if flags & F_USER_OUT:
                out[i] = v
            j += stride

    @cuda.jit(device=True)
    def reduce_all(n, flags, op, divisor, srcs, nsrc, user_out):
        """user_out = post(srcs[0] op srcs[1] op ... op srcs[nsrc - 1]), combined in that
        order and rounded as ``element`` rounds. A thread reads an element from every source
        before it writes that element, so the output may be a source (in place)."""
        out = as_array(user_out, n, storage)
        j = cuda.threadIdx.x
        stride = cuda.blockDim.x
        while j < n:
            acc = as_array(srcs[0], n, storage)[j]
            for s in range(1, nsrc):
                acc = narrow(_combine(op, widen(acc), widen(as_array(srcs[s], n, storage)[j])))
            if flags & F_POSTDIV:
                acc = narrow(_post(widen(acc), divisor))
            out[j] = acc
            j += stride

    return mover, reduce_all


DT_F32, DT_F64, DT_I32, DT_I64, DT_I8, DT_U8, DT_F16, DT_BF16 = (
    DTYPES[k] for k in ("float32", "float64", "int32", "int64", "int8", "uint8", "float16",
                     "bfloat16"))


def _by_dtype(f32, f64, i32, i64, i8, u8, f16, bf16):
    """A device function ``(dtype, *args)`` that calls the function given for the dtype
    code with ``args``: the daemon's one switch on the element type (a factory, not a
    template)."""
    @cuda.jit(device=True)
    def by_dtype(dtype, *args):
        if dtype == DT_F32:
            f32(*args)
        elif dtype == DT_F64:
            f64(*args)
        elif dtype == DT_I32:
            i32(*args)
        elif dtype == DT_I64:
            i64(*args)
        elif dtype == DT_I8:
            i8(*args)
        elif dtype == DT_U8:
            u8(*args)
        elif dtype == DT_F16:
            f16(*args)
        elif dtype == DT_BF16:
            bf16(*args)

    return by_dtype


_MOVERS = [_make_mover(np.float32), _make_mover(np.float64), _make_mover(np.int32),
           _make_mover(np.int64), _make_mover(np.int8), _make_mover(np.uint8),
           _make_mover(np.float16, np.float32, float16_to_float32, float32_to_float16),
           _make_mover(np.uint16, np.float32, bfloat16_to_float32, float32_to_bfloat16)]

# Run by every thread of the block: one primitive's data movement for ``n`` elements,
# move(dtype, n, flags, op, divisor, slot_in, user_in, slot_out, user_out).
move = _by_dtype(*(mover for mover, _ in _MOVERS))
# reduce_all(dtype, n, flags, op, divisor, srcs, nsrc, user_out): see ``_make_mover``.
_reduce_all = _by_dtype(*(reduce_all for _, reduce_all in _MOVERS))


@cuda.jit(device=True)
def move_all(dtype, n, flags, op, divisor, user_in, addrs, nranks, user_out):
    """Run by every thread of the block: one ``F_ALL`` step for ``n`` elements. A send
    copies user_in to each of the ``nranks - 1`` addresses ``addrs`` holds (the peers'
    lanes); a receive reduces the ``nranks`` inputs at ``addrs`` (in rank order, the own
    input among them) into user_out."""
    if flags & F_SEND:
        for k in range(nranks - 1):
            move(dtype, n, F_USER_IN | F_SEND, op, 1, 0, user_in, addrs[k], 0)
    else:
        _reduce_all(dtype, n, flags, op, divisor, addrs, nranks, user_out)
