"""fp8 (e4m3, e5m2) conversions: the host codecs against a table built from first principles
(every code's value), the kernels' pk.fp8_encode / pk.fp8_decode against the host codecs on
all 256 codes, midpoints (ties to even), saturation, NaN and random f32 values."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, fp8, i32, u8

FORMATS = ["e4m3", "e5m2"]


def _table(fmt):
    """Every code's value, written out from the format's definition."""
    ebits, mbits, bias, _ = fp8.FORMATS[fmt]
    out = []
    for code in range(256):
        s, e, m = code >> 7, (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
        if fmt == "e4m3" and e == 15 and m == 7 or fmt == "e5m2" and e == 31 and m:
            v = float("nan")
        elif fmt == "e5m2" and e == 31:
            v = float("inf")
        elif e == 0:
            v = m * 2.0 ** (1 - bias - mbits)
        else:
            v = (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
        out.append(-v if s else v)
    table = np.array(out, np.float32)
    # the hardware's NaN (sm_89+ cvt, measured on an H200): 0x7FFFFFFF whatever the sign
    table.view(np.uint32)[np.isnan(table)] = 0x7FFFFFFF
    return table


def _probe_values(fmt, rng):
    """Every finite code's value, the midpoints between neighbours, beyond the max, NaN/inf,
    and random f32 across the range."""
    vals = _table(fmt)
    finite = np.sort(np.unique(vals[np.isfinite(vals)]))
    mids = (finite[:-1].astype(np.float64) + finite[1:]) / 2
    extra = [np.inf, -np.inf, np.nan, 1e9, -1e9, fp8.FORMATS[fmt][3] * 1.06, 1e-30, -0.0]
    rand = rng.standard_normal(2000) * np.exp2(rng.integers(-20, 18, 2000))
    return np.concatenate([finite, mids, extra, rand]).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
def test_host_codecs(fmt, rng):
    want = _table(fmt)
    got = fp8.decode(np.arange(256, dtype=np.uint8), fmt)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    finite = np.isfinite(want)
    codes = np.arange(256)[finite]
    np.testing.assert_array_equal(fp8.encode(want[finite], fmt), codes)   # round trip
    x = _probe_values(fmt, rng)
    enc = fp8.decode(fp8.encode(x, fmt), fmt).astype(np.float64)
    # nearest: no finite code is closer than the chosen one (within the saturated range)
    top = fp8.FORMATS[fmt][3]
    ok = np.isfinite(x)
    clipped = np.clip(x[ok].astype(np.float64), -top, top)
    grid = np.sort(want[finite].astype(np.float64))
    best = np.min(np.abs(grid[None, :] - clipped[:, None]), axis=1)
    np.testing.assert_array_equal(np.abs(enc[ok] - clipped), best)


@pk.kernel
def convert(x: Ptr[f32], codes: Ptr[u8], enc: Ptr[u8], dec: Ptr[f32], n: i32,
            fmt: Const[str]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        enc[i] = pk.fp8_encode(x[i], fmt)
        dec[i] = pk.fp8_decode(codes[i], fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_conversions_match_host(device, fmt, rng):
    x = _probe_values(fmt, rng)
    n = x.size
    codes = (np.arange(n) % 256).astype(np.uint8)
    enc = pk.full((n,), 0x55, np.uint8)
    dec = pk.full((n,), np.nan, np.float32)
    convert[(n + 127) // 128, 128](pk.to_device(x), pk.to_device(codes), enc, dec, n, fmt)
    np.testing.assert_array_equal(enc.numpy(), fp8.encode(x, fmt))
    np.testing.assert_array_equal(dec.numpy().view(np.uint32),
                                  fp8.decode(codes, fmt).view(np.uint32))


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_conversions_assemble(arch, assemble):
    ptx = convert.ptx(arch, fmt="e4m3")
    if int(arch[3:]) >= 89:
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx and "cvt.rn.f16x2.e4m3x2" in ptx
    assemble(ptx, arch)
