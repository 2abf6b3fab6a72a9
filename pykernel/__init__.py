"""pykernel: GPU kernels in typed Python, lowered through LLVM's NVPTX backend to PTX, and run
on CUDA through cuda-python or on the CPU target.

    import pykernel as pk
    from pykernel import f32, i32, Ptr

    @pk.kernel
    def saxpy(n: i32, a: f32, x: Ptr[f32, "ro"], y: Ptr[f32]):
        i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
        if i < n:
            y[i] = a * x[i] + y[i]
"""
from . import cache as _cache  # noqa: F401  (light; keeps warm kernel loads fast)
from .errors import KernelRuntimeError, KernelSourceError, LaunchError, UnsupportedArchError
from .kernel import DeviceFunction, Kernel, func, kernel
from .lower.context import Options
from .targets import SUPPORTED_ARCHS
from .types import (Const, Ptr, ReadOnly, TensorMap, bf16, bool_, dtype, f16, f32, f64, i8, i16, i32, i64,
                    u8, u16, u32, u64)
from .intrinsics.thread import (all_sync, any_sync, ballot, block_dim, block_idx, grid_dim,
                                grid_dependency_wait, launch_dependents,
                                lane_id, shfl_down, shfl_idx, shfl_up, shfl_xor, syncthreads,
                                thread_idx, threadfence, warp_size)
from .intrinsics.core import (atomic_add, atomic_cas, atomic_exch, atomic_max, atomic_min,
                              bitcast, dynamic_shared, load_vec, local_array, pack_f16x2,
                              prefetch_l2,
                              shared_array, static_range, store_vec, unpack_f16x2)

__version__ = "0.1.0"

inf = float("inf")       # usable inside kernels as compile-time constants: pk.inf, -pk.inf
nan = float("nan")

from .intrinsics.mathfns import (ceil, cos, erf, exp, exp2, fast, floor, fma, log, log2, rint,
                                 rsqrt, sin, sqrt, tanh, trunc)
from .intrinsics.async_copy import cp_async, cp_async_commit, cp_async_wait, syncwarp
from .intrinsics.bulk_copy import (bulk_copy, bulk_prefetch_l2, fence_mbarrier_init,
                                   fence_proxy_async, mbarrier_arrive, mbarrier_arrive_expect_tx,
                                   mbarrier_expect_tx, mbarrier_init, mbarrier_wait)
from .intrinsics.ldmatrix import ldmatrix
from .intrinsics.packed import add_f16x2, mul_f16x2, prmt, sub_f16x2
from .intrinsics.bits import (brev, byte_perm, clz, ffs, funnel_shift_l, funnel_shift_r,
                               popc)
from .intrinsics.collectives import (activemask, match_all, match_any, redux_sync,
                                    syncthreads_and, syncthreads_count, syncthreads_or)
from .intrinsics.timing import clock64, globaltimer, nanosleep
from .intrinsics.cluster import cluster_map, cluster_rank, cluster_size, cluster_sync
from .intrinsics.constmem import const_array
from .intrinsics.grid import grid_sync
from .intrinsics.memorder import (fence, load_acquire, load_relaxed, store_relaxed,
                                  store_release)
from .types import bf16x2, e4m3, e5m2, f16x2
from .intrinsics.lowlevel import (asm, dp4a, mma_m16n8k16_bf16, mma_m16n8k16_f16,
                                  mma_m16n8k16_s8, mma_m16n8k32_s8, mma_m16n8k128_b1,
                                  movmatrix)
from .intrinsics.wgmma import (entry_registers, setmaxnreg_dec, setmaxnreg_inc, wgmma,
                               wgmma_commit_group, wgmma_desc, wgmma_fence, wgmma_wait_group)
from .intrinsics.fp8 import fp8_decode, fp8_encode
from .intrinsics.tma import (bulk_commit_group, bulk_wait_group, bulk_wait_group_read,
                             prefetch_tensormap, tma_load, tma_store)
from .runtime.tensor_map import tensor_map
from .compile_pool import precompile
from .autotuner import AutotuneError, autotune
from .elementwise_kernels import elementwise
from .reduction_kernels import reduction
from .rng import philox4x32, rand, randint, randint4x, randn
from .runtime import (Array, Event, Graph, Stream, capture_graph, current_device, empty, full,
                      get_device, gpu_available, pinned_empty, programmatic_launches, set_device,
                      synchronize, to_device, zeros)


def compile(kernel_obj, arch: str = "sm_90", **spec):
    """Compile one specialization: returns an object with .ptx, .entry, .params, .shared_bytes."""
    return kernel_obj.compile(arch, **spec)
