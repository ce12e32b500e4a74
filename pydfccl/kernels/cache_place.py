"""Where compiled daemons are kept on disk; importable without Numba, so that ``doctor``
and the docs' tools can say it without loading the CUDA target."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_DIR_VARIABLE", "cache_dir"]

CACHE_DIR_VARIABLE = "PYDFCCL_CACHE_DIR"


def cache_dir() -> Path:
    """The directory of compiled daemons: ``PYDFCCL_CACHE_DIR``, else ``NUMBA_CACHE_DIR``,
    else ``__pycache__`` beside the kernels."""
    chosen = os.environ.get(CACHE_DIR_VARIABLE) or os.environ.get("NUMBA_CACHE_DIR")
    return Path(chosen) if chosen else Path(__file__).resolve().parent / "__pycache__"
