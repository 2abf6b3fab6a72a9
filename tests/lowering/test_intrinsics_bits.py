"""Bit intrinsics (pk.popc clz brev ffs byte_perm funnel_shift_l/r) against Python models, on
the CPU target (and the GPU where there is one); their PTX instructions, assembled per arch."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, i32, i64, u32, u64

EDGES32 = [0, 1, 0x80000000, 0xFFFFFFFF, 0x7FFFFFFF, 0x00010000]
EDGES64 = [0, 1, 1 << 63, (1 << 64) - 1, 1 << 32, 0xFFFFFFFF]
M32, M64 = (1 << 32) - 1, (1 << 64) - 1


def brev_model(x, bits):
    return int(f"{x:0{bits}b}"[::-1], 2)


def byte_perm_model(x, y, s):
    both = (y << 32) | x
    return sum(((both >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k) for k in range(4))


@pk.kernel
def bits32(n: i32, x: Ptr[u32, "ro"], y: Ptr[u32, "ro"], s: Ptr[u32, "ro"], out: Ptr[u32]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[8 * i + 0] = u32(pk.popc(x[i]))
        out[8 * i + 1] = u32(pk.clz(x[i]))
        out[8 * i + 2] = pk.brev(x[i])
        out[8 * i + 3] = u32(pk.ffs(x[i]))
        out[8 * i + 4] = pk.byte_perm(x[i], y[i], s[i])
        out[8 * i + 5] = pk.funnel_shift_l(x[i], y[i], s[i])
        out[8 * i + 6] = pk.funnel_shift_r(x[i], y[i], s[i])
        signed = pk.bitcast(x[i], i32)       # the signed forms give the same bits
        out[8 * i + 7] = u32(pk.popc(signed) + 64 * pk.clz(signed) + 4096 * pk.ffs(signed))


@pk.kernel
def bits64(n: i32, x: Ptr[u64, "ro"], out: Ptr[u64]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[4 * i + 0] = u64(pk.popc(x[i]))
        out[4 * i + 1] = u64(pk.clz(x[i]))
        out[4 * i + 2] = pk.brev(x[i])
        signed = pk.bitcast(x[i], i64)
        out[4 * i + 3] = u64(pk.ffs(signed)) + u64(pk.brev(signed) == pk.bitcast(
            pk.brev(x[i]), i64)) * u64(1000)


def test_bits32_match_python(device, rng):
    n = 45                                  # two blocks of 32: the last lanes idle
    x = rng.integers(0, 1 << 32, n, dtype=np.uint64)
    x[:len(EDGES32)] = EDGES32
    x = x.astype(np.uint32)
    y = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    s = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    s[:4] = [0, 31, 32, 0x7777]
    out = pk.full((8 * n,), 0xDEADBEEF, np.uint32, device)
    bits32[2, 32](n, pk.to_device(x, device=device), pk.to_device(y, device=device),
                  pk.to_device(s, device=device), out)
    got = out.numpy().reshape(n, 8)
    for k, (xi, yi, si) in enumerate(zip(map(int, x), map(int, y), map(int, s))):
        both, sh = (yi << 32) | xi, si & 31
        ffs = (xi & -xi).bit_length()
        want = [bin(xi).count("1"), 32 - xi.bit_length(), brev_model(xi, 32), ffs,
                byte_perm_model(xi, yi, si), ((both << sh) >> 32) & M32, (both >> sh) & M32,
                bin(xi).count("1") + 64 * (32 - xi.bit_length()) + 4096 * ffs]
        assert got[k].tolist() == want, (k, hex(xi), hex(yi), hex(si))


def test_bits64_match_python(device, rng):
    n = 37
    x = rng.integers(0, 1 << 63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(
        0, 2, n, dtype=np.uint64)
    x[:len(EDGES64)] = EDGES64
    out = pk.full((4 * n,), 0xDEADBEEF, np.uint64, device)
    bits64[2, 32](n, pk.to_device(x, device=device), out)
    got = out.numpy().reshape(n, 4)
    for k, xi in enumerate(map(int, x)):
        want = [bin(xi).count("1"), 64 - xi.bit_length(), brev_model(xi, 64),
                (xi & -xi).bit_length() + 1000]
        assert got[k].tolist() == want, (k, hex(xi))


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_bits_ptx(arch, assemble):
    ptx32, ptx64 = bits32.ptx(arch), bits64.ptx(arch)
    for instr in ("popc.b32", "clz.b32", "brev.b32", "prmt.b32", "shf.l.wrap.b32",
                  "shf.r.wrap.b32"):
        assert instr in ptx32, instr
    for instr in ("popc.b64", "clz.b64", "brev.b64"):
        assert instr in ptx64, instr
    assemble(ptx32, arch)
    assemble(ptx64, arch)


def test_bits_reject_floats():
    @pk.kernel
    def bad(x: Ptr[pk.f32], out: Ptr[i32]):
        out[0] = pk.popc(x[0])
    with pytest.raises(pk.KernelSourceError, match=r"pk.popc takes i32 / u32 / i64 / u64"):
        bad.ptx("sm_90")
