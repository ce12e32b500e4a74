"""Checking user buffers before their addresses go to the daemon.

The daemon trusts the addresses it is given, so everything that could make it read or write
the wrong memory is refused here, with the problem named.
"""

import sys
import weakref

import numpy as np

from ..platform import backend
from ..protocol.codes import BFLOAT16

__all__ = ["buffer_info", "dtype_accepted", "written", "check_buffer", "check_overlap",
           "BufferChecker", "future_dropped", "dropped_by_user"]


def buffer_info(array) -> tuple:
    """(address, element count, dtype, contiguous, read-only) of a user buffer: a pydfccl
    array, a numpy array under the simulator, or on a GPU anything with
    ``__cuda_array_interface__`` or ``__dlpack__`` (Numba, CuPy, PyTorch, JAX)."""
    if getattr(array, "_pydfccl_array", False):
        array = array.raw
    if backend.device_memory_is_host:
        host = backend.host_array(array)
        if host is None:
            raise TypeError("expected a numpy array, a Numba device array or a pydfccl array "
                            f"(comm.empty) under the simulator, got {type(array).__name__}")
        array = host
        return (int(array.ctypes.data), int(array.size), array.dtype,
                bool(array.flags.c_contiguous), not array.flags.writeable)
    iface = getattr(array, "__cuda_array_interface__", None)
    if iface is None:
        if hasattr(array, "__dlpack__") and not isinstance(array, np.ndarray):
            return _dlpack_info(array)
        raise TypeError(f"expected a CUDA device array (with __cuda_array_interface__ or "
                        f"__dlpack__), got {type(array).__name__}; use comm.empty() or a "
                        "Numba, CuPy, PyTorch or JAX array on the GPU")
    shape = tuple(iface["shape"])
    dtype = np.dtype(iface["typestr"])
    count = int(np.prod(shape)) if shape else 1
    strides = iface.get("strides")
    contiguous = strides is None or tuple(strides) == _c_strides(shape, dtype.itemsize)
    return int(iface["data"][0]), count, dtype, contiguous, bool(iface["data"][1])


def _dlpack_info(array) -> tuple:
    """``buffer_info`` of an array that only speaks DLPack; it must be in GPU memory."""
    from cuda.core.utils import StridedMemoryView

    view = StridedMemoryView.from_dlpack(array, stream_ptr=-1)
    if not view.is_device_accessible:
        raise TypeError(f"{type(array).__name__} is in host memory; pydfccl runs on the GPU: "
                        "pass a GPU array (comm.empty makes one)")
    shape = tuple(view.shape)
    count = int(np.prod(shape)) if shape else 1
    strides = view.strides      # in elements; None: C-contiguous
    contiguous = strides is None or tuple(strides) == _c_strides(shape, 1)
    return int(view.ptr), count, np.dtype(view.dtype), contiguous, bool(view.readonly)


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def dtype_accepted(buffer_dtype, coll_dtype) -> bool:
    """A buffer of ``buffer_dtype`` can hold a collective of ``coll_dtype``: the same dtype,
    or for bfloat16 also uint16 holding the raw bits (GPU arrays report a bfloat16 dtype
    through ``__cuda_array_interface__`` as an anonymous ``<V2``, which says nothing)."""
    coll_dtype = np.dtype(coll_dtype)
    return buffer_dtype == coll_dtype or (coll_dtype == BFLOAT16 and buffer_dtype == np.uint16)


def written(spec, role: str) -> bool:
    """Whether a run of ``spec`` writes its ``role`` buffer: the recv buffer, except for a
    point-to-point send, whose one buffer is only read."""
    return role == "recv" and spec.kind != "send"


