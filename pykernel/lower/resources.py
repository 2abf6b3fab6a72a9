"""Per-kernel memory limits checked while lowering, the same on every target: local arrays a
thread cannot hold are a source error at their declaration, not an LLVM warning or (on the CPU
target, whose threads keep local arrays on their stack) a segfault. (Static shared memory is
not counted here: a declared array that the kernel never uses is dropped by LLVM, so only
ptxas knows what a kernel keeps; decode attention declares 64 KiB it drops for some shapes.)"""
from __future__ import annotations

# local memory per thread: CUDA's limit on every supported GPU (sm_75 .. sm_100)
MAX_LOCAL_BYTES = 512 * 1024
# shared memory one block can have on any supported GPU (sm_90 / sm_100: 227 KiB): one
# pk.shared_array larger than this can never launch, whatever LLVM drops
MAX_SHARED_BYTES = 227 * 1024


def check_shared_array(fl, node, nbytes: int) -> None:
    """One static shared array no GPU can hold is a source error at its declaration (not
    invalid IR for absurd sizes, nor a launch that fails later)."""
    if nbytes > MAX_SHARED_BYTES:
        raise fl.error(node, f"pk.shared_array of {nbytes} bytes: a block has at most "
                       f"{MAX_SHARED_BYTES} bytes ({MAX_SHARED_BYTES // 1024} KiB) of shared "
                       "memory on any supported GPU",
                       hint="tile the data, or keep it in global memory (a Ptr argument)")
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
