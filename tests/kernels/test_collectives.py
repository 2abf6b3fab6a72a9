"""stdlib_kernels.collectives inside small test kernels vs numpy: warp / block reduce and scan,
block histogram, bitonic block sort, 16-byte load / store helpers; awkward block sizes and
lengths (partial tiles), negative values, ties. Their PTX assembles for sm_80 and sm_90."""
import typing

import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32
from stdlib_kernels import collectives as C

T = typing.TypeVar("T")
OPS = {C.SUM: np.sum, C.MAX: np.max, C.MIN: np.min}
NAMES = {C.SUM: "sum", C.MAX: "max", C.MIN: "min"}


def init_of(op, dtype):
    """The identity a thread's partial starts from."""
    if op == C.SUM:
        return dtype(0)
    big = np.inf if dtype == np.float32 else np.iinfo(dtype).max
    return dtype(-big if op == C.MAX else big)


def random_values(rng, dtype, size):
    if dtype == np.float32:
        return (rng.standard_normal(size) * 10).astype(np.float32)
    return rng.integers(-1000, 1000, size).astype(dtype)


def poisoned(shape, dtype):
    return pk.full(shape, np.nan if dtype == np.float32 else -12345, dtype)


def check_close(got, ref, seed, what, scale=None):
    if got.dtype == np.float32:
        tol = 1e-5 * (np.abs(ref) if scale is None else scale) + 1e-5
        with np.errstate(invalid="ignore"):               # inf - inf where both are inf
            bad = ~(np.abs(got - ref) <= tol) & ~(got == ref)
        assert not bad.any(), f"seed={seed} {what}: {got[bad][:5]} vs {ref[bad][:5]}"
    else:
        assert np.array_equal(got, ref), f"seed={seed} {what}: {got} vs {ref}"


# ---- reductions -------------------------------------------------------------------------

@pk.kernel
def warp_reduce_kernel(x: Ptr[T, "ro"], out: Ptr[T], OP: Const[int]):
    t = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    out[t] = C.warp_reduce(x[t], OP)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("op", [C.SUM, C.MAX, C.MIN])
def test_warp_reduce(device, rng, seed, op, dtype):
    x = random_values(rng, dtype, 2 * 96)              # 2 blocks of 3 warps
    out = poisoned(x.shape, dtype)
    warp_reduce_kernel[2, 96](pk.to_device(x), out, op)
    ref = np.repeat(OPS[op](x.reshape(-1, 32).astype(np.float64), axis=1), 32)
    check_close(out.numpy(), ref.astype(dtype), seed, f"warp {NAMES[op]}")


@pk.kernel
def block_reduce_kernel(x: Ptr[T, "ro"], out: Ptr[T], out2: Ptr[T], n: i32, init: T,
                        OP: Const[int], OP2: Const[int], BLOCK: Const[int]):
    """Row reduction, one block per row; then OP2 over the threads' partials with the same
    scratch (back-to-back calls). Every thread writes its results: all must hold them."""
    scratch = pk.shared_array(T, 32)
    row = pk.block_idx.x
    t = pk.thread_idx.x
    acc = init
    for i in range(t, n, BLOCK):
        acc = C.combine(acc, x[row * n + i], OP)
    out[row * BLOCK + t] = C.block_reduce(acc, scratch, OP, BLOCK)
    out2[row * BLOCK + t] = C.block_reduce(acc, scratch, OP2, BLOCK)


def reduce_reference(x, op, op2, block, init):
    """(rows,) results of OP and OP2 over the per-thread partials, in float64 / int64."""
    rows, n = x.shape
    wide = np.float64 if x.dtype == np.float32 else np.int64
    pad = np.full((rows, -(-n // block) * block), init, wide)
    pad[:, :n] = x
    partials = OPS[op](pad.reshape(rows, -1, block), axis=1)
    return OPS[op](partials, axis=1), OPS[op2](partials, axis=1), np.abs(partials).sum(1)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("op,op2", [(C.SUM, C.MAX), (C.MAX, C.SUM), (C.MIN, C.SUM)])
@pytest.mark.parametrize("block,n", [(32, 45), (64, 1), (96, 1000), (256, 200), (1024, 3001)])
def test_block_reduce(device, rng, seed, op, op2, dtype, block, n):
    rows = 3
    x = random_values(rng, dtype, (rows, n))
    init = init_of(op, dtype)
    out, out2 = poisoned((rows, block), dtype), poisoned((rows, block), dtype)
    block_reduce_kernel[rows, block](pk.to_device(x), out, out2, n, init, op, op2, block)
    ref, ref2, scale = reduce_reference(x, op, op2, block, init)
    what = f"block {NAMES[op]} then {NAMES[op2]} ({block} threads, n={n})"
    with np.errstate(over="ignore", invalid="ignore"):
        ref, ref2 = ref.astype(dtype), ref2.astype(dtype)
    check_close(out.numpy(), np.repeat(ref[:, None], block, 1), seed, what,
                scale[:, None] if op == C.SUM else None)
    check_close(out2.numpy(), np.repeat(ref2[:, None], block, 1), seed, what,
                scale[:, None] if op2 == C.SUM else None)