def check_buffer(array, spec, role: str, needed: int) -> int:
    """The address of ``array`` if it can serve as ``role`` ("send"/"recv") of ``spec``:
    exactly ``needed`` elements of its dtype, C-contiguous, writable if the run writes it."""
    addr, count, dtype, contiguous, readonly = buffer_info(array)
    where = f"collective {spec.coll_id} ({spec.kind}): {role} buffer"
    if not dtype_accepted(dtype, spec.dtype):
        hint = (" or uint16 (its raw bits)" if np.dtype(spec.dtype) == BFLOAT16 else "")
        raise TypeError(f"{where} has dtype {dtype}, expected {spec.dtype}{hint}")
    if count != needed:
        needs = "the run's counts need" if spec.per_peer_counts else "the prepared count needs"
        raise ValueError(f"{where} has {count} elements, {needs} {needed}"
                         + (f"; pass x[:{needed}] to use part of a larger buffer"
                            if count > needed else ""))
    if not contiguous:
        raise ValueError(f"{where} is not C-contiguous")
    if readonly and written(spec, role):
        raise ValueError(f"{where} is read-only, and the collective writes it")
    if addr == 0 and needed:
        raise ValueError(f"{where} has a null address")
    return addr


def check_overlap(spec, rank: int, send_addr: int, send_elems: int, recv_addr: int,
                  recv_elems: int) -> None:
    """Send and recv buffers are one (in place: the same address and size), NCCL's in-place
    form of an all_gather (send is recv's block of this rank) or of a reduce_scatter (recv
    is send's block of this rank), or share no byte: any other overlap has the run read
    what it already wrote."""
    itemsize = np.dtype(spec.dtype).itemsize
    send_end, recv_end = send_addr + send_elems * itemsize, recv_addr + recv_elems * itemsize
    if not (send_addr < recv_end and recv_addr < send_end) or not send_elems:
        return
    block = rank * spec.count * itemsize
    if spec.kind == "all_gather" and send_addr == recv_addr + block:
        return
    if spec.kind == "reduce_scatter" and recv_addr == send_addr + block:
        return
    if send_addr == recv_addr and send_elems == recv_elems and spec.in_place_ok:
        return
    forms = {"all_gather": f"send = recv[{rank * spec.count}:{(rank + 1) * spec.count}]",
             "reduce_scatter": f"recv = send[{rank * spec.count}:{(rank + 1) * spec.count}]"}
    allowed = (" or the same buffer (in place)" if spec.in_place_ok
               else f" or NCCL's in-place form ({forms[spec.kind]})" if spec.kind in forms
               else "")
    raise ValueError(f"collective {spec.coll_id} ({spec.kind}): the send and recv buffers "
                     f"overlap; pass separate buffers{allowed}")


class BufferChecker:
    """``check_buffer`` that remembers the layouts it accepted for each collective and role.

    Checking a device array from scratch costs several microseconds of Python (dtype and
    stride arithmetic), as much as the collective itself; a layout already accepted (same
    typestr, shape, strides and read-only flag) only needs its address read.
    """

    def __init__(self):
        self._accepted: set = set()
        self._last: dict = {}   # (coll_id, role) -> (weak reference, address,
        #                        elements checked) of a Numba array

    def addresses(self, spec, rank: int, send, recv, send_elems: int,
                  recv_elems: int) -> tuple[int, int]:
        """(send, recv) addresses of a run of ``spec`` on ``rank`` whose buffers must hold
        ``send_elems`` and ``recv_elems`` elements (``recv is send``: in place)."""
        send_addr = self(send, spec, "send", send_elems)
        if recv is not send:
            recv_addr = self(recv, spec, "recv", recv_elems)
            check_overlap(spec, rank, send_addr, send_elems, recv_addr, recv_elems)
            return send_addr, recv_addr
        if written(spec, "recv"):      # the same object: its writability is one check
            self(recv, spec, "recv", recv_elems)
        return send_addr, send_addr

    def __call__(self, array, spec, role: str, needed: int) -> int:
        if getattr(array, "_pydfccl_array", False):
            array = array.raw
        # The same Numba array as last time: its layout and address cannot have changed, and
        # building its __cuda_array_interface__ alone costs microseconds. (Not for other
        # arrays: a torch tensor's ``set_()`` moves the memory under the same object.)
        last = self._last.get((spec.coll_id, role))
        if last is not None and last[0]() is array and last[2] == needed:
            return last[1]
        iface = (None if backend.device_memory_is_host
                 else getattr(array, "__cuda_array_interface__", None))
        if iface is None:
            return check_buffer(array, spec, role, needed)
        data = iface["data"]
        key = (spec.coll_id, role, iface["typestr"], iface["shape"], iface.get("strides"),
               data[1], needed)     # needed: an all_to_allv's runs need sizes of their own
        addr = data[0]
        if key not in self._accepted or not addr:
            addr = check_buffer(array, spec, role, needed)
            self._accepted.add(key)
        if type(array) is backend.numba_device_array:
            self._last[(spec.coll_id, role)] = (weakref.ref(array), addr, needed)
        return addr


