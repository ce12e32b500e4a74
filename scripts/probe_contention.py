"""Probe (GPU only): does what idle daemon blocks do slow one busy thread on another SM?

With 32 daemon blocks a rank, the one block working on a small all-reduce runs its own code
6 times slower than with 4 (docs/benchmarks.md, "Before noon"), and neither the pool's size
nor the idle blocks' host stores nor their polling of three device words explained it
(2026-11-30, 13:08). This kernel times one thread (block 0's) doing an operation N times
while thread 0 of every other block loops on a load of its own, as an idle daemon block
does: it prints ns per operation for each pair, and the measuring SM's clock (cycles of
%clock64 over ns of %globaltimer), for 0, 32 and 128 loaded blocks.

Operations timed: the daemon's clock (%globaltimer), a volatile load of a word that the
others also load (hot), of a word nobody else loads (private), a volatile store to a
private word followed by a GPU fence, and the same load and store (with a system fence) on
mapped host memory. Loads run by the others: nothing (they sleep), %globaltimer, a volatile
load of the hot word, an idle daemon's pass (the clock, three hot words, a 32 ns sleep),
a volatile load of a host word and a volatile store to one. Run: python3
scripts/probe_contention.py
"""
import numpy as np
from numba import cuda, types
from numba.cuda.extending import intrinsic
from llvmlite import ir

from pydfccl.kernels import memory as M

_i64 = ir.IntType(64)


@intrinsic
def clock64(typingctx):
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_i64, [])
        return builder.call(ir.InlineAsm(fnty, "mov.u64 $0, %clock64;", "=l", side_effect=True),
                            [])

    return types.int64(), codegen


TIMED = ("clock", "hot load", "private load", "store+fence", "host load", "host st+fence")
LOADS = ("sleep", "clock", "hot load", "idle pass", "host load", "host store")


@cuda.jit
def probe(timed, load, n, addr, host, out):
    """At ``addr`` (device memory), each on its own 128-byte line: the hot word, the private
    word, the count of loaded blocks started, the stop flag, two more hot words; at ``host``
    (mapped host memory) the others' word, then the timed thread's."""
    if cuda.threadIdx.x != 0:
        return
    hot, private, started, stop = addr, addr + 128, addr + 256, addr + 384
    if cuda.blockIdx.x == 0:
        while M.load_volatile(started) < cuda.gridDim.x - 1:
            cuda.nanosleep(100)
        g0 = M.now_ns()
        c0 = clock64()
        s = 0
        for i in range(n):
            if timed == 0:
                s += M.now_ns()
            elif timed == 1:
                s += M.load_volatile(hot)
            elif timed == 2:
                s += M.load_volatile(private)
            elif timed == 3:
                M.store_volatile(private, i)
                M.fence_gpu()
            elif timed == 4:
                s += M.load_volatile(host + 128)
            else:
                M.store_volatile(host + 128, i)
                M.fence_sys()
        c1 = clock64()
        g1 = M.now_ns()
        out[0] = g1 - g0
        out[1] = c1 - c0
        out[2] = s
        M.store_volatile(stop, 1)
        return
    M.atomic_add_gpu(started, 1)
    i = 0
    while True:
        if load == 0:
            cuda.nanosleep(1000)
        elif load == 1:
            M.now_ns()
        elif load == 2:
            M.load_volatile(hot)
        elif load == 3:
            M.now_ns()
            M.load_volatile(hot)
            M.load_volatile(hot + 512)
            M.load_volatile(hot + 640)
            cuda.nanosleep(32)
        elif load == 4:
            M.load_volatile(host)
        else:
            M.store_volatile(host, i)
        i += 1
        if i % 64 == 0 and M.load_volatile(stop) != 0:
            break


def main(n=20_000):
    words = cuda.to_device(np.zeros(128, np.int64))
    addr = np.int64(words.__cuda_array_interface__["data"][0])
    host_words = cuda.mapped_array(64, np.int64)
    host = np.int64(host_words.__cuda_array_interface__["data"][0])
    out = cuda.to_device(np.zeros(4, np.int64))
    probe[2, 32](0, 0, 10, addr, host, out)      # compile
    cuda.synchronize()
    print(f"{'timed op':>14} {'others run':>11} " + " ".join(
        f"{f'{b} others':>16}" for b in (0, 32, 128)))
    for t, tname in enumerate(TIMED):
        for ld, lname in enumerate(LOADS):
            cells = []
            for others in (0, 32, 128):
                words.copy_to_device(np.zeros(128, np.int64))
                probe[1 + others, 32](t, ld, n, addr, host, out)
                cuda.synchronize()
                ns, cycles = out.copy_to_host()[:2]
                cells.append(f"{ns / n:7.1f} ns {cycles / ns:4.2f} GHz")
            print(f"{tname:>14} {lname:>11} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
