"""Flushing the process's C stdio, where the CUDA driver writes kernels' printf output."""
from __future__ import annotations

import ctypes
import functools


def flush_c_stdio() -> None:
    """Kernels' print() output: the driver writes its printf buffer through C stdio at a
    synchronization, which is block-buffered when stdout is not a terminal; flush it there so
    the lines come before what the host prints next."""
    libc = _c_library()
    if libc is not None:
        libc.fflush(None)


@functools.cache
def _c_library():
    try:
        return ctypes.CDLL(None)          # the process's own C library (POSIX)
    except (OSError, TypeError):          # Windows: no such handle; output flushes at exit
        return None
