"""quant.dequant_f16 (the weight scratch's one-pass dequantizer) on the CPU target and a GPU: bit-exact
against the numpy reference dequantizer rounded to nearest f16 for every format it serves, on
ordinary, zero, constant, tiny and outlier rows, a chunk of rows from an offset, nothing written
past rows x n; bad arguments refused; its PTX assembles."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.dequant_f16 import (DEQUANT_F16_TYPES, dequant_f16_rows,
                                              dequantize_f16_into)
from stdlib_kernels.quant.formats import get_format
from stdlib_kernels.quant.gemv import weight_words

def _rows(rng, n_rows, n):
    x = rng.standard_normal((n_rows, n)).astype(np.float32)
    for r in range(n_rows):
        kind = r % 5
        if kind == 1:
            x[r] = 0
        elif kind == 2:
            x[r] = np.float32(rng.uniform(-2, 2))
        elif kind == 3:
            x[r] *= np.float32(1e-6)
        elif kind == 4:
            x[r, rng.integers(n)] = np.float32(300)
    return x


def _bits(values):
    """f16 bits with -0 as +0: decode8 adds Q4_0's / Q5_0's zero offset (+0.0) after the product,
    so its zeros are +0 where the reference's (q - 8) d gives -0 for a negative d; a sum never
    sees the difference."""
    return (np.asarray(values, np.float16) + np.float16(0)).view(np.uint16)


def _row_length(type_name):
    # not a multiple of 256 where the blocks allow it: rows of an odd number of blocks
    return {32: 96, 128: 384}.get(get_format(type_name).block_elems, 512)


@pytest.mark.parametrize("type_name", DEQUANT_F16_TYPES)
def test_bit_exact_against_reference_rounded_to_f16(type_name, rng, seed, device):
    rows, n = 7, _row_length(type_name)
    raw = ref.quantize(_rows(rng, rows, n), type_name)
    want = ref.dequantize(raw, type_name, n).reshape(rows, n).astype(np.float16)
    words, _ = weight_words(pk.to_device(raw), type_name, n)
    out = pk.full((rows * n + 40,), np.nan, np.float16)      # 40 past the end stay NaN
    dequantize_f16_into(words, type_name, out, rows, n)
    got = out.numpy()
    assert np.isnan(got[rows * n:]).all(), f"seed {seed}: wrote past rows x n"
    np.testing.assert_array_equal(_bits(got[:rows * n].reshape(rows, n)), _bits(want),
                                  err_msg=f"{type_name} seed {seed}")


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0"])
def test_a_chunk_of_rows_from_an_offset(type_name, rng, seed, device):
    """Rows 3..7 of 9 (the route's row chunks: the words from row 3 on, 5 rows)."""
    n = _row_length(type_name)
    raw = ref.quantize(_rows(rng, 9, n), type_name)
    want = ref.dequantize(raw, type_name, n).reshape(9, n)[3:8].astype(np.float16)
    words, _ = weight_words(pk.to_device(raw), type_name, n)
    per_row = words.size // 9
    out = pk.full((5, n), np.nan, np.float16)
    dequantize_f16_into(words[3 * per_row:], type_name, out, 5, n)
    np.testing.assert_array_equal(_bits(out.numpy()), _bits(want),
                                  err_msg=f"seed {seed}")


def test_bad_arguments_are_refused(rng, cpu_device):
    raw = ref.quantize(rng.standard_normal((4, 256)).astype(np.float32), "Q4_K")
    words, _ = weight_words(pk.to_device(raw), "Q4_K", 256)
    with pytest.raises(ValueError, match="float16 with at least 4 x 256"):
        dequantize_f16_into(words, "Q4_K", pk.empty((4, 255), np.float16), 4, 256)
    with pytest.raises(ValueError, match="float16"):
        dequantize_f16_into(words, "Q4_K", pk.empty((4, 256), np.float32), 4, 256)
    with pytest.raises(ValueError, match="weights hold"):
        dequantize_f16_into(words, "Q4_K", pk.empty((5, 256), np.float16), 5, 256)
    with pytest.raises(ValueError, match="not a quantized format"):
        dequantize_f16_into(words, "F16", pk.empty((4, 256), np.float16), 4, 256)
    with pytest.raises(ValueError, match="multiple of 256"):
        dequantize_f16_into(words, "Q4_K", pk.empty((4, 256), np.float16), 4, 128)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptx_assembles(arch, assemble):
    for type_name in ("Q4_K", "Q6_K", "Q8_0", "MXFP4"):
        dtype = weight_words(pk.to_device(np.zeros((1, get_format(type_name).block_bytes * (
            256 // get_format(type_name).block_elems)), np.uint8)), type_name, 256)[0].dtype
        assemble(dequant_f16_rows.ptx(arch, FMT=get_format(type_name).id, WT=dtype), arch)
