"""CUDA driver errors as pykernel exceptions (runtime/cuda.py's and cuda_memory.py's).

Input: CUresult codes and cuda.bindings result tuples. Output: CudaError (a
KernelRuntimeError) naming what was attempted and the driver's error; DeviceOutOfMemory (also a
MemoryError) for allocations; ptxas's log of a PTX module the driver refused.
"""
from __future__ import annotations

from cuda.bindings import driver as cu

from ..errors import KernelRuntimeError

KERNEL_FAULTS = {700, 702, 710, 714, 715, 716, 717, 718, 719}  # sticky: context is lost
LOST_CONTEXT = " The CUDA context is now unusable: restart the process."


class CudaError(KernelRuntimeError):
    """A CUDA driver call failed; `.code` is the CUresult's name."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.code = code


class DeviceOutOfMemory(CudaError, MemoryError):
    """Device allocation failed; the message gives bytes asked and bytes free."""


def error_text(err) -> str:
    """'CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)'."""
    try:
        name = cu.cuGetErrorName(err)[1].decode()
        description = cu.cuGetErrorString(err)[1].decode()
        return f"{name} ({description})"
    except Exception:
        return f"CUresult {int(err)}"


def check(result, what: str):
    """Unwrap a cuda.bindings result tuple, raising CudaError that says what was attempted."""
    err = result[0]
    if err:
        raise CudaError(f"{what} failed: {error_text(err)}", error_text(err).split(" ")[0])
    return result[1] if len(result) == 2 else result[1:]


def jit_error_log(ptx: bytes) -> str:
    """Load the PTX once more through cuModuleLoadDataEx only to collect ptxas's error log."""
    size = 1 << 16
    log = bytearray(size)
    options = [cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER,
               cu.CUjit_option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES]
    try:
        err, module = cu.cuModuleLoadDataEx(ptx, len(options), options, [log, size])
    except Exception as exc:  # the log is a courtesy: never hide the original error
        return f"(could not collect the JIT log: {exc})"
    if not err:
        cu.cuModuleUnload(module)
        return ""
    return bytes(log).split(b"\0", 1)[0].decode(errors="replace").strip()


def fault_error(err, when: str, recent: list[str]) -> CudaError:
    """The error for a kernel that failed asynchronously, naming the likely culprit among the
    kernels launched since the last synchronize (`recent`, oldest first)."""
    if not recent:
        culprit = "no pykernel launch is pending (the failing work came from elsewhere)"
    else:
        culprit = (f"most likely kernel '{recent[-1]}'; launched since the last "
                   f"synchronize, oldest first: {', '.join(recent)}. Set "
                   "PYKERNEL_SYNC_LAUNCH=1 to synchronize after each launch and name the "
                   "kernel exactly")
    fatal = LOST_CONTEXT if int(err) in KERNEL_FAULTS else ""
    return CudaError(f"CUDA error {when}: {error_text(err)}: {culprit}.{fatal}",
                     error_text(err).split(" ")[0])
