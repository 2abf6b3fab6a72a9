"""Kernels whose source pykernel writes itself (`@pk.elementwise`, `@pk.reduction`): the text
is registered with linecache under a name of its own, so the front end reads it as it reads a
file (inspect finds the lines), the disk cache keys it by that text, and a compile error in it
prints the generated line with its caret."""
from __future__ import annotations

import hashlib
import linecache

from .kernel import Kernel, kernel


def define_kernel(name: str, source: str, namespace: dict, what: str) -> Kernel:
    """`@pk.kernel` over function `name` defined by `source` with globals `namespace` (which
    holds the types, functions and constants the source names); `what` labels the file."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    filename = f"<pykernel {what} {digest}>"
    # not in sys.modules: inspect then takes the registered lines as the whole "module"
    namespace = {"__name__": f"pykernel.generated.{digest}", **namespace}
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return kernel(namespace[name])


def array_address(value):
    """The first element's address of an array argument (pk.Array, numpy on the cpu device,
    `__cuda_array_interface__` objects), else None: the generators' alignment test for their
    vector-load kernels."""
    if hasattr(value, "ptr"):
        return int(value.ptr)
    if hasattr(value, "ctypes"):
        return int(value.ctypes.data)
    interface = getattr(value, "__cuda_array_interface__", None)
    return int(interface["data"][0]) if interface else None


def vector_aligned(value, ty, width: int) -> bool:
    """Whether `width`-element vector loads of `value` (elements of scalar type `ty`) are
    possible: a type of at most 32 bits (loads of at most 16 bytes), not bool, and the first
    element aligned to the vector's bytes (an unknown address counts as misaligned)."""
    return ty.kind != "bool" and ty.bits <= 32 and \
        (array_address(value) or 1) % (width * ty.bits // 8) == 0
