"""Cooperative launches of the CUDA device (kernels calling pk.grid_sync) and the occupancy
query they and runtime/occupancy.py rest on.

Input: a loaded kernel (runtime/cuda_loaded.py's LoadedKernel), launch geometry, a stream handle.
Output: the driver's result of cuLaunchKernelEx with the cooperative attribute, or a
LaunchError when the grid cannot be resident at once; (blocks per SM, SMs).
"""
from __future__ import annotations

from cuda.bindings import driver as cu

from ..errors import LaunchError
from .cuda_errors import check


def launch_cooperative(device, kernel, grid, block, shared_bytes, handle, cluster):
    """A kernel with pk.grid_sync: cuLaunchKernelEx with the cooperative attribute, after
    checking that every block of the grid can be resident at once (else the barrier would
    wait for ever; the driver refuses too, with a less telling error)."""
    where = f"{kernel.name}[grid={tuple(grid)}, block={tuple(block)}, shared={shared_bytes}]"
    if cluster is not None and tuple(cluster) != (1, 1, 1):
        raise LaunchError(f"{where}: a kernel with pk.grid_sync() cannot use clusters")
    threads, blocks = block[0] * block[1] * block[2], grid[0] * grid[1] * grid[2]
    per_sm, sms = blocks_per_sm(device, kernel, threads, shared_bytes)
    fits = per_sm * sms
    if blocks > fits:
        raise LaunchError(f"{where}: pk.grid_sync() needs every block resident at once; "
                          f"{blocks} blocks, this GPU holds at most {fits} of this kernel's "
                          f"blocks together")
    attribute = cu.CUlaunchAttribute()
    attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    attribute.value.cooperative = 1
    config = cu.CUlaunchConfig()
    config.attrs, config.numAttrs = [attribute], 1
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes, config.hStream = shared_bytes, handle
    return cu.cuLaunchKernelEx(config, kernel.func, kernel.kernel_params, kernel.extra)


def blocks_per_sm(device, kernel, threads, shared_bytes):
    """(blocks per SM, SMs) for a loaded kernel: cuOccupancyMaxActiveBlocksPerMultiprocessor
    (registers, shared memory, threads), kept per (threads, shared bytes)."""
    per_sm = kernel.co_resident.get((threads, shared_bytes))
    if per_sm is None:
        per_sm = kernel.co_resident[(threads, shared_bytes)] = check(
            cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel.func, threads, shared_bytes),
            f"{kernel.name}: occupancy")
    return per_sm, device.core.properties.multiprocessor_count
