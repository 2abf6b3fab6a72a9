"""f64 math: what works on both targets (sqrt, rsqrt, floor, ceil, trunc, rint, fma and
pk.fast.sqrt / rsqrt, computed in f64: never demoted to f32) against numpy, its PTX per arch,
and the compile error the transcendental functions give for f64 on every target."""
from fractions import Fraction

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f64, i32


@pk.kernel
def math64(n: i32, x: Ptr[f64, "ro"], y: Ptr[f64, "ro"], out: Ptr[f64]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        a = x[i]
        out[8 * i + 0] = pk.sqrt(a)
        out[8 * i + 1] = pk.rsqrt(a)
        out[8 * i + 2] = pk.floor(y[i])
        out[8 * i + 3] = pk.ceil(y[i])
        out[8 * i + 4] = pk.trunc(y[i])
        out[8 * i + 5] = pk.rint(y[i])
        out[8 * i + 6] = pk.fma(a, y[i], f64(1.0) / f64(3.0))
        out[8 * i + 7] = pk.fast.sqrt(a) + pk.fast.rsqrt(a)


def test_f64_math_matches_numpy(device, rng):
    n = 77
    x = rng.random(n) * 10.0 ** rng.integers(-30, 30, n)
    y = rng.normal(0, 100, n)
    y[:4] = [2.5, -2.5, 0.5, -0.0]
    out = pk.full((8 * n,), np.nan, np.float64, device)
    math64[2, 64](n, pk.to_device(x, device=device), pk.to_device(y, device=device), out)
    got = out.numpy().reshape(n, 8)
    np.testing.assert_array_equal(got[:, 0], np.sqrt(x))
    np.testing.assert_allclose(got[:, 1], 1.0 / np.sqrt(x), rtol=2.3e-16)
    for k, fn in enumerate((np.floor, np.ceil, np.trunc, np.rint), start=2):
        np.testing.assert_array_equal(got[:, k], fn(y))
    # fma rounds once: the exact a * b + 1/3 in rationals, rounded to nearest by float()
    # (a long double reference rounds twice and is 1 ulp off for some inputs, e.g. seed
    # 433807662's first element)
    third = Fraction(1.0 / 3.0)
    exact = [float(Fraction(a) * Fraction(b) + third) for a, b in zip(x, y)]
    np.testing.assert_array_equal(got[:, 6], exact)
    np.testing.assert_allclose(got[:, 7], np.sqrt(x) + 1.0 / np.sqrt(x), rtol=4.5e-16)


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_f64_math_ptx(arch, assemble):
    ptx = math64.ptx(arch)
    for instr in ("sqrt.rn.f64", "rcp.rn.f64", "cvt.rmi.f64.f64", "cvt.rpi.f64.f64",
                  "cvt.rzi.f64.f64", "cvt.rni.f64.f64", "fma.rn.f64"):
        assert instr in ptx, instr
    assert ".approx" not in ptx          # the f64 fast forms are not demoted to f32
    assemble(ptx, arch)


@pk.kernel
def exp64(x: Ptr[f64]):
    x[0] = pk.exp(x[0])


@pk.kernel
def fast_exp64(x: Ptr[f64]):
    x[0] = pk.fast.exp(x[0])


@pytest.mark.parametrize("arch", ["sm_90", "cpu"])
@pytest.mark.parametrize("kernel", [exp64, fast_exp64])
def test_f64_transcendentals_are_a_compile_error(kernel, arch):
    with pytest.raises(pk.KernelSourceError, match=r"has no f64 form .*no libdevice"):
        kernel.compile(arch)
