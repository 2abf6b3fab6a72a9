"""The fp8 scalar types pk.e4m3 / pk.e5m2: loads through Ptr[e4m3] decoded by f32(v) / f16(v)
/ bf16(v), stores of e4m3(x), literals and cross-format conversions, bit-exact against the
host codecs (pykernel.fp8) on all 256 codes and on midpoints, saturation, NaN and random f32;
arithmetic and comparisons refused with a hint; the PTX assembles on every arch (sm_89+ with
the cvt instructions, older archs through the IR emulation)."""
import runpy

import numpy as np
import pytest
from test_fp8 import FORMATS, _probe_values

import pykernel as pk
from pykernel import Const, Ptr, bf16, f16, f32, fp8, i32, u16


@pk.kernel
def typed(T: Const[pk.dtype], U: Const[pk.dtype], codes: Ptr["T"], x: Ptr[f32],
          dec32: Ptr[f32], dec16: Ptr[f32], decbf: Ptr[u16], enc: Ptr["T"], cross: Ptr["U"],
          lit: Ptr["T"], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        c = codes[i]
        dec32[i] = f32(c)
        dec16[i] = f32(f16(c))
        decbf[i] = pk.bitcast(bf16(c), u16)
        enc[i] = T(x[i])
        cross[i] = U(c)               # the other format: decode, then encode
        lit[i] = -2.75                # a literal adapts: the host's code


def _run(fmt, x, codes):
    other = "e5m2" if fmt == "e4m3" else "e4m3"
    T, U = pk.e4m3 if fmt == "e4m3" else pk.e5m2, pk.e4m3 if other == "e4m3" else pk.e5m2
    n = x.size
    outs = [pk.full((n,), np.nan, np.float32), pk.full((n,), np.nan, np.float32),
            pk.full((n,), 0x5555, np.uint16)] + [pk.full((n,), 0x55, np.uint8) for _ in range(3)]
    typed[(n + 127) // 128, 128](T, U, pk.to_device(codes), pk.to_device(x), *outs, n)
    return other, [o.numpy() for o in outs]


@pytest.mark.parametrize("fmt", FORMATS)
def test_typed_loads_stores_match_host_codecs(device, fmt, rng):
    x = _probe_values(fmt, rng)
    codes = (np.arange(x.size) % 256).astype(np.uint8)    # every code, many times
    other, (dec32, dec16, decbf, enc, cross, lit) = _run(fmt, x, codes)
    want = fp8.decode(codes, fmt)
    np.testing.assert_array_equal(dec32.view(np.uint32), want.view(np.uint32))
    finite = ~np.isnan(want)        # f16 / bf16 hold every fp8 value (and inf) exactly
    np.testing.assert_array_equal(dec16[finite], want[finite])
    np.testing.assert_array_equal(
        decbf[finite], (want[finite].view(np.uint32) >> 16).astype(np.uint16))
    nan_bf = ((decbf[~finite] & 0x7F80) == 0x7F80) & ((decbf[~finite] & 0x7F) != 0)
    assert np.isnan(dec16[~finite]).all() and nan_bf.all()
    np.testing.assert_array_equal(enc, fp8.encode(x, fmt))
    np.testing.assert_array_equal(cross, fp8.encode(want, other))
    assert (lit == fp8.encode(np.float32(-2.75), fmt)).all()


def test_host_scalar_encodes():
    for t in (pk.e4m3, pk.e5m2):
        for v in (1.5, -0.3, 1e6, float("nan")):
            assert t(v) == fp8.encode(np.float32(v), t.name)
    assert pk.e4m3(1e6) == 0x7E and pk.e5m2(-1e6) == 0xFB      # satfinite: +-max


@pytest.mark.parametrize("expr, message", [
    ("a + b", "cannot add e4m3 values"), ("a < b", "e4m3 values do not compare"),
    ("-a", "cannot negate e4m3"), ("a * 2.0", "cannot multiply e4m3 values")])
def test_arithmetic_needs_explicit_promotion(expr, message, tmp_path):
    path = tmp_path / "fp8_bad.py"            # a real file: kernels are parsed from source
    path.write_text("import pykernel as pk\nfrom pykernel import Ptr, f32\n\n\n"
                    "def bad(p: Ptr[pk.e4m3], out: Ptr[f32]):\n    a = p[0]\n    b = p[1]\n"
                    f"    out[0] = f32({expr})\n")
    scope = runpy.run_path(str(path))
    with pytest.raises(pk.KernelSourceError, match=message) as info:
        pk.kernel(scope["bad"]).ptx("sm_90")
    assert "fp8_bad.py:8:" in str(info.value) and "f32(" in str(info.value)   # line + hint


@pytest.mark.parametrize("arch", list(pk.SUPPORTED_ARCHS) + ["sm_90a"])
def test_typed_conversions_assemble(arch, assemble):
    ptx = typed.ptx(arch, T=pk.e4m3, U=pk.e5m2)
    native = int(arch[3:5]) >= 89 or arch.startswith("sm_1")
    assert ("cvt.rn.satfinite.e5m2x2.f32" in ptx and "cvt.rn.f16x2.e4m3x2" in ptx) == native
    assemble(ptx, arch)


@pk.kernel
def through_arrays(x: pk.Array[pk.e4m3, 2], out: pk.Array[f32, 2]):
    tile = pk.shared_array(pk.e4m3, 64)
    reg = pk.local_array(pk.e4m3, 1)
    t = pk.thread_idx.x
    tile[t] = x[t // 8, t % 8]
    pk.syncthreads()
    reg[0] = tile[63 - t]
    out[t // 8, t % 8] = f32(reg[0]) if reg[0] else f32(-1.0)    # `if v`: v != 0


def test_fp8_in_nd_shared_and_local_arrays(device, rng):
    codes = rng.integers(0, 256, (8, 8), dtype=np.uint8)
    out = pk.full((8, 8), np.nan, np.float32)
    through_arrays[1, 64](pk.to_device(codes), out)
    want = fp8.decode(codes.reshape(-1)[::-1].reshape(8, 8), "e4m3")
    want = np.where(np.isnan(want) | (want != 0), want, -1.0).astype(np.float32)
    np.testing.assert_array_equal(out.numpy().view(np.uint32), want.view(np.uint32))
