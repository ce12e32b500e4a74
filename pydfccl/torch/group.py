"""``TorchGroup``: torch tensors through one pydfccl communicator.

pydfccl runs collectives registered with a fixed signature (kind, count, dtype, op, root);
torch calls come with any shape at any time. A group registers each new signature when it
first meets it (``Communicator.prepare`` after ``start``). Every rank of a torch process
group issues the group's collectives in the same order (torch requires it), so the k-th new
signature gets the same id on every rank; a transfer gets an id from its (sender,
receiver) pair and its ordinal on that pair, which its two ranks count alike. A rank that
differs is reported by the communicator's cross-rank check, naming the field and ranks.
"""

from __future__ import annotations

import collections
import threading

import torch

from .convert import as_buffer, check_tensor, dtype_name
from ..errors import AbortedError, DeadlockError, PydfcclError, RankFailedError
from .errors import DfcclError, as_torch_error
from .work import Work, completed_work

__all__ = ["TorchGroup", "P2P_BASE"]

P2P_BASE = 1 << 40       # transfer ids: P2P_BASE + (sender * size + receiver) << 20 + ordinal
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")

class TorchGroup:
    """Collectives on torch tensors over ``comm``, a started Communicator that this group
    owns (it registers collectives on it as calls come). ``timeout`` (seconds, None: none)
    bounds every wait on the group's Works unless the wait gives its own."""

    def __init__(self, comm, timeout: float | None = None):
        self.comm = comm
        self.timeout = timeout
        self.rank, self.size = comm.rank, comm.nranks
        self._ids: dict[tuple, int] = {}
        self._next_id = 0
        self._pair_ordinals = collections.Counter()
        self._lock = threading.Lock()
        self._alive: dict = {}       # tensors (and views) that must live until completion
        self._failure: BaseException | None = None   # the first failed run, raised from then on

    def coll_id(self, kind: str, count: int, dtype: str, op: str = "sum", root: int = 0,
                peer: int | None = None) -> int:
        """The id of this signature, registering it on first sight."""
        if kind not in _REDUCING:
            op = "sum"
        key = (kind, count, dtype, op, root, peer)
        with self._lock:
            if key in self._ids:
                return self._ids[key]
            if peer is None:
                cid = self._next_id
                self._next_id += 1
            else:
                pair = (self.rank, peer) if kind == "send" else (peer, self.rank)
                cid = (P2P_BASE + ((pair[0] * self.size + pair[1]) << 20)
                       + self._pair_ordinals[pair])
                self._pair_ordinals[pair] += 1
            self.comm.prepare(cid, kind, count, dtype, op=op, root=root, peer=peer)
            self._ids[key] = cid
            return cid

    def check_rank(self, rank, what: str, not_self: bool = False) -> int:
        if not isinstance(rank, int) or not 0 <= rank < self.size or (not_self and
                                                                       rank == self.rank):
            extra = f", not this rank ({self.rank})" if not_self else ""
            raise ValueError(f"pydfccl.torch: {what} {rank!r} is not a rank of this group "
                             f"(0..{self.size - 1}{extra})")
        return rank

    def run(self, kind: str, send: torch.Tensor, recv: torch.Tensor | None, *, count: int,
            op: str = "sum", root: int = 0, peer: int | None = None, async_op: bool = False,
            counts: tuple | None = None):
        """Run one collective; ``recv`` None means in place; ``counts``: an all_to_allv's
        (send counts, recv counts). Returns a Work if ``async_op``, else None once the
        result is there (waited for on the host, on CUDA too: see
        ``host/stream_gate.py``)."""
        if self._failure is not None:
            raise DfcclError(f"dfccl rank {self.rank}: an earlier collective of this group "
                             f"failed ({self._failure}); the group cannot be used any more",
                             self.rank, self._failure)
        check_tensor(send, f"{kind}'s tensor")
        if recv is not None:
            check_tensor(recv, f"{kind}'s output tensor", device=send.device)
            if recv.dtype != send.dtype:
                raise TypeError(f"pydfccl.torch: {kind}: output dtype {recv.dtype} differs from "
                                f"input dtype {send.dtype}")
        out = send if recv is None else recv
        if send.numel() == 0 and out.numel() == 0 and counts is None:
            # nothing to move: a no-op, as in NCCL (an all_to_allv's peers may still send
            # empty blocks this rank must take)
            work = completed_work([out], self.rank, kind)
            return work if async_op else None
        try:
            return self._run(kind, send, recv, out, count, op, root, peer, async_op, counts)
        except (AbortedError, DeadlockError, RankFailedError) as exc:
            self._failed(exc)     # the communicator had failed: it runs nothing more
            raise as_torch_error(exc, self.rank, kind) from exc
        except PydfcclError as exc:          # the communicator refused
            raise as_torch_error(exc, self.rank, kind) from exc

    def _run(self, kind, send, recv, out, count, op, root, peer, async_op, counts):
        cid = self.coll_id(kind, count, dtype_name(send.dtype), op, root, peer)
        send_buf = as_buffer(send)
        recv_buf = None if recv is None else as_buffer(recv)
        split = {} if counts is None else dict(send_counts=counts[0], recv_counts=counts[1])
        if send.is_cuda:     # the run starts once the current stream has made its inputs
            with torch.cuda.device(send.device):
                future = self.comm.run(cid, send_buf, recv_buf,
                                       stream=torch.cuda.current_stream(send.device), **split)
        else:
            future = self.comm.run(cid, send_buf, recv_buf, **split)
        work = Work(future, [out], timeout=self.timeout, rank=self.rank, what=kind,
                    on_group_timeout=self._timed_out, on_failure=self._failed)
        # The tensors must outlive the run (the daemon only has their addresses, and on
        # CUDA the caching allocator would hand their memory out again).
        key = id(work)
        with self._lock:
            self._alive[key] = (work, send, recv, send_buf, recv_buf)
        work._future.add_done_callback(lambda f: self._release(key, f))
        if async_op:
            return work
        work.wait()
        return None

    def _release(self, key, future) -> None:
        """A run ended. A failure sticks to the group, as an asynchronous error does to an
        NCCL communicator: on CUDA the call that issued the run has returned already, so
        the next call is where the error can surface."""
        with self._lock:
            self._alive.pop(key, None)
        if future.exception() is not None:
            self._failed(future.exception())

    def _failed(self, error) -> None:
        """The group fails with ``error`` (the first stays): its later calls raise it."""
        with self._lock:
            if self._failure is None:
                self._failure = error

    def _timed_out(self, error) -> None:
        """A wait outlasted the group's timeout: the group fails, as torch's backends do."""
        self._failed(error)

    def synchronize_device(self) -> None:
        """A device-wide synchronize (the simulator's stand-in for
        ``torch.cuda.synchronize()``)."""
        if torch.cuda.is_available() and not _simulated():
            torch.cuda.synchronize()
        else:
            self.comm.synchronize_device()

    def close(self) -> None:
        self.comm.close()


def _simulated() -> bool:
    from ..platform import backend
    return backend.kernels_on_host
