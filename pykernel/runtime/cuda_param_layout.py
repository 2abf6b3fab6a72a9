"""Whether a loaded CUDA kernel can take its parameters as one buffer (cuLaunchKernel's `extra`).

Input: a CUfunction and the ArgPacker built for it (its fields' offsets and sizes).
Output: `buffer_layout_ok(func, packer)`: True when the driver's own parameter layout
(cuFuncGetParamInfo, CUDA 12.4+) has exactly the packer's fields; False when the driver cannot
say or says otherwise: then the launch passes the fields one by one through kernelParams,
which does not depend on the offsets. Through `extra` the driver copies the buffer as it is,
so a field at a wrong offset would reach the kernel as garbage: the layout is proven once per
loaded kernel instead. `layout_difference(func, packer)` says what differs (None if nothing).

Seen on the H200 (driver 580): kernels with a tensor-map parameter (`.param .align 64 .b8
[128]`) report their first parameter at offset 48, not 0, so they take kernelParams.
"""
from __future__ import annotations

from cuda.bindings import driver as cu



def buffer_layout_ok(func, packer) -> bool:
    return layout_difference(func, packer) is None


def layout_difference(func, packer) -> str | None:
    """None when the driver confirms every field of the packer's buffer, else why not."""
    query = getattr(cu, "cuFuncGetParamInfo", None)
    if query is None:
        return "this cuda.bindings has no cuFuncGetParamInfo"
    for index, (param, offset) in enumerate(zip(packer.params, packer.offsets)):
        err, driver_offset, driver_size = query(func, index)
        if err:                  # not supported here, or fewer parameters than we pack
            if index and int(err) == int(cu.CUresult.CUDA_ERROR_INVALID_VALUE):
                return (f"the driver knows {index} parameters, pykernel packs "
                        f"{len(packer.params)}")
            return f"the driver does not say ({err})"
        if (driver_offset, driver_size) != (offset, param.size):
            return (f"parameter {index} ('{param.name}') is {driver_size} bytes at offset "
                    f"{driver_offset} for the driver, {param.size} at {offset} in pykernel's "
                    "buffer")
    if not query(func, len(packer.params))[0]:
        return f"the driver knows more than the {len(packer.params)} parameters pykernel packs"
    return None
