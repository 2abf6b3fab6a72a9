"""The CUDA device, on cuda-python: cuda.core for the device, context, PTX loading, streams,
events and graphs; cuda.bindings.driver for what cuda.core lacks or makes slow (raw launch,
synchronous allocation, memcpy, function attributes, JIT error logs).

Input: CompiledKernel objects (.ptx, .entry, .params, .shared_bytes, .cache_key), launch
geometry and runtime arguments.
Output: kernels running on the GPU; CUDA errors mapped to KernelRuntimeError/LaunchError naming
the kernel; allocation failures naming bytes asked and free.

Launch path (per call): the Launcher's generated function (fast_launch): inline argument
checks -> one struct.pack_into into a parameter buffer taken from the kernel's pool -> one
cuLaunchKernel handing the driver that buffer through a prebuilt `extra` array (or its prebuilt
void*[] of field addresses: param_buffer=False, or a driver that cannot confirm the layout).
The full path (`launch`: captures, PDL, clusters, cooperative kernels) packs the kernel's shared
buffer under the kernel's lock.
"""
from __future__ import annotations

import functools
import os
import sys
from collections import deque

from cuda.bindings import driver as cu
from cuda.core import Device as CoreDevice
from cuda.core import ObjectCode

from ..errors import KernelRuntimeError, LaunchError
from .c_stdio import flush_c_stdio
from .cuda_cooperative import blocks_per_sm, launch_cooperative
from .cuda_errors import DeviceOutOfMemory  # noqa: F401 (runtime.md names it here)
from .cuda_errors import (KERNEL_FAULTS, LOST_CONTEXT, CudaError, check, error_text, fault_error,
                          jit_error_log)
from .cuda_loaded import LoadedKernel, bad_geometry, function_of
from .cuda_memory import CudaMemory
from .cuda_param_layout import buffer_layout_ok
from .cuda_memory import stream_handle as _stream_handle
from .device import register_device_kind
from .limits import check_geometry
from .packer import ArgPacker

_DEFAULT_SHARED_LIMIT = 48 * 1024
_MAX_DYNAMIC_SHARED = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_MAX_THREADS = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
_NUM_REGS = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
_INVALID_CONTEXT = int(cu.CUresult.CUDA_ERROR_INVALID_CONTEXT)
_NON_PORTABLE_CLUSTER = \
    cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
_launch_kernel = cu.cuLaunchKernel          # the driver calls of launches (module-level: tests
_launch_kernel_ex = cu.cuLaunchKernelEx     # without a GPU replace them)


def _launch_cluster(kernel, grid, block, shared_bytes, handle, cluster, pdl: bool):
    """cuLaunchKernelEx with the cluster dimension (and PDL when capturing with it); clusters
    over 8 blocks need the function's non-portable opt-in, set once."""
    size = cluster[0] * cluster[1] * cluster[2]
    if size > 8 and not kernel.non_portable:
        check(cu.cuFuncSetAttribute(kernel.func, _NON_PORTABLE_CLUSTER, 1),
              f"{kernel.name}: allowing clusters of more than 8 blocks")
        kernel.non_portable = True
    dims = cu.CUlaunchAttribute()
    dims.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    dims.value.clusterDim.x, dims.value.clusterDim.y, dims.value.clusterDim.z = cluster
    config = cu.CUlaunchConfig()
    attrs = [dims] + (list(kernel.launch_config.attrs) if pdl else [])
    config.attrs, config.numAttrs = attrs, len(attrs)
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes, config.hStream = shared_bytes, handle
    return _launch_kernel_ex(config, kernel.func, kernel.kernel_params, kernel.extra)


def _launch_pdl(kernel, grid, block, shared_bytes, handle):
    config = kernel.launch_config
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes, config.hStream = shared_bytes, handle
    return _launch_kernel_ex(config, kernel.func, kernel.kernel_params, kernel.extra)


