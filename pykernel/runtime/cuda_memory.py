"""Device and page-locked host memory of the CUDA device (runtime/cuda.py's CudaDevice.memory).

Input: byte counts, device addresses, host numpy arrays, streams. Output: allocations freed when
the last view of them dies; synchronous copies on the legacy default stream and asynchronous
ones on a stream; DeviceOutOfMemory naming bytes asked and bytes free.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from cuda.bindings import driver as cu

from ..errors import LaunchError
from .cuda_errors import CudaError, DeviceOutOfMemory, check, error_text

if TYPE_CHECKING:
    from .cuda import CudaDevice

_OUT_OF_MEMORY = 2     # CUDA_ERROR_OUT_OF_MEMORY


class _DeviceAllocation:
    """Owns one cuMemAlloc block; freed when the last Array view referencing it dies."""
    __slots__ = ("ptr", "nbytes", "__weakref__")

    def __init__(self, ptr: int, nbytes: int):
        self.ptr, self.nbytes = ptr, nbytes

    def __del__(self):
        try:
            cu.cuMemFree(self.ptr)
        except Exception:  # interpreter shutdown or a lost context: nothing left to free
            pass


class CudaMemory:
    """Synchronous allocation and copies on the legacy default stream: ordered with every
    launch on pykernel's (blocking) streams, and safe during relaxed graph capture."""
    kind = "cuda"

    def __init__(self, device: "CudaDevice"):
        self._device = device

    def alloc(self, nbytes: int):
        self._device.activate()
        err, ptr = cu.cuMemAlloc(nbytes)
        if err:
            raise self._allocation_error(err, nbytes)
        allocation = _DeviceAllocation(int(ptr), nbytes)
        return allocation, allocation.ptr

    def _allocation_error(self, err, nbytes: int) -> CudaError:
        device = self._device
        if int(err) != _OUT_OF_MEMORY:
            return CudaError(f"cuMemAlloc of {nbytes} bytes on {device} failed: "
                             f"{error_text(err)}", error_text(err).split(" ")[0])
        free, total = cu.cuMemGetInfo()[1:]
        return DeviceOutOfMemory(
            f"out of GPU memory on {device}: asked for {nbytes} bytes ({nbytes / 2**20:.1f} "
            f"MiB), {int(free)} bytes ({int(free) / 2**20:.1f} MiB) free of "
            f"{int(total) / 2**30:.1f} GiB", "CUDA_ERROR_OUT_OF_MEMORY")

    def upload(self, dst: int, host) -> None:
        self._device.activate()
        check(cu.cuMemcpyHtoD(dst, host.ctypes.data, host.nbytes), "copy host -> device")

    def download(self, host, src: int) -> None:
        self._device.activate()
        err = cu.cuMemcpyDtoH(host.ctypes.data, src, host.nbytes)[0]
        if err:
            raise self._device.fault_error(err, "while copying device -> host")

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self._device.activate()
        check(cu.cuMemcpyDtoD(dst, src, nbytes), "copy device -> device")

    def alloc_pinned(self, nbytes: int):
        """Page-locked host memory: -> (owner freeing it when collected, address)."""
        self._device.activate()
        address = int(check(cu.cuMemHostAlloc(nbytes, 0), f"cuMemHostAlloc of {nbytes} bytes"))
        return _PinnedAllocation(address), address

    def download_async(self, host, src: int, stream) -> None:
        handle = self._device._launch_handle if stream is None else stream_handle(stream)
        err = cu.cuMemcpyDtoHAsync(host.ctypes.data, src, host.nbytes, handle)[0]
        if err:
            raise self._device.fault_error(err, "while copying device -> host")

    def upload_async(self, dst: int, host, stream) -> None:
        handle = self._device._launch_handle if stream is None else stream_handle(stream)
        check(cu.cuMemcpyHtoDAsync(dst, host.ctypes.data, host.nbytes, handle),
              "copy host -> device")

    def memset(self, dst: int, byte: int, nbytes: int) -> None:
        self._device.activate()
        check(cu.cuMemsetD8(dst, byte, nbytes), "memset")


class _PinnedAllocation:
    def __init__(self, address: int):
        self.address = address

    def __del__(self):
        try:
            cu.cuMemFreeHost(self.address)
        except Exception:   # interpreter shutdown: the driver may be gone already
            pass


def stream_handle(stream):
    """pykernel Stream (fast), or anything speaking the __cuda_stream__ protocol, or an int."""
    handle = getattr(stream, "_launch_handle", None)
    if handle is not None:
        return handle
    if hasattr(stream, "__cuda_stream__"):
        return cu.CUstream(stream.__cuda_stream__()[1])
    if isinstance(stream, int):
        return cu.CUstream(stream)
    raise LaunchError(f"stream must be a pk.Stream (or expose __cuda_stream__), got "
                      f"{type(stream).__name__}")
