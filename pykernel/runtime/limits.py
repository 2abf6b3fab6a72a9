"""CUDA's launch limits, checked the same way for every device: a launch the GPU would refuse
is a LaunchError on the CPU device too (rather than running 2**31 blocks, hanging on
(2**31, 65536, 65536), or failing with an OverflowError that names neither kernel nor grid).
Input: a kernel name, grid and block as 3-tuples of ints, the dynamic shared bytes; output:
nothing, or the LaunchError naming the kernel, the extent and its limit."""
from __future__ import annotations

from ..errors import LaunchError

MAX_GRID = (2**31 - 1, 65535, 65535)         # blocks per grid dimension (x, y, z)
MAX_BLOCK = (1024, 1024, 64)                 # threads per block dimension (x, y, z)
MAX_THREADS_PER_BLOCK = 1024
# dynamic shared memory per block: the largest opt-in of any supported GPU (sm_90, sm_100:
# 227 KiB); each CUDA device then checks its own limit with the kernel's static bytes
MAX_DYNAMIC_SHARED = 227 * 1024


def check_geometry(name: str, grid, block, shared_bytes: int = 0) -> None:
    """Raise LaunchError unless grid, block and dynamic shared bytes are within CUDA's limits.
    A handful of integer comparisons: the launch path calls it (Launchers once per
    configuration, the CPU device at every launch)."""
    gx, gy, gz = grid
    bx, by, bz = block
    if 0 < gx <= 2147483647 and 0 < gy <= 65535 and 0 < gz <= 65535 and 0 < bx <= 1024 \
            and 0 < by <= 1024 and 0 < bz <= 64 and bx * by * bz <= 1024 \
            and 0 <= shared_bytes <= MAX_DYNAMIC_SHARED:
        return
    raise geometry_error(name, grid, block, shared_bytes)


def geometry_error(name: str, grid, block, shared_bytes: int = 0) -> LaunchError:
    """The first limit the launch breaks, named (kernel, which extent, given, the limit)."""
    where = f"{name}[grid={tuple(grid)}, block={tuple(block)}]"
    for what, dims, limits in (("grid", grid, MAX_GRID), ("block", block, MAX_BLOCK)):
        for axis, value, limit in zip("xyz", dims, limits):
            if not 1 <= value <= limit:
                return LaunchError(
                    f"{where}: {what} {axis} = {value}, must be in 1..{limit} (CUDA's limits: "
                    f"grid x <= 2**31-1, y, z <= 65535; block x, y <= 1024, z <= 64)")
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS_PER_BLOCK:
        return LaunchError(f"{where}: {threads} threads per block; at most "
                           f"{MAX_THREADS_PER_BLOCK}")
    return LaunchError(f"{where}: dynamic shared memory of {shared_bytes} bytes; expected "
                       f"0..{MAX_DYNAMIC_SHARED} bytes ({MAX_DYNAMIC_SHARED // 1024} KiB)")
