"""`@pk.reduction`: sums, max, integer sums and a mapped sum of squares against float64 /
exact numpy on fresh random inputs of awkward lengths (0, 1, one block, many blocks, more than
the first pass's grid covers) and along the last axis (warp and block per row, 4-wide and
one-by-one loads), on the CPU target and on CUDA; deterministic results; errors."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import f16, f32, i16, i32
from pykernel.errors import KernelSourceError


@pk.reduction(identity=0.0)
def total(a: f32, b: f32) -> f32:
    return a + b


@pk.reduction(identity=float("-inf"))
def largest(a: f32, b: f32) -> f32:
    return max(a, b)


@pk.reduction(identity=0)
def int_total(a: i32, b: i32) -> i32:
    return a + b


@pk.func
def squared(v: f16) -> f32:
    return f32(v) * f32(v)


@pk.reduction(identity=0.0, map=squared)
def sum_of_squares(a: f32, b: f32) -> f32:
    return a + b


@pytest.mark.parametrize("n", [0, 1, 257, 70001, 2_500_003])
def test_reductions_match_numpy(device, rng, seed, n):
    x = rng.standard_normal(n).astype(np.float32)
    dx = pk.to_device(x)
    s = total(dx)
    assert s.shape == () and s.dtype == np.float32
    exact = x.astype(np.float64).sum()
    # float32 tree sum: error ~ log2(n) ulps of the magnitudes summed
    bound = 1e-6 * np.abs(x).astype(np.float64).sum() + 1e-30
    assert abs(float(s.numpy()) - exact) <= bound, (float(s.numpy()), exact, f"seed {seed}")
    if n:
        assert float(largest(dx).numpy()) == float(x.max()), f"seed {seed}"
    else:
        assert float(largest(dx).numpy()) == -np.inf
    k = rng.integers(-1000, 1000, n).astype(np.int32)
    assert int(int_total(pk.to_device(k)).numpy()) == int(k.astype(np.int64).sum()), seed
    h = rng.standard_normal(n).astype(np.float16)
    out = pk.full((), np.nan, np.float32)
    assert sum_of_squares(pk.to_device(h), out=out) is out
    want = (h.astype(np.float64) ** 2).sum()
    assert abs(float(out.numpy()) - want) <= 1e-6 * want + 1e-30, f"seed {seed}"
    again = total(dx)
    assert again.numpy().tobytes() == s.numpy().tobytes(), "not deterministic"


def test_aligned_and_misaligned_inputs_agree(device, rng, seed):
    """A view one element in (4 bytes off) takes the one-load-per-element kernel, the aligned
    array the 4-wide one (with its n % 4 tail): integer sums are exact either way."""
    k = rng.integers(-1000, 1000, 100_003).astype(np.int32)
    dk = pk.to_device(k)
    assert int(int_total(dk).numpy()) == int(k.astype(np.int64).sum()), seed
    assert int(int_total(dk[1:]).numpy()) == int(k[1:].astype(np.int64).sum()), seed
    assert {key[1] for key in int_total._kernels if key[0] and key[2] == "whole"} == {True, False}


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 8), (1, 1), (9, 2048), (6, 2049), (2, 3000),
                                   (300, 64), (4, 0)])
def test_last_axis(device, rng, seed, shape):
    """axis=-1: a warp per row (rows up to 2048), a block per row beyond; 4-wide loads when the
    row length allows; exact integer sums, max, a mapped sum."""
    k = rng.integers(-1000, 1000, shape).astype(np.int32)
    got = int_total(pk.to_device(k), axis=-1)
    assert got.shape == shape[:-1]
    np.testing.assert_array_equal(got.numpy(), k.astype(np.int64).sum(-1), err_msg=f"{seed}")
    x = rng.standard_normal(shape).astype(np.float32)
    out = pk.full(shape[:-1], np.nan, np.float32)
    assert largest(pk.to_device(x), out=out, axis=len(shape) - 1) is out
    want = x.max(-1) if shape[-1] else np.full(shape[:-1], -np.inf, np.float32)
    np.testing.assert_array_equal(out.numpy(), want, err_msg=f"seed {seed}")
    h = rng.standard_normal(shape).astype(np.float16)
    sq = sum_of_squares(pk.to_device(h), axis=-1).numpy()
    want = (h.astype(np.float64) ** 2).sum(-1)
    assert np.all(np.abs(sq - want) <= 1e-6 * want + 1e-30), f"seed {seed}"


def test_2d_input_and_one_element_out(device, rng, seed):
    x = rng.standard_normal((300, 41)).astype(np.float32)
    out = pk.zeros(1, np.float32)
    total(pk.to_device(x), out=out)
    np.testing.assert_allclose(out.numpy()[0], x.astype(np.float64).sum(), rtol=1e-5,
                               atol=1e-4, err_msg=f"seed {seed}")


def test_errors():
    x = pk.zeros(8, np.float32)
    with pytest.raises(pk.LaunchError, match="expects an array"):
        total(3.0)
    with pytest.raises(pk.LaunchError, match="out must hold one element"):
        total(x, out=pk.zeros(2, np.float32))
    with pytest.raises(pk.LaunchError, match="axis must be None .* or the last axis"):
        total(pk.zeros((2, 3), np.float32), axis=0)
    with pytest.raises(pk.LaunchError, match=r"out must have shape \(2,\)"):
        total(pk.zeros((2, 3), np.float32), out=pk.zeros(3, np.float32), axis=-1)
    with pytest.raises(pk.LaunchError, match=r"parameter 'x' expects .*float32.*int32"):
        total(pk.zeros(8, np.int32))
    with pytest.raises(TypeError, match="one type"):
        pk.reduction(identity=0)(mixed_types)
    with pytest.raises(TypeError, match="32- or 64-bit"):
        pk.reduction(identity=0)(short_ints)
    with pytest.raises(TypeError, match="returns f16, the accumulator is f32"):
        pk.reduction(identity=0.0, map=to_half)(total.op.fn)
    with pytest.raises(TypeError, match="must take 2 argument"):
        pk.reduction(identity=0.0)(squared.fn)
    with pytest.raises(TypeError, match="identity must be a number"):
        pk.reduction(identity="zero")(total.op.fn)

    @pk.reduction(identity=0.0)
    def broken(a: f32, b: f32) -> f32:
        return a + i32(b)
    with pytest.raises(KernelSourceError) as info:
        broken(x)
    assert "test_reduction.py" in str(info.value) and "return a + i32(b)" in str(info.value)


def mixed_types(a: f32, b: i32) -> f32:
    return a


def short_ints(a: i16, b: i16) -> i16:
    return a


@pk.func
def to_half(v: f32) -> f16:
    return f16(v)


def test_generated_kernels_and_their_ptx_are_public(assemble):
    first = total.ptx("sm_90", vector=True)
    assert ".entry total_reduce" in first and "ld.global.nc.v4.b32" in first
    assemble(first, "sm_90")
    assert ".entry total_reduce_partials" in total.ptx("sm_80", first_pass=False)
    assert ".entry total_reduce_warp_rows" in total.kernel(mode="warp_rows").ptx("sm_90")
    with pytest.raises(ValueError, match="mode is"):
        total.kernel(mode="columns")
