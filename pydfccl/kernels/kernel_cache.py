"""Where compiled daemons are kept on disk, under a key that outlives the process and the
install.

Numba's own CUDA cache finds its files by the source file's path and accepts them only if
the source's modification time is unchanged, so reinstalling the same version (a new
virtualenv, a fresh checkout, a wheel unpacked again) compiled every daemon again. Here the
directory is pydfccl's (``cache_place.cache_dir``), the file names and the freshness stamp are the
daemon's key (a hash of the sources' content, see ``compiler.fingerprint``), and the index
key is Numba's with its closure-pickle part replaced by the same key. ``build-kernels``
writes entries through this class too, so that what it writes is what the runtime looks up.
"""

from __future__ import annotations

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

    def _index_key(self, sig, codegen):
        """Numba's key (signature, CUDA version and compute capability, numba-cuda's
        version) with the hash of the closure's pickled cells, which differ in every
        process, replaced by the daemon's key."""
        key = super()._index_key(sig, codegen)
        return key[:3] + (self._stable_key,) + key[4:]
