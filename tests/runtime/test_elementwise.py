"""`@pk.elementwise`: a scalar @pk.func over arrays and scalars, against numpy on fresh random
inputs (outputs poisoned first), on the CPU target and on CUDA; the vector and one-by-one flat
kernels, numpy broadcasting (32- and 64-bit index arithmetic), the grid-stride loop, in-place
`out=`; errors that name the function, the parameter and the user's line."""
import sys

import numpy as np
import pytest

import pykernel as pk
import pykernel.elementwise_kernels  # noqa: F401  (the module; pk.elementwise is the decorator)
from pykernel import bf16, f16, f32, i32
from pykernel.errors import KernelSourceError


@pk.elementwise
def axpb(x: f32, y: f32, a: f32) -> f32:
    return a * x + y


@pk.elementwise
def scaled_half(h: f16, k: i32) -> f32:
    """Mixed types: f16 input, i32 input, f32 result."""
    return f32(h) * f32(k) + pk.exp(f32(h))


@pytest.mark.parametrize("n", [1, 255, 1000, 70001])
def test_matches_numpy(device, rng, seed, n):
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    a = float(rng.standard_normal())
    z = axpb(pk.to_device(x), pk.to_device(y), a)
    np.testing.assert_allclose(z.numpy(), np.float32(a) * x + y, rtol=1e-6, atol=1e-6,
                               err_msg=f"n={n} (seed {seed})")
    h = rng.standard_normal(n).astype(np.float16)
    k = rng.integers(-5, 5, n).astype(np.int32)
    out = pk.full(n, np.nan, np.float32)
    got = scaled_half(pk.to_device(h), pk.to_device(k), out=out)
    assert got is out
    h64 = h.astype(np.float64)
    want, scale = h64 * k + np.exp(h64), np.abs(h64 * k) + np.exp(h64)
    # f32 rounding of the product, exp (<= 1 ulp) and the sum: relative to the terms, not to
    # their (possibly cancelling) sum
    err = np.abs(out.numpy() - want)
    assert np.all(err <= 4e-7 * scale), (float((err / scale).max()), f"seed {seed}")


def test_shapes_scalars_in_place_and_grid_stride(device, rng, seed, monkeypatch):
    x = rng.standard_normal((37, 29)).astype(np.float32)
    dx = pk.to_device(x)
    z = axpb(dx, 1.5, 2.0)                       # scalars broadcast; the shape is kept
    assert z.shape == (37, 29)
    np.testing.assert_allclose(z.numpy(), 2 * x + 1.5, rtol=1e-6, err_msg=f"seed {seed}")
    axpb(dx, dx, 3.0, out=dx)                    # in place: out is an input
    np.testing.assert_allclose(dx.numpy(), 4 * x, rtol=1e-6, err_msg=f"seed {seed}")
    assert axpb(pk.empty(0, np.float32), 1.0, 1.0).shape == (0,)     # nothing to launch
    # a grid smaller than the array: each thread loops
    monkeypatch.setattr(sys.modules["pykernel.elementwise_kernels"], "MAX_BLOCKS", 3)
    y = rng.standard_normal(5000).astype(np.float32)
    out = pk.full(5000, np.nan, np.float32)
    axpb(pk.to_device(y), 0.0, -1.0, out=out)
    np.testing.assert_array_equal(out.numpy(), -y)
    assert len(axpb._kernels) >= 2           # one generated kernel per call pattern


@pk.elementwise
def names_like_locals(n: f32, i: f32, k: i32, j: f32, step: f32) -> f32:
    """Parameter names that a generated kernel might use for its own locals."""
    return n * i + f32(k) - j * step


def test_vector_and_scalar_paths_agree(device, rng, seed):
    """Aligned arrays take the 4-wide vector kernel (tail included), a view one element in
    (4 bytes off a 16-byte boundary) the one-by-one kernel; parameter names never collide."""
    n = 1003                                      # n % 4 == 3: a tail
    cols = [rng.standard_normal(n + 1).astype(np.float32) for _ in range(4)]
    ks = rng.integers(-9, 9, n + 1).astype(np.int32)
    want = cols[0] * cols[1] + ks - cols[2] * cols[3]
    dev = [pk.to_device(c) for c in cols]
    dk = pk.to_device(ks)
    whole = names_like_locals(dev[0], dev[1], dk, dev[2], dev[3])
    np.testing.assert_allclose(whole.numpy(), want, rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}")
    out = pk.full(n + 1, np.nan, np.float32)
    names_like_locals(*(d[1:] for d in dev[:2]), dk[1:], *(d[1:] for d in dev[2:]),
                      out=out[1:])
    np.testing.assert_allclose(out.numpy()[1:], want[1:], rtol=1e-5, atol=1e-5,
                               err_msg=f"seed {seed}")
    assert np.isnan(out.numpy()[0])
    assert {key[1] for key in names_like_locals._kernels} == {True, False}


