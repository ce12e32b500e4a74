"""The movers' 16-byte vector path against numpy, and collectives on misaligned buffers.

A mover moves the 16-byte vectors its step's addresses allow and the rest (a head up to the
first 16-byte boundary, the tail, or everything when the addresses sit at different offsets
from one) an element at a time; both must give exactly what the element-at-a-time mover
gave. The first test runs ``move`` itself in the simulator, on a block of three threads, on
every dtype, verb, op, count (around the vector widths: 1, 3, 7, 17, ..., and, where the
offsets let vectors move, around a round of ``UNROLL`` vectors a thread) and user-buffer
offset, checks every output bit for bit against numpy and checks that nothing around the
outputs is touched (the simulator's ``load16``/``store16`` refuse an address that is not
16-byte aligned). The others run whole collectives on user buffers that start one element
past an allocation. The PTX side (16-byte loads and stores in the daemon) is in
test_kernels_compile.py.
"""

import numpy as np
import pytest

import pydfccl
import shared_workers
from pydfccl import platform
from pydfccl.protocol.codes import DTYPES
from pydfccl.protocol.reference import buffer_elems

SCRIPT = r"""
import json
import sys
import ml_dtypes
import numpy as np
from numba import cuda
from pydfccl.protocol.codes import DTYPES, OPS, storage_dtype
from pydfccl.kernels import primitives as P
from pydfccl.kernels.memory import SIMULATOR

assert SIMULATOR
VERBS = dict(SEND=P.SEND, RECV_REDUCE_SEND=P.RECV_REDUCE_SEND,
             RECV_REDUCE_COPY_SEND=P.RECV_REDUCE_COPY_SEND, RECV_COPY_SEND=P.RECV_COPY_SEND,
             RECV=P.RECV, COPY=P.COPY)
REDUCING = ("RECV_REDUCE_SEND", "RECV_REDUCE_COPY_SEND", "COPY")
COUNTS = (1, 3, 7, 8, 17, 40)
THREADS = 3                  # the block; a round: UNROLL vectors a thread, a block apart
ROUND = P.UNROLL * THREADS
# and per dtype, counts of vectors (plus one element) around a round and past two: the movers
# take UNROLL at a time while a thread's UNROLL are all there, then one at a time
VECTORS = (ROUND - 1, ROUND, ROUND + 1, 2 * ROUND + THREADS - 1)
# (user_in, user_out) offsets in elements from a 16-byte boundary; "same" = in place
OFFSETS = ((0, 0), (1, 1), (0, 3), (3, 0), (0, "same"), (1, "same"))
DIVISOR = 3                  # avg over three ranks: integer truncation and float rounding
GUARD = 16                   # elements after each region that must stay untouched
POISON = 0x5A


def vectors_can_move(flags, off_in, off_out, size):
    # whether every address the step touches sits at one offset from a 16-byte boundary
    # (slots at 0): the long counts exist for the vector regimes, and where vectors cannot
    # move the short counts already run the element path over many rounds of the block
    at = dict(slot_in=0, slot_out=0, user_in=off_in * size % 16,
              user_out=(off_in if off_out == "same" else off_out) * size % 16)
    used = (("slot_in", P.F_RECV), ("user_in", P.F_USER_IN), ("slot_out", P.F_SEND),
            ("user_out", P.F_USER_OUT))
    return len({at[name] for name, flag in used if flags & flag}) == 1


@cuda.jit
def run_cases(table, ncases):
    for c in range(ncases):
        r = c * 9
        P.move(table[r], table[r + 1], table[r + 2], table[r + 3], table[r + 4], table[r + 5],
               table[r + 6], table[r + 7], table[r + 8])
        cuda.syncthreads()


def values(rng, dtype, n):
    if dtype == "bfloat16":
        return rng.uniform(-4, 4, n).astype(ml_dtypes.bfloat16).view(np.uint16)
    if np.issubdtype(np.dtype(dtype), np.integer):
        low = 0 if np.dtype(dtype).kind == "u" else -5
        return rng.integers(low, 6, n).astype(dtype)
    return rng.uniform(-4, 4, n).astype(dtype)


def expected(dtype, flags, op, s, m):
    # one element at a time, as the movers compute: in the element type, and for float16 and
    # bfloat16 in float32 rounded back after each operation
    store = storage_dtype(dtype)
    if dtype == "bfloat16":
        widen = lambda x: x.view(ml_dtypes.bfloat16).astype(np.float32)
        narrow = lambda x: x.astype(ml_dtypes.bfloat16).view(np.uint16)
    elif dtype == "float16":
        widen, narrow = (lambda x: x.astype(np.float32)), (lambda x: x.astype(np.float16))
    elif np.issubdtype(store, np.integer):
        widen, narrow = (lambda x: x.astype(np.int64)), (lambda x: x.astype(store))
    else:
        widen, narrow = (lambda x: x), (lambda x: x)
    combine = {OPS["sum"]: np.add, OPS["avg"]: np.add, OPS["prod"]: np.multiply,
               OPS["max"]: np.maximum, OPS["min"]: np.minimum}[op]
    if flags & P.F_RECV:
        v = narrow(combine(widen(s), widen(m))) if flags & P.F_USER_IN else s
    else:
        v = m
    if flags & P.F_POSTDIV:
        w = widen(v)
        if np.issubdtype(w.dtype, np.integer):     # C's division: toward zero
            q = np.abs(w) // DIVISOR * np.sign(w)
        else:
            q = w / w.dtype.type(DIVISOR)
        v = narrow(q)
    return v


class Arena:
    # Memory for the cases' regions, each starting at a 16-byte boundary.
    def __init__(self, nbytes):
        self.raw = np.zeros(nbytes + 16, np.uint8)
        self.base = (-self.raw.ctypes.data) % 16
        self.used = 0

    def region(self, nbytes):
        start = self.base + self.used
        self.used += (nbytes + 15) // 16 * 16
        assert self.used <= self.raw.size - 16
        return self.raw[start:start + nbytes]


cases, checks = [], []
rng = np.random.default_rng(0)
arena = Arena(64 << 20)
vector_cases = 0
coverage = {}                # dtype -> which of the vector paths' regimes its cases ran
for dtype, code in DTYPES.items():
    store = storage_dtype(dtype)
    size = store.itemsize
    lanes = 16 // size
    counts = COUNTS + tuple(v * lanes + 1 for v in VECTORS)
    for verb, flags in VERBS.items():
        for op_name in (OPS if verb in REDUCING else ("sum",)):
            op = OPS[op_name]
            f = flags if op_name == "avg" else flags & ~P.F_POSTDIV   # as the daemon does
            for n in counts:
                for off_in, off_out in OFFSETS:
                    if off_out == "same" and not (f & P.F_USER_IN and f & P.F_USER_OUT):
                        continue
                    if n not in COUNTS and not vectors_can_move(f, off_in, off_out, size):
                        continue
                    span = (n + 3 + GUARD) * size
                    bufs = {}
                    for name, off in (("slot_in", 0), ("slot_out", 0), ("user_in", off_in),
                                      ("user_out", off_out)):
                        if name == "user_out" and off_out == "same":
                            bufs[name] = bufs["user_in"]
                            continue
                        raw = arena.region(span)
                        raw[:] = POISON
                        whole = raw.view(store)
                        bufs[name] = (whole, off)
                    s_whole, s_off = bufs["slot_in"]
                    u_whole, u_off = bufs["user_in"]
                    s = values(rng, dtype, n)
                    m = values(rng, dtype, n)
                    s_whole[s_off:s_off + n] = s
                    u_whole[u_off:u_off + n] = m
                    addr = {k: w.ctypes.data + o * size for k, (w, o) in bufs.items()}
                    head, nvec = P._vector_span.py_func(n, size, f, addr["slot_in"],
                                                        addr["user_in"], addr["slot_out"],
                                                        addr["user_out"])
                    vector_cases += nvec > 0
                    regimes = coverage.setdefault(dtype, set())
                    if 0 < nvec <= ROUND - THREADS:
                        regimes.add("one at a time")       # no thread has UNROLL
                    elif ROUND - THREADS < nvec < ROUND:
                        regimes.add("some threads UNROLL")
                    elif nvec == ROUND:
                        regimes.add("one round")
                    elif nvec % ROUND and head and n - head - nvec * lanes:
                        regimes.add("head, rounds, rest, tail")
                    cases.append([code, n, f, op, DIVISOR if op_name == "avg" else 1,
                                  addr["slot_in"], addr["user_in"], addr["slot_out"],
                                  addr["user_out"]])
                    want = expected(dtype, f, op, s, m)
                    checks.append((dtype, verb, op_name, n, off_in, off_out, f, bufs, want))

table = np.array(cases, np.int64).ravel()
# The simulator's block threads wait at each syncthreads for its polling main thread to hand
# over the GIL (every 5 ms by default); handing over sooner changes no result, only the time.
sys.setswitchinterval(0.00005)
run_cases[1, THREADS](table, len(cases))

failures = []
for dtype, verb, op_name, n, off_in, off_out, f, bufs, want in checks:
    outs = []
    if f & P.F_SEND:
        outs.append(("slot_out", want))
    if f & P.F_USER_OUT:
        outs.append(("user_out", want))
    for name, w in outs:
        whole, off = bufs[name]
        got = whole[off:off + n]
        around = np.concatenate([whole[:off], whole[off + n:]]).view(np.uint8)
        what = None
        if got.tobytes() != np.asarray(w, whole.dtype).tobytes():
            what = f"{name}: got {got.tolist()}, expected {np.asarray(w).tolist()}"
        elif (around != POISON).any():
            what = f"{name}: bytes around the output were written"
        if what:
            failures.append(f"{dtype} {verb} {op_name} n={n} offsets={off_in},{off_out}: {what}")
print(json.dumps(dict(cases=len(checks), vector_cases=int(vector_cases),
                      coverage={k: sorted(v) for k, v in coverage.items()},
                      failures=failures[:20], nfailures=len(failures))))
"""


