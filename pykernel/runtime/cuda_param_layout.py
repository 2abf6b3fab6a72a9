"""Whether a loaded CUDA kernel can take its parameters as one buffer (cuLaunchKernel's `extra`).

Input: a CUfunction and the ArgPacker built for it (its fields' offsets and sizes).
Output: `buffer_layout_ok(func, packer)`: True when the driver's own parameter layout
(cuFuncGetParamInfo, CUDA 12.4+) has exactly the packer's fields; False when the driver cannot
say (then the launch passes the fields one by one through kernelParams, which does not depend
on the offsets); a LaunchError when they differ. Through `extra` the driver copies the buffer
as it is, so a field at a wrong offset would reach the kernel as garbage: the layout is proven
once per loaded kernel instead.
"""
from __future__ import annotations

from cuda.bindings import driver as cu

from ..errors import LaunchError


def buffer_layout_ok(func, packer) -> bool:
    query = getattr(cu, "cuFuncGetParamInfo", None)
    if query is None:
        return False
    for index, (param, offset) in enumerate(zip(packer.params, packer.offsets)):
        err, driver_offset, driver_size = query(func, index)
        if err:                  # not supported here, or fewer parameters than we pack
            if index and int(err) == int(cu.CUresult.CUDA_ERROR_INVALID_VALUE):
                raise _mismatch(packer, f"the driver knows {index} parameters, "
                                        f"pykernel packs {len(packer.params)}")
            return False
        if (driver_offset, driver_size) != (offset, param.size):
            raise _mismatch(packer, f"parameter {index} ('{param.name}') is {driver_size} "
                                    f"bytes at offset {driver_offset} for the driver, "
                                    f"{param.size} at {offset} in pykernel's buffer")
    err = query(func, len(packer.params))[0]
    if not err:
        raise _mismatch(packer, f"the driver knows more than the {len(packer.params)} "
                                "parameters pykernel packs")
    return True


def _mismatch(packer, what: str) -> LaunchError:
    return LaunchError(f"{packer.kernel_name}(): pykernel's parameter layout differs from the "
                       f"driver's: {what}. This is a pykernel bug; please report it (a "
                       "CudaDevice(param_buffer=False) passes parameters one by one meanwhile)")
