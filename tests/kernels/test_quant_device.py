"""Device quantize/dequantize kernels (stdlib_kernels.quant.device) against ggml's golden bytes
and the numpy reference codecs, on the CPU target and (marked gpu) on CUDA."""

import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.quant import dequantize, quantize
from stdlib_kernels.quant import reference as ref

from shared_data import GOLDEN as _GOLDEN_DIR, require

GOLDEN = str(_GOLDEN_DIR / "ggml-quants-seed1.npz")
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q1_0"]
KQUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
FLOATS = ["F32", "F16", "BF16"]
# golden rows: 1 tiny, 3 zero, 4 constant, 5 outliers, 6 all positive, 9 few values, 10 huge
SPECIAL_ROWS = [1, 3, 4, 5, 6, 9, 10]


@pytest.fixture(scope="module")
def golden():
    return np.load(require(GOLDEN))


def _rows_for(fmt, golden_x):
    # the K-quant kernels are slow on the CPU target: their special rows and two ordinary ones
    return SPECIAL_ROWS + [0, 20] if fmt in KQUANTS else list(range(golden_x.shape[0]))


def _same_bits(a, b):
    """Bit-equal, except that any NaN equals any NaN: an overflowed f16 scale gives inf*0, and
    the GPU's canonical NaN (0x7fffffff) differs from x86's default NaN (0xffc00000)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    same = a.view(np.uint8).reshape(a.shape + (-1,)) == b.view(np.uint8).reshape(b.shape + (-1,))
    return bool(np.all(same.all(axis=-1) | both_nan))


def _random_rows(rng, n_rows, n):
    """Ordinary, zero, constant, tiny, huge (f16 scales overflow) and outlier rows."""
    x = rng.standard_normal((n_rows, n)).astype(np.float32)
    kinds = ["normal", "zero", "constant", "tiny", "huge", "outlier"]
    for r in range(n_rows):
        kind = kinds[r % len(kinds)]
        if kind == "zero":
            x[r] = 0
        elif kind == "constant":
            x[r] = np.float32(rng.uniform(-2, 2))
        elif kind == "tiny":
            x[r] *= np.float32(1e-8)
        elif kind == "huge":
            x[r] *= np.float32(1e6)
        elif kind == "outlier":
            x[r, rng.integers(n)] = np.float32(500)
    return x


@pytest.mark.parametrize("fmt", LEGACY + KQUANTS)
def test_dequantize_matches_golden(device, golden, fmt):
    raw = golden[fmt]
    want = golden[fmt + "_deq"]
    got = dequantize(raw, fmt, want.shape[1])
    assert got.dtype == np.float32 and got.shape == want.shape
    assert _same_bits(got, want), f"{fmt}: dequantized bits differ from ggml's"
    half = dequantize(raw, fmt, want.shape[1], np.float16)
    assert _same_bits(half, want.astype(np.float16)), f"{fmt}: f16 output differs"


@pytest.mark.parametrize("fmt", LEGACY + KQUANTS)
def test_quantize_matches_golden(device, golden, fmt):
    rows = _rows_for(fmt, golden["x"])
    got = quantize(golden["x"][rows], fmt)
    want = golden[fmt][rows]
    bad = [rows[i] for i in np.nonzero((got != want).any(axis=1))[0]]
    assert not bad, f"{fmt}: golden rows {bad} differ from ggml's bytes"


@pytest.mark.parametrize("fmt", LEGACY + KQUANTS + FLOATS)
def test_quantize_random_rows_match_reference(device, rng, seed, fmt):
    n = 512 if fmt in KQUANTS else 256
    x = _random_rows(rng, 6, n)
    got = quantize(x, fmt)
    want = ref.quantize(x, fmt)
    bad = np.nonzero((got != want).any(axis=1))[0]
    assert not len(bad), f"{fmt}: rows {bad.tolist()} differ from the reference (seed {seed})"
    back = dequantize(got, fmt, n)
    assert _same_bits(back, ref.dequantize(want, fmt, n)), f"{fmt}: seed {seed}"


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_1", "Q1_0", "F16", "BF16", "Q6_K"])
def test_quantize_half_and_bfloat16_inputs(device, rng, seed, fmt):
    x = _random_rows(rng, 2, 256)
    halves = x.astype(np.float16)
    assert np.array_equal(quantize(halves, fmt), ref.quantize(halves.astype(np.float32), fmt)), \
        f"{fmt}: f16 input (seed {seed})"
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)          # truncated bfloat16 values
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(quantize(bits, fmt), ref.quantize(widened, fmt)), \
        f"{fmt}: bf16 input (seed {seed})"


@pytest.mark.parametrize("fmt", FLOATS)
@pytest.mark.parametrize("n", [64, 37])   # 37: the one-element-per-thread kernel
def test_dequantize_float_formats(device, rng, seed, fmt, n):
    x = _random_rows(rng, 3, n)
    raw = ref.quantize(x, fmt)
    assert _same_bits(dequantize(raw, fmt, n), ref.dequantize(raw, fmt, n)), f"seed {seed}"


def test_device_arrays_stay_on_device(device, rng):
    x = pk.to_device(rng.standard_normal((3, 256)).astype(np.float32))
    raw = quantize(x, "Q4_K")
    assert isinstance(raw, pk.Array) and raw.shape == (3, 144) and raw.dtype == np.uint8
    back = dequantize(raw, "Q4_K", 256)
    assert isinstance(back, pk.Array) and back.shape == (3, 256)
    assert _same_bits(back.numpy(), ref.dequantize(raw.numpy(), "Q4_K", 256))


def test_flat_bytes_are_split_into_rows(device, golden):
    raw = golden["Q8_0"][:3]
    got = dequantize(raw.tobytes(), "Q8_0", 1024)
    assert _same_bits(got, golden["Q8_0_deq"][:3])


@pytest.mark.parametrize("call, message", [
    (lambda: quantize(np.zeros((2, 100), np.float32), "Q4_0"), "not a positive multiple"),
    (lambda: quantize(np.zeros(300, np.float32), "Q6_K"), "block size"),
    (lambda: quantize(np.zeros((2, 32), np.int32), "Q8_0"), "dtype int32"),
    (lambda: quantize(np.zeros((2, 2, 32), np.float32), "Q8_0"), "shape"),
    (lambda: quantize(np.zeros(32, np.float32), "Q9_9"), "unknown quantization type"),
    (lambda: quantize(np.zeros(32, np.float32), "Q8_1"), "no device kernel"),
    (lambda: dequantize(np.zeros(100, np.uint8), "Q4_0", 32), "whole number of 18-byte rows"),
    (lambda: dequantize(np.zeros((2, 20), np.uint8), "Q4_0", 32), "takes 18 bytes"),
    (lambda: dequantize(np.zeros(18, np.uint8), "Q4_0", 33), "not a positive multiple"),
    (lambda: dequantize(np.zeros(36, np.float32), "Q4_0", 32), "uint8"),
    (lambda: dequantize(np.zeros(0, np.uint8), "Q4_0", 32), "whole number"),
    (lambda: dequantize(np.zeros(18, np.uint8), "Q4_0", 32, np.int8), "float32 or float16"),
])
def test_bad_input_is_rejected(device, call, message):
    with pytest.raises(ValueError, match=message):
        call()