def _numba_view(buf) -> bool:
    """Whether ``buf`` is a Numba device array cut from another one. numba-cuda wraps every
    allocation's pointer in an ``OwnedPointer`` whose ``_view`` is the allocation itself;
    slicing makes one whose ``_view`` is a new pointer into it. Plain ``MemoryPointer``s
    (older versions) name their allocation in ``owner``."""
    memory = getattr(buf, "gpu_data", None)
    if memory is None:
        return False
    if "_view" in getattr(memory, "__dict__", {}):
        return memory._view is not memory._mem
    return memory.owner is not memory


def _holders(objs: tuple, i: int) -> int:
    """References to ``objs[i]``, less the ones this call makes itself (its local name and
    getrefcount's argument). ``_CALL_REFS`` is measured below on an object that only a tuple
    holds, rather than written as a constant: how many references a call adds differs
    between Python versions."""
    obj = objs[i]
    return sys.getrefcount(obj) - _CALL_REFS


_CALL_REFS = 0
_CALL_REFS = _holders((object(),), 0) - 1


def _base_holders(buf) -> int:
    """References to the array whose memory a view ``buf`` uses (numpy's and CuPy's
    ``base``), counted as ``_UNHELD_BASE`` is; 0 when ``buf`` owns its memory."""
    base = getattr(buf, "base", None)
    return 0 if base is None else _holders((base,), 0)


_UNHELD_BASE = _base_holders(np.empty(1)[:])   # a base that only its view holds


def future_dropped(holder: tuple, i: int) -> bool:
    """Whether the future ``holder[i]`` is held by nothing but ``holder`` (pydfccl's record
    of a completed run) and no done-callback will see it: then nobody can read the run's
    result, and its buffers, if the user dropped them too, were dropped by mistake."""
    return not holder[i].has_callbacks and _holders(holder, i) <= 1


def dropped_by_user(buffers: tuple) -> list:
    """The roles ("send", "recv", or "in-place" when they are one array) of a completed
    run's buffers that nothing but pydfccl held any more.

    ``buffers`` is the (send, recv) tuple that kept them alive until completion, so it holds
    each once (twice in place) and, once popped from ``_inflight``, nothing else in pydfccl
    does; any further reference is the user's (a name, a list, the array a view was cut
    from). Call it before ``set_result``: the future then holds recv too. A view of a Numba
    device array is never reported: the parent that owns its memory cannot be found.
    """
    in_place = buffers[0] is buffers[1]
    roles = []
    for i in range(1 if in_place else 2):
        if _holders(buffers, i) > (2 if in_place else 1):
            continue                                    # the usual case: the user holds it
        memory = buffers[i].raw if getattr(buffers[i], "_pydfccl_array", False) else buffers[i]
        if _base_holders(memory) > _UNHELD_BASE:
            continue                                    # a view of an array the user holds
        if _numba_view(memory):
            continue                                    # a Numba view: its owner is unknown
        roles.append("in-place" if in_place else ("send", "recv")[i])
    return roles