class CudaDevice:
    """One GPU. `launch` is the hot path; everything else is setup or error reporting."""
    kind = "cuda"

    def __init__(self, ordinal: int = 0, param_buffer: bool | None = None):
        self.ordinal = ordinal
        if param_buffer is None:
            param_buffer = os.environ.get("PYKERNEL_PARAM_BUFFER", "1") != "0"
        self.param_buffer = param_buffer  # pass arguments through `extra` (one buffer)
        self.core = CoreDevice(ordinal)
        self.core.set_current()
        self._context = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        major, minor = self.core.compute_capability
        self.arch = f"sm_{major}{minor}"
        self.name = self.core.name
        props = self.core.properties
        self.max_shared_optin = props.max_shared_memory_per_block_optin
        self.max_threads_per_block = props.max_threads_per_block
        self.max_grid = (props.max_grid_dim_x, props.max_grid_dim_y, props.max_grid_dim_z)
        self.memory = CudaMemory(self)
        self.sync_launches = os.environ.get("PYKERNEL_SYNC_LAUNCH", "") not in ("", "0")
        self._kernels: dict[str, LoadedKernel] = {}
        self._recent: deque[str] = deque(maxlen=16)
        self._launch_handle = cu.CUstream(0)  # legacy default stream; a capture redirects it
        self._capture = None                  # the GraphCapture recording launches, if any
        self.programmatic_launch = False      # launch PDL-capable kernels with PDL (graphs.py)
        self._prints = False                  # a loaded kernel calls print(): flush C stdio

    def __repr__(self) -> str:
        return f"cuda:{self.ordinal} ({self.name}, {self.arch})"

    @property
    def launch_stream_handle(self) -> int:
        """The CUstream that launches without a stream go to now: the legacy default stream,
        or the stream being captured. Work a library enqueues there (an NCCL collective) is
        ordered with those launches and, inside capture_graph, captured with them."""
        return int(self._launch_handle)

    def activate(self) -> None:
        """Make this device's context current on the calling thread (cheap when it is)."""
        current = cu.cuCtxGetCurrent()[1]
        if int(current) != int(self._context):
            check(cu.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")

    def reactivated(self, err) -> bool:
        """After a failed launch: True when it failed because the calling thread had another
        (or no) context current, which is now this device's: the caller launches again. A
        thread other than the one that created the device meets this on its first launch;
        checking the context before every launch would cost every launch instead."""
        if int(err) != _INVALID_CONTEXT or int(cu.cuCtxGetCurrent()[1]) == int(self._context):
            return False
        self.activate()
        return True

    # -- launch -----------------------------------------------------------------------------
    def launch(self, compiled, grid, block, args, stream=None, shared_bytes=0, cluster=None):
        kernel = self._kernels.get(compiled.cache_key)
        if kernel is None:
            kernel = self.load(compiled)
        handle = self._launch_handle if stream is None else _stream_handle(stream)
        with kernel.lock:       # another thread's pack would overwrite the shared buffer
            kernel.pack(args)
            if shared_bytes > kernel.dynamic_shared_limit:
                self._raise_shared_limit(kernel, shared_bytes)
            self._recent.append(kernel.name)
            try:
                err = self._driver_launch(kernel, grid, block, shared_bytes, handle, cluster)
                if err and self.reactivated(err):
                    err = self._driver_launch(kernel, grid, block, shared_bytes, handle,
                                              cluster)
            except (OverflowError, TypeError) as exc:
                raise bad_geometry(kernel, grid, block, shared_bytes, exc) from None
        if err:
            self._launch_failed(err, kernel, grid, block, shared_bytes, cluster)
        if self._capture is not None:
            self._capture.record(kernel, grid, block, shared_bytes, handle, args,
                                 cluster or (1, 1, 1))
        elif self.sync_launches:
            self._synchronize_after(kernel, handle)

    def _driver_launch(self, kernel, grid, block, shared_bytes, handle, cluster):
        """The driver call of a full-path launch (its parameters packed): cooperative, cluster,
        plain or PDL; returns the CUresult."""
        pdl = kernel.launch_config is not None and self.programmatic_launch
        if kernel.cooperative:
            (err,) = launch_cooperative(self, kernel, grid, block, shared_bytes, handle,
                                         cluster)
        elif cluster is not None and cluster != (1, 1, 1):
            (err,) = _launch_cluster(kernel, grid, block, shared_bytes, handle, cluster, pdl)
        elif not pdl:
            (err,) = _launch_kernel(kernel.func, grid[0], grid[1], grid[2], block[0], block[1],
                                    block[2], shared_bytes, handle, kernel.kernel_params,
                                    kernel.extra)
        else:
            (err,) = _launch_pdl(kernel, grid, block, shared_bytes, handle)
        return err

    def bind(self, compiled, grid, block, args, stream=None, shared_bytes=0, cluster=None,
             fallback=None):
        """A function repeating this launch (BoundLaunch.launch): arguments checked and packed
        now into a private copy of the parameter buffer, the driver called directly later.
        Captures, PDL launch modes, clusters and synchronous launches call `fallback` (the
        launcher's ordinary call) or, without one, the full `launch`."""
        kernel = self._kernels.get(compiled.cache_key) or self.load(compiled)
        with kernel.lock:
            kernel.pack(args)
            owner, params, extra = kernel.packer.snapshot()
        if kernel.param_buffer:
            params = 0
        else:
            extra = 0
        if shared_bytes > kernel.dynamic_shared_limit:
            self._raise_shared_limit(kernel, shared_bytes)
        handle = None if stream is None else _stream_handle(stream)
        func, name = kernel.func, kernel.name
        (g0, g1, g2), (b0, b1, b2) = grid, block
        plain = cluster in (None, (1, 1, 1)) and kernel.launch_config is None and \
            not kernel.cooperative
        full = fallback or functools.partial(self.launch, compiled, grid, block, args, stream,
                                             shared_bytes, cluster)
        recent = self._recent.append

        def launch():
            if self._capture is not None or self.sync_launches or not plain or \
                    self.programmatic_launch:
                return full()
            recent(name)
            stream_handle = self._launch_handle if handle is None else handle
            try:
                (err,) = _launch_kernel(func, g0, g1, g2, b0, b1, b2, shared_bytes,
                                        stream_handle, params, extra)
                if err and self.reactivated(err):
                    (err,) = _launch_kernel(func, g0, g1, g2, b0, b1, b2, shared_bytes,
                                            stream_handle, params, extra)
            except (OverflowError, TypeError) as exc:
                raise bad_geometry(kernel, grid, block, shared_bytes, exc) from None
            if err:
                self._launch_failed(err, kernel, grid, block, shared_bytes, cluster)
        launch.keepalive = (owner, args)
        return launch

    def fast_launch(self, compiled, grid, block, stream=None, shared_bytes=0, fallback=None,
                    guard=("False", {})):
        """A function `launch(a0, a1, ...)` for a Launcher's plain calls of `compiled` with
        this geometry, generated with the packer's checks inline (one Python frame per
        launch, the arguments bound positionally): the shared-memory opt-in, stream handle
        and driver arguments are resolved now. Keywords, the caller's `guard` (an expression
        and the names it reads), a capture, a programmatic_launches() block, synchronous
        launches or a wrong argument count go to `fallback(*args, **kwargs)`, the full path
        (whose errors users then see). None where
        there is no such function: while capturing (the stream's handle is the capture's then)
        and for n-d array parameters (their pack expands arguments) and cooperative kernels
        (pk.grid_sync: the full path launches them with the cooperative attribute)."""
        if self._capture is not None:
            return None
        kernel = self._kernels.get(compiled.cache_key) or self.load(compiled)
        if kernel.cooperative:      # pk.grid_sync: only the full path launches cooperatively
            return None
        if shared_bytes > kernel.dynamic_shared_limit:
            self._raise_shared_limit(kernel, shared_bytes)
        # outside a capture (the only time this runs) the handles are the streams' own
        handle = self._launch_handle if stream is None else _stream_handle(stream)
        condition, names = guard
        scope = {**names, "device": self, "fallback": fallback, "func": kernel.func,
                 "runtime": sys.modules[__name__], "handle": handle,
                 "recent": self._recent.append, "name": kernel.name,
                 "failed": functools.partial(self._launch_failed, kernel=kernel, grid=grid,
                                             block=block, shared_bytes=shared_bytes)}
        geometry = ", ".join(str(int(v)) for v in (*grid, *block, shared_bytes))
        guard = (f"{condition} or device._capture is not None or device.sync_launches or "
                 "device.programmatic_launch")
        # the parameters: this launch's pool buffer as one block (`extra`), or its void*[];
        # the driver has copied them when it returns, so the buffer goes back to the pool
        passed = "0, extra" if kernel.param_buffer else "params, 0"
        # the module attribute, read per call: tests replace the driver call there
        call = f"err, = runtime._launch_kernel(func, {geometry}, handle, {passed})"
        # one test of `err` on success; a failure retries once where the thread had another
        # context current (`reactivated`), and raises with the buffer back in the pool
        tail = ["recent(name)", call, "if err:", "    if device.reactivated(err):",
                "        " + call, "    give(slot)", "    if err:", "        failed(err)",
                "    return", "give(slot)"]
        return kernel.packer.fused("launch", guard, tail, scope, pooled=True)

    def load(self, compiled) -> LoadedKernel:
        """Load the kernel's PTX once per device (keyed by compiled.cache_key)."""
        target = getattr(compiled, "target", "nvptx")
        if target != "nvptx":
            raise LaunchError(f"{compiled.name}(): compiled for target {target!r}; the cuda "
                              "device runs nvptx code")
        self.activate()
        ptx = compiled.ptx.encode() if isinstance(compiled.ptx, str) else compiled.ptx
        try:
            code = ObjectCode.from_ptx(ptx, name=compiled.name)
            func = function_of(code.get_kernel(compiled.entry).handle)
        except Exception as exc:
            log = jit_error_log(ptx)
            raise KernelRuntimeError(
                f"kernel '{compiled.name}' (entry {compiled.entry}, PTX for "
                f"{getattr(compiled, 'arch', '?')}): the CUDA driver could not load it on "
                f"{self}: {exc}" + (f"\nptxas log:\n{log}" if log else "")) from None
        limit = check(cu.cuFuncGetAttribute(_MAX_DYNAMIC_SHARED, func), "cuFuncGetAttribute")
        packer = ArgPacker(compiled, "cuda", self.ordinal, device=self)
        # one buffer through `extra` only where the driver confirms the packer's layout
        param_buffer = self.param_buffer and buffer_layout_ok(func, packer)
        kernel = LoadedKernel(compiled.name, func, packer, limit,
                               getattr(compiled, "shared_bytes", 0), code, param_buffer,
                               "pdl" in getattr(compiled, "uses", ()))
        kernel.cooperative = "grid_sync" in getattr(compiled, "uses", ())
        self._kernels[compiled.cache_key] = kernel
        self._prints = self._prints or "print" in getattr(compiled, "uses", ())
        return kernel

    def occupancy(self, compiled, threads: int, shared_bytes: int) -> tuple[int, int]:
        """(blocks of `compiled` resident per SM, SMs): runtime/occupancy.py."""
        kernel = self._kernels.get(compiled.cache_key) or self.load(compiled)
        self.activate()
        if shared_bytes > kernel.dynamic_shared_limit:
            self._raise_shared_limit(kernel, shared_bytes)
        return blocks_per_sm(self, kernel, threads, shared_bytes)

    def preload(self, compiled) -> None:
        """Load the kernel and finish the driver's lazy loading of it (its PTX JIT, 0.1-0.8 s)
        now rather than in its first launch: pk.precompile does this on a thread while its
        workers compile the next kernels."""
        kernel = self._kernels.get(compiled.cache_key) or self.load(compiled)
        self.activate()
        check(cu.cuFuncLoad(kernel.func), f"{kernel.name}: cuFuncLoad")

    def _raise_shared_limit(self, kernel, shared_bytes: int):
        """Opt in to > 48 KiB of dynamic shared memory, or explain why it cannot fit."""
        total = kernel.static_shared + shared_bytes
        if total > self.max_shared_optin:
            raise LaunchError(f"{kernel.name}(): needs {total} bytes of shared memory per block "
                              f"({kernel.static_shared} static + {shared_bytes} dynamic); "
                              f"{self} allows at most {self.max_shared_optin}")
        check(cu.cuFuncSetAttribute(kernel.func, _MAX_DYNAMIC_SHARED, shared_bytes),
              f"{kernel.name}: setting max dynamic shared memory to {shared_bytes}")
        kernel.dynamic_shared_limit = shared_bytes

    def _launch_failed(self, err, kernel, grid, block, shared_bytes, cluster=None):
        code = int(err)
        if code in KERNEL_FAULTS:  # reported by this call, caused by an earlier kernel
            self._recent.pop()
            raise self.fault_error(err, f"before launching '{kernel.name}'")
        where = (f"{kernel.name}[grid={tuple(grid)}, block={tuple(block)}, "
                 f"shared={shared_bytes}" + (f", cluster={tuple(cluster)}]" if cluster else "]"))
        if cluster and code == int(cu.CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE):
            raise LaunchError(f"{where}: this GPU cannot run clusters of that size with this "
                              f"kernel's threads, registers and shared memory per block")
        threads = block[0] * block[1] * block[2]
        max_threads = check(cu.cuFuncGetAttribute(_MAX_THREADS, kernel.func), "attribute")
        if threads > max_threads:
            registers = check(cu.cuFuncGetAttribute(_NUM_REGS, kernel.func), "attribute")
            raise LaunchError(f"{where}: {threads} threads per block, this kernel allows at "
                              f"most {max_threads} ({registers} registers per thread)")
        check_geometry(kernel.name, grid, block, shared_bytes)   # the device's own limits next
        if min(*grid, *block) <= 0 or any(g > m for g, m in zip(grid, self.max_grid)):
            raise LaunchError(f"{where}: grid and block extents must be >= 1 and the grid at "
                              f"most {self.max_grid}")
        raise CudaError(f"launching {where} failed: {error_text(err)}",
                        error_text(err).split(" ")[0])

    # -- synchronization and errors ---------------------------------------------------------
    def synchronize(self) -> None:
        """Wait for all work on this device; a failed kernel raises here, with its name."""
        self.activate()
        (err,) = cu.cuCtxSynchronize()
        if err:
            raise self.fault_error(err, "at synchronize")
        self._recent.clear()
        if self._prints:
            flush_c_stdio()

    def synchronize_stream(self, handle) -> None:
        (err,) = cu.cuStreamSynchronize(handle)
        if err:
            raise self.fault_error(err, "at stream synchronize")
        if self._prints:
            flush_c_stdio()

    def _synchronize_after(self, kernel, handle):
        (err,) = cu.cuStreamSynchronize(handle)
        if err:
            raise KernelRuntimeError(f"kernel '{kernel.name}' failed: {error_text(err)}"
                                     + LOST_CONTEXT * (int(err) in KERNEL_FAULTS))
        self._recent.clear()

    def fault_error(self, err, when: str) -> KernelRuntimeError:
        """The error for a kernel that failed asynchronously, naming the likely culprit."""
        return fault_error(err, when, list(self._recent))


register_device_kind("cuda", CudaDevice)