def test_movers_match_numpy_on_every_dtype_verb_op_count_and_offset(simulated_report):
    report = simulated_report(SCRIPT)
    assert report["nfailures"] == 0, report["failures"]
    # vectors on the aligned (and equally misaligned) cases, elements alone on the rest
    assert 0 < report["vector_cases"] < report["cases"], report
    # every dtype's vectors went one at a time, UNROLL at a time, both within one round, and
    # rounds then the rest between a head and a tail
    regimes = ["head, rounds, rest, tail", "one at a time", "one round", "some threads UNROLL"]
    assert report["coverage"] == {d: regimes for d in DTYPES}, report


def offset_cases(comm, cases, offset):
    """``shared_workers.collective_cases`` on user buffers that start ``offset`` elements into
    their allocation (a slice, as a numpy or CuPy user may pass)."""
    for i, (kind, count, dtype, op, root) in enumerate(cases):
        comm.prepare(i, kind, count=count, dtype=dtype, op=op, root=root)
    comm.start()
    futures, keep = {}, []
    for i, (kind, count, dtype, op, root) in enumerate(cases):
        send_elems, recv_elems = buffer_elems(kind, count, comm.nranks)
        send = comm.empty(send_elems + offset, dtype)
        recv = comm.empty(recv_elems + offset, dtype)
        platform.copy_in(send[offset:], shared_workers.rank_inputs(comm.rank, send_elems, dtype, i))
        platform.copy_in(recv[offset:], np.full(recv_elems, 99, dtype))
        keep.append((send, recv))
        futures[i] = comm.run(i, send[offset:], recv[offset:])
    return [platform.to_numpy(futures[i].result(timeout=120), cases[i][2]).tolist()
            for i in range(len(cases))]


