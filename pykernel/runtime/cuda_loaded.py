"""A kernel loaded on a CUDA device (what CudaDevice.load returns and every launch reads): its
function handle, argument packer and parameter-buffer choice, shared-memory limits and launch
configuration; and the helpers that describe a launch the driver could not take."""
from __future__ import annotations

import threading

from cuda.bindings import driver as cu

from ..errors import LaunchError
from .cuda_errors import check
from .limits import check_geometry


class LoadedKernel:
    __slots__ = ("name", "func", "packer", "pack", "params_address", "kernel_params", "extra",
                 "param_buffer", "lock", "dynamic_shared_limit", "static_shared", "code",
                 "launch_config", "non_portable", "cooperative", "co_resident")

    def __init__(self, name, func, packer, dynamic_shared_limit, static_shared, code,
                 param_buffer: bool, pdl: bool = False):
        self.name, self.func, self.packer, self.pack = name, func, packer, packer.pack
        self.params_address = packer.params_address
        # cuLaunchKernel takes either kernelParams (void*[] of field addresses) or `extra`
        # (the whole buffer); at most one is non-NULL (both for a kernel without parameters)
        self.param_buffer = param_buffer
        self.kernel_params = 0 if param_buffer else packer.params_address
        self.extra = packer.extra_address if param_buffer else 0
        self.lock = threading.Lock()    # the shared buffer, from pack until the driver's copy
        self.dynamic_shared_limit = dynamic_shared_limit
        self.static_shared = static_shared
        self.code = code  # the cuda.core ObjectCode: keeps the module loaded
        # PDL-capable kernels (they wait for their predecessor in their own prologue) go
        # through cuLaunchKernelEx with programmatic stream serialization when a capture
        # asks for it (capture_graph(pdl=True))
        self.launch_config = pdl_config() if pdl else None
        self.non_portable = False     # clusters of more than 8 blocks allowed (set on demand)
        self.cooperative = False      # pk.grid_sync: launched cooperatively (set by load)
        self.co_resident = {}         # (threads, shared bytes) -> blocks resident per SM


def bad_geometry(kernel, grid, block, shared_bytes, exc) -> LaunchError:
    """The LaunchError for extents the launch call could not even convert: the limit broken
    (runtime/limits.py), else what the conversion said."""
    try:
        check_geometry(kernel.name, grid, block, shared_bytes)
    except LaunchError as err:
        return err
    return LaunchError(f"{kernel.name}[grid={tuple(grid)}, block={tuple(block)}, "
                       f"shared={shared_bytes}]: invalid launch geometry ({exc})")


def pdl_config():
    attribute = cu.CUlaunchAttribute()
    attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value.programmaticStreamSerializationAllowed = 1
    config = cu.CUlaunchConfig()
    config.attrs, config.numAttrs = [attribute], 1
    return config


def function_of(handle):
    """cuda.core loads through the library API (CUkernel); attributes need a CUfunction."""
    if isinstance(handle, cu.CUkernel):
        return check(cu.cuKernelGetFunction(handle), "cuKernelGetFunction")
    return handle
