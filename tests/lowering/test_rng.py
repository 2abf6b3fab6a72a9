"""pk.philox4x32 / randint4x / randint / rand / randn: Random123's known-answer vectors bit for
bit, a pure-Python Philox reference on random counters and keys, the uniform and normal
transforms' ranges and moments, on the CPU target and on CUDA; the PTX assembles for every
arch and uses the wide multiply."""
import math

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, i32, u32

MASK = 0xFFFFFFFF
# Random123's kat_vectors, "philox4x32 10": counter, key -> output
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((MASK,) * 4, (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


def philox_reference(c, k):
    """Philox4x32-10 in Python integers (the paper's round function, written independently of
    the kernel code)."""
    c, k = list(c), list(k)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & MASK, (k[1] + 0xBB67AE85) & MASK]
        hi_lo0, hi_lo1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(hi_lo1 >> 32) ^ c[1] ^ k[0], hi_lo1 & MASK, (hi_lo0 >> 32) ^ c[3] ^ k[1],
             hi_lo0 & MASK]
    return tuple(c)


@pk.kernel
def philox_rows(inp: Ptr[u32, "ro"], out: Ptr[u32], n: i32):
    """Row i of inp: counter (4 words), key (2 words) -> out row i (4 words)."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        a = inp + i * 6
        r0, r1, r2, r3 = pk.philox4x32(a[0], a[1], a[2], a[3], a[4], a[5])
        out[i * 4] = r0
        out[i * 4 + 1] = r1
        out[i * 4 + 2] = r2
        out[i * 4 + 3] = r3


@pk.kernel
def draws(seed: i32, first: i32, n: i32, ints: Ptr[u32], uni: Ptr[pk.f32], nor: Ptr[pk.f32]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        ints[i] = pk.randint(seed, first + i)
        uni[i] = pk.rand(seed, first + i)
        nor[i] = pk.randn(seed, first + i)


def test_philox_matches_random123_and_the_reference(device, rng, seed):
    rows = [c + k for c, k, _ in KAT]
    rows += [tuple(int(v) for v in rng.integers(0, 1 << 32, 6, dtype=np.uint64))
             for _ in range(200)]
    inp = np.array(rows, np.uint32)
    out = pk.full(len(rows) * 4, 0xDEADBEEF, np.uint32)
    philox_rows[(len(rows) + 63) // 64, 64](pk.to_device(inp), out, len(rows))
    got = out.numpy().reshape(-1, 4)
    for i, (c, k, want) in enumerate(KAT):
        assert tuple(int(v) for v in got[i]) == want, f"KAT {i}: {[hex(v) for v in got[i]]}"
    for row, g in zip(rows[len(KAT):], got[len(KAT):]):
        assert tuple(int(v) for v in g) == philox_reference(row[:4], row[4:]), \
            f"counter/key {[hex(v) for v in row]} (seed {seed})"


def test_rand_randn_randint(device, rng, seed):
    n, key, first = 1 << 16, int(rng.integers(0, 1 << 31)), int(rng.integers(0, 1 << 30))
    ints, uni, nor = (pk.full(n, np.nan if dt == np.float32 else 7, dt)
                      for dt in (np.uint32, np.float32, np.float32))
    draws[n // 256, 256](key, first, n, ints, uni, nor)
    ints, uni, nor = ints.numpy(), uni.numpy(), nor.numpy()
    for j in (0, 1, n - 1):       # randint is word 0 of counter (offset, 0, 0, 0), key (seed, 0)
        assert int(ints[j]) == philox_reference((first + j, 0, 0, 0), (key, 0))[0], seed
    np.testing.assert_array_equal(uni, (ints >> 8).astype(np.float32) / np.float32(1 << 24))
    assert uni.min() >= 0.0 and uni.max() < 1.0
    # moments of n draws: mean within ~5 standard errors
    assert abs(uni.mean() - 0.5) < 5 * math.sqrt(1 / 12 / n), (uni.mean(), seed)
    assert np.isfinite(nor).all()
    assert abs(nor.mean()) < 5 / math.sqrt(n) and abs(nor.var() - 1) < 5 * math.sqrt(2 / n), \
        (nor.mean(), nor.var(), seed)
    assert abs(np.mean(np.abs(nor) < 1.0) - 0.6827) < 0.01, seed
    # another seed gives another stream; the same seed the same stream
    again = pk.full(n, 0, np.uint32)
    other = pk.full(n, 0, np.uint32)
    scratch = pk.empty(n, np.float32)
    draws[n // 256, 256](key, first, n, again, scratch, scratch)
    draws[n // 256, 256](key + 1, first, n, other, scratch, scratch)
    assert np.array_equal(again.numpy(), ints)
    assert np.mean(other.numpy() == ints) < 0.001


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_rng_ptx_assembles(arch, assemble):
    ptx = draws.ptx(arch)
    assert "mul.wide.u32" in ptx or "mul.hi.u32" in ptx, "Philox's 32 x 32 -> 64 multiplies"
    assemble(ptx, arch)
