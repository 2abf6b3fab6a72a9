"""Constant memory tables (`pk.const_array`) and the grid-wide barrier (`pk.grid_sync`): results
on the CPU target (and the GPU where one is usable), the PTX they map to (`ld.const`, a
`.const` table; `bar.sync` + `atom.global.add` on a grid counter), ptxas for every arch."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, bf16, f16, f32, i32, u8
from pykernel.targets.archs import SUPPORTED_ARCHS

SCALES = pk.const_array(np.random.default_rng(41).standard_normal(37).astype(np.float32))
HALVES = pk.const_array(np.linspace(-2, 2, 9), pk.f16)
BHALVES = pk.const_array([1.0, 1.00390625, -3.5, 65504.0], pk.bf16)
CODES = pk.const_array(np.arange(256, dtype=np.uint8)[::-1].copy())


@pk.kernel
def lookup(idx: Ptr[i32, "ro"], out: Ptr[f32], h: Ptr[f16], hb: Ptr[bf16], c: Ptr[u8],
           n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        k = idx[i]
        out[i] = SCALES[k % 37] * 2.0
        h[i] = HALVES[k % 9]
        hb[i] = BHALVES[k % 4]
        c[i] = CODES[k % 256]


def test_const_array_lookup(device, rng, seed):
    n = 301
    idx = rng.integers(0, 10**6, n).astype(np.int32)
    out = pk.full(n, np.nan, np.float32, device)
    h = pk.full(n, np.nan, np.float16, device)
    hb = pk.full(n, 0xFFFF, np.uint16, device)
    c = pk.full(n, 7, np.uint8, device)
    lookup[(n + 63) // 64, 64](pk.to_device(idx, device=device), out, h, hb, c, n)
    np.testing.assert_array_equal(out.numpy(), SCALES.values[idx % 37] * np.float32(2))
    np.testing.assert_array_equal(h.numpy(), np.linspace(-2, 2, 9).astype(np.float16)[idx % 9])
    want_bits = np.array([0x3F80, 0x3F80, 0xC060, 0x4780], np.uint16)   # RNE, 65504 -> 65536
    np.testing.assert_array_equal(hb.numpy(), want_bits[idx % 4])
    np.testing.assert_array_equal(c.numpy(), (255 - idx % 256).astype(np.uint8))


def test_const_array_ptx():
    ptx = lookup.ptx("sm_90")
    assert ".const .align 16 .b8 const_table" in ptx
    assert ptx.count("ld.const.") == 4, ptx


@pk.kernel(bounds_check=True)
def past_table(out: Ptr[f32], k: i32):
    out[0] = SCALES[k]


def test_const_array_bounds_checked_on_cpu():
    prev = pk.current_device()
    pk.set_device("cpu")
    try:
        out = pk.zeros(1, np.float32)
        past_table[1, 1](out, 36)
        assert out.numpy()[0] == SCALES.values[36]
        with pytest.raises(pk.KernelRuntimeError, match="out-of-bounds"):
            past_table[1, 1](out, 37)
    finally:
        pk.set_device(prev)


@pk.kernel
def store_into_table(k: i32):
    SCALES[k] = 1.0


def test_const_array_is_read_only_and_checked():
    with pytest.raises(pk.KernelSourceError, match="read-only"):
        store_into_table.ptx("sm_90")
    with pytest.raises(ValueError, match="1-D"):
        pk.const_array(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="at most 65536 bytes"):
        pk.const_array(np.zeros(16385, np.float32))
    with pytest.raises(TypeError, match="no pykernel scalar type"):
        pk.const_array(["a", "b"])


def test_const_array_contents_are_in_the_cache_key():
    from pykernel import cache
    from pykernel.lower.context import Options
    before = cache.kernel_key(lookup, "sm_90", {}, Options())
    original = SCALES.values
    try:
        SCALES.values = original + np.float32(1)
        assert cache.kernel_key(lookup, "sm_90", {}, Options()) != before
    finally:
        SCALES.values = original


@pk.kernel
def normalize(x: Ptr[f32, "ro"], partial: Ptr[f32], out: Ptr[f32], n: i32):
    """Each block sums its slice, the grid meets, every thread divides by the grand total;
    then a second round on the results (two barriers, reused counter)."""
    t, b = pk.thread_idx.x, pk.block_idx.x
    i = b * pk.block_dim.x + t
    for phase in range(2):
        if t == 0:
            s = f32(0.0)
            for k in range(pk.block_dim.x):
                j = b * pk.block_dim.x + k
                if j < n:
                    s += x[j] if phase == 0 else out[j]
            partial[2 * b + phase] = s
        pk.grid_sync()
        if i < n:
            total = f32(0.0)
            for k in range(pk.grid_dim.x):
                total += partial[2 * k + phase]
            out[i] = (x[i] if phase == 0 else out[i]) / total
        pk.grid_sync()


def test_grid_sync_two_rounds(device, rng):
    blocks, threads = 6, 96
    n = blocks * threads - 13
    x = rng.random(n).astype(np.float32) + np.float32(0.5)
    first = x / x.sum(dtype=np.float64)
    x_dev = pk.to_device(x, device=device)
    # three launches from one launcher: the later ones take the launcher's fast path on a
    # GPU, which must still launch cooperatively
    for _ in range(3):
        partial = pk.full(2 * blocks, np.nan, np.float32, device)
        out = pk.full(n, np.nan, np.float32, device)
        normalize[blocks, threads](x_dev, partial, out, n)
        # the tolerance: f32 sums of n terms in block order, relative error <= n * 2^-24 each
        np.testing.assert_allclose(out.numpy(), first / first.sum(), rtol=4 * n * 2.0**-24)


@pk.kernel
def grid_sync_after_return(out: Ptr[f32]):
    if pk.block_idx.x == 1:
        return
    pk.grid_sync()
    out[pk.block_idx.x] = 1.0


def test_grid_sync_not_reached_by_every_block_is_an_error_on_cpu():
    prev = pk.current_device()
    pk.set_device("cpu")
    try:
        with pytest.raises(pk.KernelRuntimeError, match="grid_sync"):
            grid_sync_after_return[3, 32](pk.zeros(3, np.float32))
        with pytest.raises(pk.LaunchError, match="clusters"):
            z = pk.zeros(64, np.float32)
            normalize[(2, 1, 1), 32, None, 0, (2, 1, 1)](z, z, z, 64)
    finally:
        pk.set_device(prev)


def test_grid_sync_ptx():
    ptx = normalize.ptx("sm_80")
    assert ".global .align 4 .u32 __pk_grid_barrier" in ptx
    assert "atom.global.add.u32" in ptx and ptx.count("bar.sync") >= 4
    assert ptx.count("membar.gl") >= 4


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_const_and_grid_assemble(arch, assemble):
    assemble(lookup.ptx(arch), arch)
    assemble(normalize.ptx(arch), arch)


@pytest.mark.gpu
def test_grid_sync_grid_too_large_for_residency_is_a_launch_error(device):
    if device.kind != "cuda":
        pytest.skip("co-residency is a GPU limit (the CPU target runs any grid)")
    blocks = 1 << 20                          # far more than any GPU holds at once
    z = pk.zeros(2 * blocks, np.float32, device)
    with pytest.raises(pk.LaunchError, match="resident at once"):
        normalize[blocks, 32](z, z, z, 1)
