"""add / mul / scale (with broadcast rows), f32<->f16 and f32<->bf16 conversions."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import elementwise as E


# >= 64 rows: several 4-element units per thread (_launch.elementwise_geometry), with a
# partial last block (2052) and the unaligned scalar path (45)
@pytest.mark.parametrize("shape", [(3, 64), (5, 1), (2, 45), (1, 4099), (64, 2052), (70, 45)])
def test_binary_ops_exact(device, rng, seed, shape):
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    nan = lambda: pk.full(shape, np.nan, np.float32)  # noqa: E731
    assert np.array_equal(E.add(a, b, out=nan()).numpy(), a + b), f"seed={seed}"
    assert np.array_equal(E.mul(a, b, out=nan()).numpy(), a * b), f"seed={seed}"
    assert np.array_equal(E.add(a, b[0], alpha=0.5, out=nan()).numpy(),
                          (a + b[0]) * np.float32(0.5)), f"seed={seed} broadcast"
    assert np.array_equal(E.mul(a, b[0], out=nan()).numpy(), a * b[0]), f"seed={seed}"
    assert np.array_equal(E.scale(a, 3.0, out=nan()).numpy(), a * np.float32(3)), \
        f"seed={seed}"


def test_in_place_add(device, rng, seed):
    a, b = (rng.standard_normal((4, 100)).astype(np.float32) for _ in range(2))
    arr = pk.to_device(a)
    E.add(arr, b, out=arr)
    assert np.array_equal(arr.numpy(), a + b), f"seed={seed}"


# n % 8 == 0: 8-element units (convert_rows8), with a partial last block (64 x 1032)
@pytest.mark.parametrize("rows,n", [(2, 1), (2, 45), (2, 4099), (64, 1028), (3, 64), (64, 1032)])
def test_f16_conversions(device, rng, seed, rows, n):
    x = (rng.standard_normal((rows, n)) * 100).astype(np.float32)
    h = E.convert(x, np.float16, out=pk.full((rows, n), np.nan, np.float16)).numpy()
    assert np.array_equal(h, x.astype(np.float16)), f"seed={seed}"
    back = E.convert(h, np.float32).numpy()
    assert np.array_equal(back, h.astype(np.float32)), f"seed={seed}"
    mixed = E.add(h, x).numpy()   # f16 + f32 -> f16 (out takes a's dtype)
    assert np.array_equal(mixed, (h.astype(np.float32) + x).astype(np.float16))


def test_bf16_round_trip(device, rng, seed):
    x = (rng.standard_normal(1000) * 10.0 ** rng.integers(-30, 30, 1000)).astype(np.float32)
    x[:3] = [0.0, -0.0, np.inf]
    bits = E.to_bf16(x).numpy()
    assert np.array_equal(bits, E.bf16_bits_reference(x)), f"seed={seed}"
    back = E.from_bf16(bits).numpy()
    assert np.array_equal(back, (bits.astype(np.uint32) << 16).view(np.float32))


def test_broadcast_shape_error(device):
    with pytest.raises(ValueError, match="one row of 4"):
        E.add(np.zeros((2, 4), np.float32), np.zeros(3, np.float32))
