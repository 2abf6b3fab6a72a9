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
def group_reduce_kernel(x: Ptr[T, "ro"], out: Ptr[T], OP: Const[int], WIDTH: Const[int]):
    t = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    out[t] = C.group_reduce(x[t], OP, WIDTH)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("op", [C.SUM, C.MAX, C.MIN])
@pytest.mark.parametrize("width", [1, 4, 16])
def test_group_reduce(device, rng, seed, op, dtype, width):
    """Each aligned set of WIDTH lanes gets its own result, none leaks into a neighbour."""
    x = random_values(rng, dtype, 2 * 64)
    out = poisoned(x.shape, dtype)
    group_reduce_kernel[2, 64](pk.to_device(x), out, op, width)
    groups = x.reshape(-1, width).astype(np.float64)
    ref = np.repeat(OPS[op](groups, axis=1), width)
    check_close(out.numpy(), ref.astype(dtype), seed, f"group {NAMES[op]} width={width}",
                np.repeat(np.abs(groups).sum(1), width) if op == C.SUM else None)


@pytest.mark.parametrize("width", [2, 8, 32])
def test_group_reduce_shuffles_log2_width(width):
    ptx = group_reduce_kernel.ptx("sm_90", T=np.float32, OP=C.MAX, WIDTH=width)
    assert ptx.count("shfl.sync.bfly.b32") == width.bit_length() - 1, ptx


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


# ---- scans ------------------------------------------------------------------------------

@pk.kernel
def warp_scan_kernel(x: Ptr[T, "ro"], out: Ptr[T], INCLUSIVE: Const[bool]):
    t = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    out[t] = C.warp_scan(x[t], INCLUSIVE)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("inclusive", [True, False])
def test_warp_scan(device, rng, seed, inclusive, dtype):
    x = random_values(rng, dtype, 3 * 64)
    out = poisoned(x.shape, dtype)
    warp_scan_kernel[3, 64](pk.to_device(x), out, inclusive)
    wide = x.reshape(-1, 32).astype(np.float64 if dtype == np.float32 else np.int64)
    ref = np.cumsum(wide, axis=1) - (0 if inclusive else wide)
    scale = np.cumsum(np.abs(wide), axis=1)
    check_close(out.numpy().reshape(-1, 32), ref.astype(dtype), seed,
                f"warp scan inclusive={inclusive}", scale)


