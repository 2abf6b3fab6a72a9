"""Per-kernel memory limits checked while lowering, the same on every target: an array the
GPU cannot hold is a source error at its declaration, not a ptxas failure, an LLVM warning or
(on the CPU target, whose threads keep local arrays on their stack) a segfault."""
from __future__ import annotations

# local memory per thread: CUDA's limit on every supported GPU (sm_75 .. sm_100)
MAX_LOCAL_BYTES = 512 * 1024
# static shared memory per block (`.shared` declared in the PTX): ptxas refuses more than
# 48 KiB; larger tiles use pk.dynamic_shared with the launch's shared_bytes (up to 227 KiB)
MAX_STATIC_SHARED_BYTES = 48 * 1024


def reserve_local(fl, node, nbytes: int) -> None:
    """Count a pk.local_array of `nbytes` against the per-thread limit (all local arrays of
    the kernel, inlined @pk.func ones included, add up)."""
    ctx = fl.ctx
    total = ctx.local_bytes + nbytes
    if total > MAX_LOCAL_BYTES:
        before = f" ({ctx.local_bytes} bytes declared before it)" if ctx.local_bytes else ""
        raise fl.error(node, f"pk.local_array of {nbytes} bytes{before}: {total} bytes of "
                       f"local memory per thread; CUDA allows at most {MAX_LOCAL_BYTES} "
                       f"({MAX_LOCAL_BYTES // 1024} KiB)",
                       hint="keep large data in global memory (a Ptr argument) or share it "
                            "per block with pk.shared_array / pk.dynamic_shared")
    ctx.local_bytes = total


def check_static_shared(fl, node, nbytes: int) -> None:
    """After a pk.shared_array of `nbytes`: the block's static shared memory must fit."""
    total = fl.ctx.shared_bytes
    if total > MAX_STATIC_SHARED_BYTES:
        raise fl.error(node, f"pk.shared_array of {nbytes} bytes: {total} bytes of static "
                       f"shared memory per block; at most {MAX_STATIC_SHARED_BYTES} "
                       f"({MAX_STATIC_SHARED_BYTES // 1024} KiB)",
                       hint="use pk.dynamic_shared(T) and pass the size as the launch's "
                            "shared_bytes (up to 227 KiB on sm_90)")
