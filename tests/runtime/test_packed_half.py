"""Packed f16x2 / bf16x2 pairs: construction, lanes (.x .y [0] [1]), + - *, pk.fma, min, max,
abs, negation, literals on both lanes, bitcasts to u32: bit-exact against the exactly rounded
per-lane references (half_oracle.py) on random bit patterns."""
import numpy as np
import pytest
from half_oracle import random_bits, reference, to_bits, to_float64

import pykernel as pk
from pykernel import Const, Ptr, i32, u32

N_OUT = 7


@pk.kernel
def pair_ops(P: Const[pk.dtype], a: Ptr["P"], b: Ptr["P"], c: Ptr["P"], out: Ptr[u32], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        p, q, r = a[i], b[i], c[i]
        out[0 * n + i] = pk.bitcast(p + q, u32)
        out[1 * n + i] = pk.bitcast(p - q, u32)
        out[2 * n + i] = pk.bitcast(p * q, u32)
        out[3 * n + i] = pk.bitcast(pk.fma(p, q, r), u32)
        out[4 * n + i] = pk.bitcast(max(p, q), u32)
        out[5 * n + i] = pk.bitcast(-abs(p) * 2.0, u32)
        swapped = P(p.y, p[0])                            # lanes exchanged
        out[6 * n + i] = pk.bitcast(swapped, u32)


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
def test_packed_pairs_bit_exact(device, rng, fmt):
    n = 517                                   # pairs; not a multiple of the block
    bits = [random_bits(rng, 2 * n, fmt) for _ in range(3)]   # lane x = even index
    words = [pk.to_device(v.view(np.uint32), device=device) for v in bits]
    out = pk.full(N_OUT * n, 0x7E017E01, np.uint32, device)  # NaN pairs: unwritten shows
    pair = pk.f16x2 if fmt == "f16" else pk.bf16x2
    pair_ops[(n + 127) // 128, 128](pair, *words, out, n)
    got = out.numpy().view(np.uint16).reshape(N_OUT, 2 * n)
    x, y, z = bits
    checks = {0: reference("add", fmt, x, y), 1: reference("sub", fmt, x, y),
              2: reference("mul", fmt, x, y), 3: reference("fma", fmt, x, y, z),
              5: reference("mul", fmt, (x | np.uint16(0x8000)), to_bits(np.full(2 * n, 2.0), fmt)),
              6: x.reshape(n, 2)[:, ::-1].reshape(-1)}
    for k, want in checks.items():
        g, w = to_float64(got[k], fmt), to_float64(want, fmt)
        same = (got[k] == want) | (np.isnan(g) & np.isnan(w))
        assert same.all(), (fmt, k, np.flatnonzero(~same)[:5], got[k][~same][:5], want[~same][:5])
    xf, yf = to_float64(x, fmt), to_float64(y, fmt)
    both_zero = (xf == 0) & (yf == 0)
    want_max = to_float64(to_bits(np.fmax(xf, yf), fmt), fmt)
    assert np.array_equal(np.where(both_zero, 0, to_float64(got[4], fmt)),
                          np.where(both_zero, 0, want_max), equal_nan=True)


@pk.kernel
def bad_pair_compare(a: Ptr[pk.f16x2], out: Ptr[i32]):
    out[0] = i32(a[0] < a[1])


@pk.kernel
def bad_pair_lanes(a: Ptr[pk.f16x2], out: Ptr[pk.f16x2], x: pk.f32):
    out[0] = pk.f16x2(x, x)


def test_packed_pair_errors():
    with pytest.raises(pk.KernelSourceError, match="compare lanes"):
        bad_pair_compare.ptx("sm_90")
    with pytest.raises(pk.KernelSourceError, match="f16x2 lanes are f16, got f32"):
        bad_pair_lanes.ptx("sm_90")
