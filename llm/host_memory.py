"""Host memory: what is free, and a check made before a backend copies a model's weights.

The numpy backend keeps every weight as float32 (an 8B Q4_K_M file of 4.9 GB becomes ~32 GB),
so on a machine that is too small loading would run for minutes and then be killed by the
kernel's out-of-memory handler. `check_weights_fit` refuses up front instead, naming the file
and both sizes; `PYKERNEL_HOST_MEMORY_CHECK=0` skips it (e.g. where swap should absorb the rest).
"""
from __future__ import annotations

import os

GIB = 2 ** 30
# room left beside the weights: activations, the first KV pages, the interpreter itself
HEADROOM_BYTES = 256 << 20


class HostMemoryError(MemoryError):
    """A model's weights, as the backend holds them, do not fit the free host memory."""


def available_memory() -> int:
    """Bytes the kernel could hand this process now without swapping (MemAvailable on Linux,
    free physical pages elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_weights_fit(path, backend_name: str, weight_bytes: int,
                      available: int | None = None) -> None:
    """Raise HostMemoryError when `weight_bytes` (what backend `backend_name` will allocate for
    the weights of the model at `path`) plus HEADROOM_BYTES exceed the free host memory."""
    if weight_bytes <= 0 or os.environ.get("PYKERNEL_HOST_MEMORY_CHECK", "1") == "0":
        return
    available = available_memory() if available is None else available
    if weight_bytes + HEADROOM_BYTES <= available:
        return
    raise HostMemoryError(
        f"{path}: the {backend_name} backend's copy of the weights takes "
        f"{weight_bytes / GIB:.2f} GiB, but only {available / GIB:.2f} GiB of host memory is "
        f"free (with {HEADROOM_BYTES >> 20} MiB of headroom). Use a GPU (--device cuda), a "
        f"smaller model, or set PYKERNEL_HOST_MEMORY_CHECK=0 to load it anyway (swap).")
