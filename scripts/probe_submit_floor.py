"""Probe (no GPU needed): the least a Python ``run()`` can cost, with no pydfccl in it.

A submission from Python must at least store an SQ entry's words into mapped memory and
hand back something to wait on. This times a function that does only that: five stores
into a numpy structured array standing for the SQ (one view a field, made once) and a
two-slot future object; no argument checks, no buffer bookkeeping, no lock. One thread
driving N ranks pays it N times a collective, on top of ``probe_floor.py``'s floor (whose
own submission is a single store a rank).
Run: python3 scripts/probe_submit_floor.py [--runs 200000]
"""
import argparse
import timeit

import numpy as np

SQ_FIELDS = ("coll", "send", "recv", "prio", "seq")


class Future:
    __slots__ = ("done", "result")

    def __init__(self):
        self.done, self.result = False, None


def make_submit(capacity: int = 1024):
    """A minimal submit: the SQ entry's five words, the sequence word last, and a future."""
    sq = np.zeros(capacity, dtype=[(name, "i8") for name in SQ_FIELDS])
    coll_w, send_w, recv_w, prio_w, seq_w = (sq[name] for name in SQ_FIELDS)
    count = [0]

    def submit(coll, send, recv):
        k = count[0]
        slot = k % capacity
        coll_w[slot] = coll
        send_w[slot] = send
        recv_w[slot] = recv
        prio_w[slot] = 0
        seq_w[slot] = k + 1
        count[0] = k + 1
        return Future()

    return submit, sq


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200_000)
    args = ap.parse_args()
    submit, sq = make_submit()
    best = min(timeit.repeat(lambda: submit(1, 2, 3), number=args.runs, repeat=5))
    assert sq["seq"].max() == 5 * args.runs   # every call stored its entry
    per_call = best / args.runs * 1e6
    print(f"least Python submit (5 stores and a future): {per_call:.2f} us a call "
          f"(best of 5 rounds of {args.runs})")
    for nranks in (2, 8):
        print(f"  one thread, {nranks} ranks: {nranks * per_call:.2f} us a collective")


if __name__ == "__main__":
    main()