@pk.kernel
def block_scan_kernel(x: Ptr[T, "ro"], out: Ptr[T], totals: Ptr[T], n: i32,
                      INCLUSIVE: Const[bool], BLOCK: Const[int]):
    """One block scans the whole array tile by tile, carrying the running total."""
    scratch = pk.shared_array(T, 32)
    t = pk.thread_idx.x
    carry: T = 0
    for base in range(0, n, BLOCK):
        v = x[base + t] if base + t < n else 0
        s, total = C.block_scan(v, scratch, INCLUSIVE, BLOCK)
        if base + t < n:
            out[base + t] = s + carry
        if t == BLOCK - 1:
            totals[base // BLOCK] = total
        carry += total


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("inclusive", [True, False])
@pytest.mark.parametrize("block,n", [(32, 45), (64, 64), (96, 1000), (256, 257), (1024, 3001)])
def test_block_scan(device, rng, seed, inclusive, dtype, block, n):
    x = random_values(rng, dtype, n)
    tiles = -(-n // block)
    out, totals = poisoned(n, dtype), poisoned(tiles, dtype)
    block_scan_kernel[1, block](pk.to_device(x), out, totals, n, inclusive, block)
    wide = x.astype(np.float64 if dtype == np.float32 else np.int64)
    ref = np.cumsum(wide) - (0 if inclusive else wide)
    what = f"block scan inclusive={inclusive} ({block} threads, n={n})"
    check_close(out.numpy(), ref.astype(dtype), seed, what, np.cumsum(np.abs(wide)))
    pad = np.zeros(tiles * block)
    pad[:n] = wide
    tile_sums = pad.reshape(tiles, block).sum(1)
    check_close(totals.numpy(), tile_sums.astype(dtype), seed, what + " totals",
                np.abs(pad).reshape(tiles, block).sum(1))


# ---- histogram --------------------------------------------------------------------------

@pk.kernel
def histogram_kernel(ids: Ptr[i32, "ro"], per_block: Ptr[i32], total: Ptr[i32], n: i32,
                     BINS: Const[int], BLOCK: Const[int], ITEMS: Const[int]):
    """Block b counts items b * BLOCK * ITEMS ..: its first item per thread with
    block_histogram (written to per_block), then all its items added into `total`."""
    bins = pk.shared_array(i32, BINS)
    t = pk.thread_idx.x
    first = pk.block_idx.x * BLOCK * ITEMS
    C.block_histogram(bins, ids[first + t] if first + t < n else -1, BINS, BLOCK)
    for b in range(t, BINS, BLOCK):
        per_block[pk.block_idx.x * BINS + b] = bins[b]
    pk.syncthreads()
    C.histogram_clear(bins, BINS, BLOCK)
    for k in pk.static_range(ITEMS):
        i = first + k * BLOCK + t
        if i < n:
            C.histogram_count(bins, ids[i], BINS)
    pk.syncthreads()
    C.histogram_flush(bins, total, BINS, BLOCK)


@pytest.mark.parametrize("bins,block,items,n", [(7, 64, 1, 100), (100, 96, 3, 1000),
                                                (256, 256, 4, 5000), (1000, 128, 2, 777)])
def test_block_histogram(device, rng, seed, bins, block, items, n):
    ids = rng.integers(-3, bins + 3, n).astype(np.int32)   # some out of range: not counted
    ids[: n // 4] = bins // 2                               # a hot bin: contended atomics
    rng.shuffle(ids)
    grid = -(-n // (block * items))
    per_block = poisoned((grid, bins), np.int32)
    total = pk.to_device(np.zeros(bins, np.int32))
    histogram_kernel[grid, block](pk.to_device(ids), per_block, total, n, bins, block, items)

    def hist(v):
        return np.bincount(v[(v >= 0) & (v < bins)], minlength=bins)

    firsts = [ids[g * block * items: g * block * items + block] for g in range(grid)]
    ref = np.stack([hist(f) for f in firsts])
    assert np.array_equal(per_block.numpy(), ref), f"seed={seed} block_histogram"
    assert np.array_equal(total.numpy(), hist(ids)), f"seed={seed} histogram_flush"


# ---- sort -------------------------------------------------------------------------------

@pk.kernel
def sort_kernel(keys: Ptr[T, "ro"], out: Ptr[T], idx: Ptr[i32], n: i32, pad: T,
                PAIRS: Const[bool], N: Const[int], BLOCK: Const[int]):
    """Sort n <= N keys in one block (padded with `pad`), write the first n; idx gets each
    sorted key's original index (PAIRS) or stays untouched."""
    k = pk.shared_array(T, N)
    v = pk.shared_array(i32, N)
    t = pk.thread_idx.x
    for i in range(t, N, BLOCK):
        k[i] = keys[i] if i < n else pad
        v[i] = i
    pk.syncthreads()
    if PAIRS:
        C.block_sort_pairs(k, v, N, BLOCK)
    else:
        C.block_sort(k, N, BLOCK)
    for i in range(t, n, BLOCK):
        out[i] = k[i]
        if PAIRS:
            idx[i] = v[i]


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("block,N,n", [(32, 32, 32), (64, 128, 100), (96, 128, 70),
                                       (256, 1024, 1000), (1024, 2048, 2048), (64, 2, 1)])
def test_block_sort(device, rng, seed, pairs, dtype, block, N, n):
    keys = rng.integers(-20, 20, n).astype(dtype)           # many ties, negatives
    if dtype == np.float32:
        keys += rng.integers(0, 4, n).astype(np.float32) * 0.25
    pad = np.float32(np.inf) if dtype == np.float32 else np.int32(np.iinfo(np.int32).max)
    out, idx = poisoned(n, dtype), pk.full(n, -1, np.int32)
    sort_kernel[1, block](pk.to_device(keys), out, idx, n, pad, pairs, N, block)
    got = out.numpy()
    what = f"sort of {n} keys in {N} slots, {block} threads"
    assert np.array_equal(got, np.sort(keys)), f"seed={seed} {what}: {got}"
    if pairs:
        perm = idx.numpy()
        assert np.array_equal(np.sort(perm), np.arange(n)), f"seed={seed} {what}: permutation"
        assert np.array_equal(keys[perm], got), f"seed={seed} {what}: values did not follow"


# ---- 16-byte loads and stores -----------------------------------------------------------

@pk.kernel
def scale_rows(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32, alpha: f32, BLOCK: Const[int],
               VEC: Const[bool]):
    """out = alpha * x, one block per row, 4 elements per thread per step."""
    src = x + pk.block_idx.x * n
    dst = out + pk.block_idx.x * n
    for i in range(pk.thread_idx.x * 4, n, BLOCK * 4):
        a, b, c, d = C.load4(src, i, n, f32(0.0), VEC)
        C.store4(dst, i, n, a * alpha, b * alpha, c * alpha, d * alpha, VEC)


@pytest.mark.parametrize("n,vec", [(1, False), (3, False), (4, True), (45, False),
                                   (64, True), (1001, False), (1000, True), (1000, False)])
def test_load4_store4(device, rng, seed, n, vec):
    x = rng.standard_normal((5, n)).astype(np.float32)
    out = poisoned(x.shape, np.float32)
    scale_rows[5, 64](pk.to_device(x), out, n, np.float32(-1.5), 64, vec)
    assert np.array_equal(out.numpy(), x * np.float32(-1.5)), f"seed={seed} n={n} vec={vec}"


@pk.kernel
def tail_fill(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32):
    """Each thread's four values with the fill past n, stored unguarded (n_out = 4 * block)."""
    i = pk.thread_idx.x * 4
    a, b, c, d = C.load4(x, i, n, -pk.inf, True)
    pk.store_vec(out, i, (a, b, c, d))


def test_load4_fills_past_n(device, rng, seed):
    x = rng.standard_normal(64).astype(np.float32)
    out = poisoned(64, np.float32)
    tail_fill[1, 16](pk.to_device(x), out, 47)
    ref = np.concatenate([x[:47], np.full(17, -np.inf, np.float32)])
    assert np.array_equal(out.numpy(), ref), f"seed={seed}"


# ---- PTX: each collective in a kernel that ptxas accepts --------------------------------

PTX_CASES = {
    "warp_reduce": (warp_reduce_kernel, {"T": np.float32, "OP": C.MAX}, ["shfl.sync.bfly.b32"]),
    "block_reduce": (block_reduce_kernel,
                     {"T": np.float32, "OP": C.SUM, "OP2": C.MAX, "BLOCK": 256},
                     ["shfl.sync.bfly.b32", "shfl.sync.down.b32", "shfl.sync.idx.b32",
                      "bar.sync", "st.shared"]),
    "group_reduce": (group_reduce_kernel, {"T": np.float32, "OP": C.SUM, "WIDTH": 8},
                     ["shfl.sync.bfly.b32"]),
    "warp_scan": (warp_scan_kernel, {"T": np.int32, "INCLUSIVE": False}, ["shfl.sync.up.b32"]),
    "block_scan": (block_scan_kernel, {"T": np.float32, "INCLUSIVE": True, "BLOCK": 96},
                   ["shfl.sync.up.b32", "shfl.sync.idx.b32", "bar.sync", "ld.shared"]),
    "histogram": (histogram_kernel, {"BINS": 100, "BLOCK": 128, "ITEMS": 2},
                  ["atom.shared.add", "atom.global.add"]),
    "sort": (sort_kernel, {"T": np.float32, "PAIRS": True, "N": 512, "BLOCK": 128},
             ["bar.sync", "ld.shared"]),
    "load4_store4": (scale_rows, {"BLOCK": 64, "VEC": True},
                     ["ld.global.nc.v4.b32", "st.global.v4.b32"]),
}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(PTX_CASES))
def test_collective_ptx_assembles(name, arch, assemble):
    kernel, consts, instructions = PTX_CASES[name]
    ptx = kernel.ptx(arch, **consts)
    for instr in instructions:
        assert instr in ptx, f"{name}: {instr} missing"
    assemble(ptx, arch)
