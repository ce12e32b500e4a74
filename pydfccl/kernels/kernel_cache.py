"""Where compiled daemons are kept on disk, under a key that outlives the process and the
install.

Numba's own CUDA cache finds its files by the source file's path and accepts them only if
the source's modification time is unchanged, so reinstalling the same version (a new
virtualenv, a fresh checkout, a wheel unpacked again) compiled every daemon again. Here the
directory is pydfccl's (``cache_place.cache_dir``), the file names and the freshness stamp are the
daemon's key (a hash of the sources' content, see ``compiler.fingerprint``), and the index
key is Numba's with its closure-pickle part replaced by the same key. ``build-kernels``
writes entries through this class too, so that what it writes is what the runtime looks up.

A load skips the two costs of Numba's own that a cached daemon does not need: refreshing
the CUDA target's context (every typing and lowering registry, fp16 and bf16 included;
rebuilding a cached kernel reads none, and a compile refreshes it itself) and pickling the
closure's cells for a hash the key then drops. On an idle CPU machine of the CI kind the
load took 0.35-0.38 s with them and takes 0.02-0.03 s without.
"""

from __future__ import annotations

import numba_cuda
from numba.cuda import utils
from numba.cuda.core.caching import _CacheLocator
from numba.cuda.dispatcher import CUDACache, CUDACacheImpl

from .cache_place import cache_dir

__all__ = ["cache_dir", "KeyedCache"]


class _KeyedLocator(_CacheLocator):
    """Files in ``cache_dir()`` named and stamped by the daemon's key, not by the path or the
    modification time of its source file."""

    def __init__(self, key: str):
        self._key = key

    def get_cache_path(self):
        return str(cache_dir())

    def get_source_stamp(self):
        return self._key

    def get_disambiguator(self):
        return self._key

    @classmethod
    def from_function(cls, py_func, py_file):
        return cls(py_func._pydfccl_cache_key)


class _KeyedImpl(CUDACacheImpl):
    _locator_classes = [_KeyedLocator]


class KeyedCache(CUDACache):
    """Numba's CUDA cache for a daemon, found in ``cache_dir()`` by ``key``."""

    _impl_class = _KeyedImpl

    def __init__(self, py_func, key: str):
        py_func._pydfccl_cache_key = key
        self._stable_key = key
        super().__init__(py_func)

    def load_overload(self, sig, target_context):
        """Numba's load without its ``target_context.refresh()``."""
        with utils.numba_target_override(), self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
        return None     # the guard swallowed a spurious I/O error: compile instead

    def _index_key(self, sig, codegen):
        """Numba's key (signature, CUDA version and compute capability, numba-cuda's
        version, the hashes of the code and of the closure's pickled cells, and the launch
        configuration where the kernel depends on it) with the hashes, which differ in every
        process, replaced by the daemon's key."""
        key = (sig, codegen.magic_tuple(), numba_cuda.__version__, self._stable_key)
        if self._launch_config_key is not None:
            key += (("launch_config", self._launch_config_key),)
        return key
