"""What every backend shares, and the attributes that say how backends differ.

Library code outside ``pydfccl.platform`` never asks which backend it runs on; it reads the
attribute that names the difference it cares about (``launch_runs_kernel``,
``waiter_spin_seconds``, ...), so that each difference is decided, and explained, once.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import numpy as np
from numba import cuda

from ..protocol.codes import BFLOAT16

__all__ = ["Backend", "deferred_frees", "precise_sleeps"]

_frees_lock = threading.Lock()


@contextlib.contextmanager
def deferred_frees():
    """A context in which Numba queues device frees instead of making them. ``cuMemFree``
    may wait for every kernel on the device, and a kernel that never quits (a daemon under
    the ``nccl`` policy, stuck in a deadlock) would then stall the thread that freed. A
    thread completing futures enters it when a free could happen there (a dropped buffer, a
    done-callback), and a daemon that never quits runs in it: the garbage collector can
    free anywhere, including on the poller, which must always get back to its watchdog.
    Numba's hold is a plain counter shared by all threads, hence the lock."""
    hold = cuda.defer_cleanup()
    with _frees_lock:
        hold.__enter__()
    try:
        yield
    finally:
        with _frees_lock:
            hold.__exit__(None, None, None)


def precise_sleeps() -> None:
    """Make this thread's short sleeps short: Linux adds up to 50 us of timer slack to every
    sleep, which would dominate a collective that takes a few microseconds."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)   # PR_SET_TIMERSLACK, 1 ns
    except (OSError, AttributeError):
        pass


class Backend:
    """The host operations of one kind of device. Subclasses set the attributes below and
    implement the methods that raise ``NotImplementedError`` here."""

    name: str = ""
    # Kernels run on host threads (Numba's simulator): a step costs CPU time, so quick
    # defaults (small worlds and slots) suit it, and there is no GPU for a rank to choose.
    kernels_on_host: bool = False
    # "Device" memory is host memory: user buffers are numpy arrays, and rank processes can
    # share pools through shared-memory segments.
    device_memory_is_host: bool = False
    # A launch runs the kernel to its end on the calling thread instead of queueing it on a
    # stream: the kernel is running from the call on, and has ended when the call returns.
    launch_runs_kernel: bool = False
    # One kernel at a time per process: ranks must be processes, not threads of one.
    one_kernel_per_process: bool = False
    # How long no progress anywhere, with work outstanding, is a deadlock by default.
    watchdog_seconds: float = 20.0
    # How long a thread in ``Future.result()`` watches for its completion itself (spinning
    # without the GIL, a core each) before it leaves that to the poller thread and sleeps;
    # 0: it never spins, and neither does the poller.
    waiter_spin_seconds: float = 0.0
    # The class of Numba's device arrays (None where they are numpy's).
    numba_device_array: type | None = None
    # Where the elements of a pydfccl array (``host.arrays.Array``) live: a
    # ``storage.HostStorage`` or ``storage.NumbaStorage``.
    array_storage = None

    deferred_frees = staticmethod(deferred_frees)
    precise_sleeps = staticmethod(precise_sleeps)

    def shipped_daemon(self, policy, registers: int):
        """The daemon of ``policy`` with ``registers`` a thread as shipped with the package,
        ready to launch, or None: compile it (``kernels.shipped``)."""
        return None

    def policy_params(self, policy) -> np.ndarray:
        """The parameters the daemon reads for ``policy`` on this backend (budgets suit the
        speed of its steps)."""
        return policy.param_array(simulator=self.kernels_on_host)

    # -- user buffers ------------------------------------------------------------------------

    def to_numpy(self, array, dtype=None) -> np.ndarray:
        """A host copy of ``array`` (a numpy array is returned itself, a pydfccl array
        read as ``np.asarray``); with ``dtype``
        bfloat16, a uint16 array of raw bits comes back as bfloat16 values."""
        if isinstance(array, np.ndarray) and not hasattr(array, "copy_to_host"):
            host = array
        elif getattr(array, "_pydfccl_array", False):    # host.arrays.Array: as a user reads
            host = np.asarray(array)
        else:
            dev = (array if hasattr(array, "copy_to_host")
                   else cuda.as_cuda_array(array, sync=False))
            host = self._copy_out(dev)
        if dtype is not None and np.dtype(dtype) == BFLOAT16 and host.dtype == np.uint16:
            return host.view(BFLOAT16)
        return host

    def copy_in(self, dst, values: np.ndarray) -> None:
        """Write host ``values`` into the user buffer ``dst`` (bfloat16 values go into a
        uint16 buffer as their bits)."""
        values = np.ascontiguousarray(values)
        if values.dtype == BFLOAT16 and dst.dtype == np.uint16:
            values = values.view(np.uint16)
        if isinstance(dst, np.ndarray) or getattr(dst, "_pydfccl_array", False):
            dst[...] = values
        else:
            self._copy_to_device(dst, values)

    def _copy_out(self, dev) -> np.ndarray:
        return dev.copy_to_host()

    def host_array(self, array) -> np.ndarray | None:
        """Where device memory is host memory: the numpy array holding a user buffer's
        elements (None: not a buffer of this backend)."""
        return array if isinstance(array, np.ndarray) else None

    def _copy_to_device(self, dst, values: np.ndarray) -> None:
        dst.copy_to_device(values)

    # -- what each backend does its own way --------------------------------------------------

    def open_context(self) -> None:
        """Make this process's device context now rather than at its first use (the
        simulator has none)."""

    def gpu_available(self) -> bool:
        raise NotImplementedError

    def wait_stream(self, stream) -> None:
        if stream is not None:
            stream.synchronize()

    # -- the user's streams (``run(..., stream=)``) -------------------------------------------

    def stream_handle(self, stream) -> int:
        """The raw handle of a user's stream: an int, or any object of the CUDA stream
        protocol (``__cuda_stream__``: Numba, PyTorch, CuPy, cuda.core), an older PyTorch
        stream (``cuda_stream``) or CuPy stream (``ptr``). TypeError names what it got."""
        if isinstance(stream, (int, np.integer)) and not isinstance(stream, (bool, np.bool_)):
            if stream < 0:
                raise ValueError(f"stream must be a stream handle, got {int(stream)}")
            return int(stream)
        protocol = getattr(stream, "__cuda_stream__", None)
        if protocol is not None:     # a method; an attribute in early cuda.core versions
            _version, handle = protocol() if callable(protocol) else protocol
            return int(handle)
        for name in ("cuda_stream", "ptr"):
            handle = getattr(stream, name, None)
            if isinstance(handle, int) and not isinstance(handle, bool):
                return handle
        raise TypeError(f"stream must be a CUDA stream (an object with __cuda_stream__, such "
                        f"as a Numba, PyTorch or CuPy stream) or a raw handle (int), got "
                        f"{type(stream).__name__}")

    def stream_write_ops(self):
        """What ``host.stream_gate`` needs of the driver (``mapped_words``, ``write``), or
        None where kernels run on the host and a stream has always reached its end."""
        raise NotImplementedError

    def __repr__(self):
        return f"<pydfccl platform backend {self.name!r}>"
