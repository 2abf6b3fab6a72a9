"""Occupancy queries: how many blocks of a kernel can be resident at once, the grid a
persistent kernel launches (`Kernel.max_active_blocks`, `Kernel.co_resident_grid`).

Input: a kernel, a block shape, dynamic shared bytes, a device and the kernel's compile-time
arguments; output: ints. The kernel is compiled for the device exactly as a launch would
compile it, then the device answers through its `occupancy(compiled, threads, shared_bytes)`
-> (blocks per multiprocessor, multiprocessors): CUDA from
cuOccupancyMaxActiveBlocksPerMultiprocessor for the loaded function and the device's SM count
(runtime/cuda.py, the same numbers pk.grid_sync's launch check uses); the CPU target 1 block
per host worker thread (runtime/cpu.py)."""
from __future__ import annotations

from ..errors import LaunchError
from .device import current_device, get_device
from .limits import check_geometry


def occupancy(kernel, block, shared_bytes=0, device=None, spec=None) -> tuple[int, int]:
    """(resident blocks per multiprocessor, multiprocessors) of `kernel` launched with `block`
    threads and `shared_bytes` of dynamic shared memory on `device` (default: the current one;
    a device or a spec such as "cuda:0")."""
    from ..launch import _compile_for_device, _dim3, _shared_bytes
    device = current_device() if device is None else (
        get_device(device) if isinstance(device, str) else device)
    block = _dim3(block, "block", kernel.name)
    shared_bytes = _shared_bytes(shared_bytes, kernel.name)
    check_geometry(kernel.name, (1, 1, 1), block, shared_bytes)
    options = kernel.launch_options(device.arch, device.programmatic_launch)
    compiled = _compile_for_device(kernel, device.arch, options, dict(spec or {}))
    return device.occupancy(compiled, block[0] * block[1] * block[2], shared_bytes)


def co_resident_grid(kernel, block, shared_bytes=0, device=None, spec=None) -> int:
    """Blocks per multiprocessor x multiprocessors: the largest grid whose blocks all run at
    once, so blocks that wait on each other (a persistent kernel's counters, pk.grid_sync)
    cannot wait on a block that never starts."""
    per_unit, units = occupancy(kernel, block, shared_bytes, device, spec)
    if per_unit < 1:
        raise LaunchError(f"{kernel.name}[block={block}, shared={shared_bytes}]: not one block "
                          "of this kernel fits on a multiprocessor (registers or shared "
                          "memory); use a smaller block or less shared memory")
    return per_unit * units