@pytest.mark.parametrize("wide_index", [False, True])
def test_broadcasting_like_numpy(device, rng, seed, monkeypatch, wide_index):
    """Arrays of different shapes broadcast as numpy's do (a row, a column, leading
    dimensions); wide_index forces the 64-bit index kernel on a small array."""
    if wide_index:
        monkeypatch.setattr(sys.modules["pykernel.elementwise_kernels"], "MAX_BLOCKS", 1 << 23)
    cases = [((37, 29), (29,)), ((37, 1), (1, 29)), ((3, 1, 5), (4, 1)), ((2, 3, 4, 5), (3, 1, 1)),
             ((1,), (6, 7)),                                   # one element per thread
             ((37, 28), (28,)), ((2, 3, 4), (1, 1, 4)), ((5, 1, 8), (5, 3, 8)),   # 4 per thread
             ((2, 1, 3, 1, 2, 2, 2, 4), (2, 2, 3, 2, 2, 2, 2, 4))]   # 8-D, merges to 5
    for sx, sy in cases:
        x = rng.standard_normal(sx).astype(np.float32)
        y = rng.standard_normal(sy).astype(np.float32)
        a = float(rng.standard_normal())
        got = axpb(pk.to_device(x), pk.to_device(y), a)
        want = np.float32(a) * x + y
        assert got.shape == want.shape, (sx, sy)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6,
                                   err_msg=f"{sx} with {sy} (seed {seed})")
    out = pk.full((4, 6), np.nan, np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    axpb(1.0, pk.to_device(b), 2.0, out=out)         # a scalar and a row into a matrix
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(np.float32(2.0) + b, (4, 6)))
    used = {how for (_, _, how) in axpb._kernels if how}
    assert ("i64" if wide_index else "i32") in {index for index, _ in used}
    assert {inner is not None for _, (_, inner) in used} == {True, False}   # both kernels ran


def test_coalescing_merges_what_every_array_walks_alike():
    coalesce = sys.modules["pykernel.elementwise_kernels"]._coalesce
    assert coalesce((37, 28), [(37, 28), (28,)]) == ([37, 28], [[28, 1], [0, 1]])
    assert coalesce((2, 3, 4), [(2, 3, 4), (1, 1, 4)]) == ([6, 4], [[4, 1], [0, 1]])
    assert coalesce((4, 1, 6), [(4, 1, 6), (4, 1, 6), (1, 1, 1)]) == ([24], [[1], [1], [0]])
    assert coalesce((3, 5), [(3, 1), (1, 5)]) == ([3, 5], [[1, 0], [0, 1]])


def test_errors_name_function_parameter_and_line():
    x = pk.zeros(8, np.float32)
    with pytest.raises(pk.LaunchError, match=r"axpb\(\): takes 3 arguments \(x, y, a\), got 2"):
        axpb(x, 1.0)
    with pytest.raises(pk.LaunchError, match=r"do not broadcast together: x \(8,\), "
                                             r"y \(4,\)"):
        axpb(x, pk.zeros(4, np.float32), 1.0)
    with pytest.raises(pk.LaunchError, match=r"out must have the broadcast shape \(2, 8\)"):
        axpb(pk.zeros((2, 1), np.float32), 1.0, 1.0, out=x)
    with pytest.raises(pk.LaunchError, match="up to 6 dimensions after merging"):
        axpb(pk.zeros((2, 1, 2, 1, 2, 1, 2), np.float32),
             pk.zeros((1, 2, 1, 2, 1, 2, 1), np.float32), 1.0)
    with pytest.raises(pk.LaunchError, match="at least one array"):
        axpb(1.0, 2.0, 3.0)
    with pytest.raises(pk.LaunchError, match="bf16 result needs out="):
        to_bf16(x)
    with pytest.raises(pk.LaunchError, match=r"parameter 'y' expects .*float32.*float16"):
        axpb(x, pk.zeros(8, np.float16), 1.0)
    with pytest.raises(TypeError, match="parameter 'b' needs a scalar type annotation"):
        pk.elementwise(lambda_free_untyped)
    with pytest.raises(TypeError, match="scalar return annotation"):
        pk.elementwise(no_return_type)
    with pytest.raises(TypeError, match="out are reserved"):
        pk.elementwise(takes_out)

    @pk.elementwise
    def mixed(v: f32) -> f32:
        return v + i32(1)
    with pytest.raises(KernelSourceError) as info:
        mixed(x)
    text = str(info.value)
    assert "test_elementwise.py" in text and "return v + i32(1)" in text and "^" in text


@pk.elementwise
def to_bf16(v: f32) -> bf16:
    return bf16(v)


def lambda_free_untyped(a: f32, b) -> f32:
    return a


def no_return_type(a: f32):
    return a


def takes_out(a: f32, out: f32) -> f32:
    return a


def test_generated_kernel_and_its_ptx_are_public(assemble):
    # the kernel a same-shape call of two arrays and a scalar launches, 4-wide
    ptx = axpb.ptx("sm_90", arrays=(True, True, False))
    assert ".entry axpb_elementwise" in ptx and "ld.global.nc.v4.b32" in ptx
    assemble(ptx, "sm_90")
    scalar_path = axpb.kernel(arrays=(True, True, False), vector=False)
    assert "v4" not in scalar_path.ptx("sm_80")
    with pytest.raises(ValueError, match="one flag per parameter"):
        axpb.kernel(arrays=(True,))