MISALIGNED_CASES = [  # (kind, count, dtype, op, root): counts around the vector widths
    ("all_reduce", 17, "float32", "sum", 0),
    ("all_reduce", 67, "int8", "avg", 0),
    ("all_reduce", 7, "float16", "sum", 0),
    ("all_reduce", 33, "bfloat16", "max", 0),
    ("all_reduce", 35, "int64", "avg", 0),
    ("reduce_scatter", 3, "float64", "prod", 0),
    ("reduce_scatter", 41, "uint8", "min", 0),
    ("all_gather", 17, "int32", "sum", 0),
    ("broadcast", 131, "int8", "sum", 1),
    ("reduce", 70, "float32", "avg", 1),
]


@pytest.mark.parametrize("nranks, offset", [(2, 1), (3, 3), (1, 1)])
def test_collectives_on_misaligned_buffers(nranks, offset):
    """Offsets the slots do not share (elements one at a time), and on one rank, where a
    step copies the user's input to its output, the same offset on both (a head, then
    vectors)."""
    cases = [(k, c, d, o, r % nranks) for k, c, d, o, r in MISALIGNED_CASES]
    per_rank = pydfccl.launch(offset_cases, nranks, args=(cases, offset), timeout=300)
    for rank, outputs in enumerate(per_rank):
        for i, (kind, count, dtype, op, root) in enumerate(cases):
            want = shared_workers.expected_collective(kind, nranks, rank, count, dtype, op, root, i)
            if want is None:
                continue
            got = np.array(outputs[i], dtype=dtype)
            assert np.array_equal(got, want), f"rank {rank}: {cases[i]}"
