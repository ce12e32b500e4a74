"""A kernel launched from a cubin through the driver, without Numba's dispatcher.

For the daemons the package ships (``kernels.shipped``): the cubin is loaded once per
device (``cuModuleLoadData``; numba-cuda's table of loaded modules is not needed, nor safe
for two threads loading at once) and launched with ``cuLaunchKernel`` on the caller's
stream. Its arguments are the daemon's: int64 scalars.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from .driver import driver_result

__all__ = ["CubinKernel"]


class CubinKernel:
    """The kernel ``entry`` of the cubin ``image``, taking ``nargs`` int64 arguments."""

    def __init__(self, image: bytes, entry: str, nargs: int, name: str = ""):
        self.image, self.entry, self.nargs, self.name = image, entry, nargs, name
        self._functions: dict = {}      # device -> (module, function)
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the cubin into the current context (once per device); raises RuntimeError
        where the driver refuses it (another architecture, a driver too old)."""
        self._function()

    def _function(self):
        from cuda.bindings import driver

        device = int(driver_result(driver.cuCtxGetDevice(), "cuCtxGetDevice"))
        with self._lock:
            if device not in self._functions:
                module = driver_result(driver.cuModuleLoadData(self.image),
                                       "cuModuleLoadData")
                function = driver_result(
                    driver.cuModuleGetFunction(module, self.entry.encode()),
                    "cuModuleGetFunction")
                self._functions[device] = (module, function)
            return self._functions[device][1]

    def configure(self, nblocks: int, nthreads: int, stream_handle: int):
        """A callable that queues a launch of ``nblocks`` blocks of ``nthreads`` on the
        stream ``stream_handle`` with the arguments it is called with."""
        from cuda.bindings import driver

        function = self._function()
        stream = driver.CUstream(int(stream_handle))
        types = (ctypes.c_int64,) * self.nargs

        def launch(*args):
            if len(args) != self.nargs:
                raise TypeError(f"{self.name or self.entry} takes {self.nargs} arguments, "
                                f"got {len(args)}")
            values = tuple(int(np.int64(a)) for a in args)
            driver_result(driver.cuLaunchKernel(function, nblocks, 1, 1, nthreads, 1, 1, 0,
                                                stream, (values, types), 0),
                          "cuLaunchKernel")
        return launch
