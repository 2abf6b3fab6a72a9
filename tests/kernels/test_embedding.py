"""Embedding lookup for f32/f16 and quantized (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) tables."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import embed as E

try:
    from stdlib_kernels.quant.reference import dequantize, quantize
except ImportError:  # the quant helper's module not there yet: gguf-py's codecs
    from gguf import GGMLQuantizationType as _T
    from gguf import quants as _q

    def quantize(x, name):
        return _q.quantize(x, _T[name])

    def dequantize(raw, name, n):
        return _q.dequantize(raw, _T[name]).reshape(-1, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [1, 37, 256])
def test_float_tables(device, rng, seed, dtype, n):
    table = rng.standard_normal((50, n)).astype(dtype)
    ids = rng.integers(0, 50, 9).astype(np.int32)
    out = E.embedding(table, ids, scale=1.7, out=pk.full((9, n), np.nan, np.float32)).numpy()
    ref = table[ids].astype(np.float32) * np.float32(1.7)
    assert np.array_equal(out, ref), f"seed={seed}"


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_quantized_tables(device, rng, seed, qtype):
    n = 512
    x = (rng.standard_normal((12, n)) * rng.uniform(0.1, 3, (12, 1))).astype(np.float32)
    blocks = quantize(x, qtype)
    ids = rng.integers(0, 12, 7).astype(np.int32)
    out = E.embedding(blocks, ids, qtype=qtype, scale=2.0,
                      out=pk.full((7, n), np.nan, np.float32)).numpy()
    ref = dequantize(blocks[ids], qtype, n) * np.float32(2.0)
    # decode is exact up to the order of the final f32 multiplies
    assert np.allclose(out, ref, rtol=1e-6, atol=1e-7), \
        f"seed={seed} {qtype} max err {np.max(np.abs(out - ref))}"


def test_bad_ids_give_nan_rows(device, rng):
    table = rng.standard_normal((5, 8)).astype(np.float32)
    out = E.embedding(table, np.array([4, -1, 5], np.int32)).numpy()
    assert np.array_equal(out[0], table[4])
    assert np.isnan(out[1:]).all()


def test_errors(device):
    with pytest.raises(ValueError, match="whole 34-byte blocks"):
        E.embedding(np.zeros((3, 35), np.uint8), np.zeros(1, np.int32), qtype="Q8_0")
    with pytest.raises(ValueError, match="qtype"):
        E.embedding(np.zeros((3, 34), np.uint8), np.zeros(1, np.int32), qtype="Q9_0")
