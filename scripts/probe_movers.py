"""Probe (GPU only): the movers' element-at-a-time path against their 16-byte vector path,
and both against a device-to-device copy measured in the same run.

Each row runs ``primitives.move`` for one dtype and verb, a slot-sized chunk (128 KiB) at a
time as the daemon moves it: once on 16-byte aligned buffers (vectors) and once with the user
buffers one element off (every element alone, the path every step took before vectors); with
the daemon's 4 blocks (over 16 MiB), and with a block per chunk over ``--mib`` MiB (the whole
GPU).
Bandwidth counts the bytes read plus written; ``copy%`` is the share of a back-to-back
copy's (``pydfccl.cli.hbm.copy_bandwidth``),
counted the same way. ``same`` says whether both paths wrote the same bits.
Run: python3 scripts/probe_movers.py [--mib 256] [--threads 512] [--dtypes float32,int8]
For whole collectives: python3 -m pydfccl bench --nranks 2 -b 268435456 -e 268435456
"""
import argparse

import ml_dtypes
import numpy as np
from numba import cuda

from pydfccl import platform
from pydfccl.protocol.codes import DTYPES, OPS, storage_dtype
from pydfccl.cli.hbm import copy_bandwidth
from pydfccl.kernels import primitives as P

CHUNK = 128 * 1024        # the GPU world's slot_bytes
DAEMON_BLOCKS, DAEMON_CHUNKS = 4, 128
VERBS = [("SEND", P.SEND, 1, 1), ("RECV_COPY_SEND", P.RECV_COPY_SEND, 1, 2),
         ("RECV_REDUCE_SEND", P.RECV_REDUCE_SEND, 2, 1),
         ("RECV_REDUCE_COPY_SEND", P.RECV_REDUCE_COPY_SEND, 2, 2)]   # (name, flags, reads, writes)


@cuda.jit
def run(dtype, chunk, nchunks, itemsize, flags, op, slot_in, user_in, slot_out, user_out):
    c = cuda.blockIdx.x
    while c < nchunks:
        at = c * chunk * itemsize
        P.move(dtype, chunk, flags, op, 1, slot_in + at, user_in + at, slot_out + at,
               user_out + at)
        c += cuda.gridDim.x


def timed(fn, reps):
    fn()
    start, stop = cuda.event(), cuda.event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / reps


def addr(a, offset=0):
    return platform.address_of(a) + offset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--threads", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,bfloat16,float16,int8,float64")
    args = ap.parse_args()
    nbytes = args.mib << 20
    rng = np.random.default_rng(0)
    # back-to-back asynchronous copies timed with events (pydfccl.cli.hbm): synchronous ones
    # count the host's time between them (2.24 against 4.19 TB/s, H200 2026-11-30)
    copy_bw = copy_bandwidth(nbytes)
    print(f"cuMemcpyDtoDAsync {args.mib} MiB: {copy_bw:.0f} GB/s (read + write)")
    print(f"{'dtype':9} {'verb':22} {'blocks':>6} {'elements GB/s':>14} {'vectors GB/s':>13} "
          f"{'copy%':>6} {'speedup':>7} same")
    for dtype in args.dtypes.split(","):
        store = storage_dtype(dtype)
        size = store.itemsize
        n = nbytes // size
        values = rng.uniform(-4, 4, n + 16)
        host = (values.astype(ml_dtypes.bfloat16).view(np.uint16) if dtype == "bfloat16"
                else values.astype(store))
        bufs = {k: cuda.device_array(n + 16, store) for k in ("slot_out", "user_out")}
        bufs["slot_in"] = cuda.to_device(host)
        mine = {off: cuda.to_device(np.roll(host, off // size)) for off in (0, size)}
        chunk = CHUNK // size
        for verb, flags, reads, writes in VERBS:
            for blocks, nchunks in ((DAEMON_BLOCKS, DAEMON_CHUNKS), (nbytes // CHUNK,) * 2):
                times, outs = [], []
                for off in (size, 0):          # user buffers one element off, then aligned
                    def go():
                        run[blocks, args.threads](DTYPES[dtype], chunk, nchunks, size, flags,
                                                  OPS["sum"], addr(bufs["slot_in"]),
                                                  addr(mine[off], off),
                                                  addr(bufs["slot_out"]),
                                                  addr(bufs["user_out"], off))
                    times.append(timed(go, args.reps))
                    m = nchunks * chunk
                    outs.append([bufs["slot_out"].copy_to_host()[:m],
                                 bufs["user_out"].copy_to_host()[off // size:][:m]])
                written = [i for i, f in enumerate((P.F_SEND, P.F_USER_OUT)) if flags & f]
                same = all(outs[0][i].tobytes() == outs[1][i].tobytes() for i in written)
                bw = [(reads + writes) * nchunks * CHUNK / t / 1e9 for t in times]
                print(f"{dtype:9} {verb:22} {blocks:6d} {bw[0]:14.0f} {bw[1]:13.0f} "
                      f"{100 * bw[1] / copy_bw:5.0f}% {times[0] / times[1]:6.2f}x {same}")

if __name__ == "__main__":
    main()
