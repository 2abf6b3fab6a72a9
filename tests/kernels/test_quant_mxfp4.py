"""MXFP4 (ggml type 39): the reference quantizer against gguf-py's bytes, the device
dequantizer bit-exact against gguf-py's values, the DP4A GEMV within its Q8_1 bound of the
float64 product, the f16 prefill GEMM, and the matmul route."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

import pykernel as pk
from stdlib_kernels.quant import dequantize
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemm import gemm
from stdlib_kernels.quant.gemv import gemv_q8_into, weight_words
from stdlib_kernels.quant.matmul import GEMM_F16, GEMV, choose_matmul_path
from stdlib_kernels.quant.q8_1 import quantize_q8_1

from test_quant_gemm import check as check_f16_gemm
from test_quant_gemv import check_q8_1

MXFP4 = GGMLQuantizationType.MXFP4


def awkward_rows(rng, rows, n):
    """Normal rows at scales from 2^-140 (subnormal exponents) to 2^100, plus zero, constant,
    outlier, and values at and just below powers of two (where log2f rounds up)."""
    x = rng.standard_normal((rows, n)).astype(np.float32)
    x *= np.exp2(rng.uniform(-140, 100, (rows, 1))).astype(np.float32)
    x[0] = 0
    x[1 % rows] = np.float32(rng.uniform(-3, 3))
    x[2 % rows, : n // 2] = np.float32(2.0) ** rng.integers(-20, 20, n // 2)
    x[3 % rows] = np.nextafter(np.float32(2.0) ** rng.integers(-20, 20, n), np.float32(0))
    x[4 % rows, rng.integers(n)] = np.float32(1e30)
    return x


@pytest.mark.parametrize("shape", [(1, 32), (6, 96), (45, 320)])
def test_reference_quantizer_matches_gguf(rng, seed, shape):
    x = awkward_rows(rng, *shape)
    with np.errstate(all="ignore"):
        want = gguf_quants.quantize(x, MXFP4)
    got = ref.quantize(x, "MXFP4")
    assert got.shape == (shape[0], shape[1] // 32 * 17)
    assert np.array_equal(got, want), f"MXFP4 bytes differ from gguf-py (seed {seed})"


def random_blocks(rng, rows, n):
    """Any bytes are a valid MXFP4 row: every exponent (0 and 1 are subnormal scales) and
    code appear."""
    return rng.integers(0, 256, (rows, n // 32 * 17), dtype=np.uint8)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_device_dequantize_bit_exact(device, rng, seed, dtype):
    raw = random_blocks(rng, 7, 96)
    raw[0, 0::17] = rng.integers(0, 3, 3)       # subnormal scales
    with np.errstate(over="ignore"):   # exponents past f16 give inf, as the kernel does
        want = gguf_quants.dequantize(raw, MXFP4).astype(np.float32).astype(dtype)
    got = dequantize(raw, "MXFP4", 96, dtype)
    assert got.dtype == dtype
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), \
        f"MXFP4 dequantize differs from gguf-py (seed {seed})"


@pytest.mark.parametrize("rows,n,batch", [(5, 32, 1), (3, 160, 3)])
def test_gemv_q8_1_within_bound(device, rng, seed, rows, n, batch):
    # quantized weights at a spread of scales; the bound is check_q8_1's (Q8_1 rounding)
    w = rng.standard_normal((rows, n)).astype(np.float32)
    w *= np.exp2(rng.uniform(-8, 8, (rows, 1))).astype(np.float32)
    raw = ref.quantize(w, "MXFP4")
    x = rng.standard_normal((batch, n)).astype(np.float32)
    y = pk.full((batch, rows), np.nan, np.float32)
    gemv_q8_into(weight_words(pk.to_device(raw), "MXFP4", n)[0], "MXFP4", quantize_q8_1(x),
                 y, rows, n, batch)
    check_q8_1(y.numpy(), raw, "MXFP4", x, seed)


def test_prefill_gemm_f16(device, rng, seed):
    rows, n, tokens = 19, 96, 9
    raw = ref.quantize(rng.standard_normal((rows, n)).astype(np.float32), "MXFP4")
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    check_f16_gemm(gemm(raw, "MXFP4", x).numpy(), raw, "MXFP4", x, seed)


def test_matmul_route():
    # DP4A GEMV up to 8 tokens; no int8 GEMM for MXFP4, so prompts take the f16 GEMM
    assert choose_matmul_path("MXFP4", 1, True) == GEMV
    assert choose_matmul_path("MXFP4", 8, True) == GEMV
    assert choose_matmul_path("MXFP4", 9, True) == GEMM_F16
    assert choose_matmul_path("MXFP4", 512, True) == GEMM_F16


def test_kernels_assemble_for_the_gpu(assemble):
    """The GEMV (DP4A + prmt tables, with the PDL prefetch of byte rows), the f32-activation
    GEMV and the dequantizer lower to PTX that ptxas accepts."""
    from stdlib_kernels.quant import dequant_kernels as dk
    from stdlib_kernels.quant import gemv_kernels as gk
    from stdlib_kernels.quant.formats import MXFP4 as FMT
    q8 = gk.gemv_q8_kernel.ptx("sm_90", FMT=FMT, WT=np.uint8, ITEMS=1, WARPS=4, BATCH=2,
                               MODE=gk.MODE_SWIGLU, ROWS=2, KW=2, UNROLL=2, WIDEN=1, STAGE_X=0,
                               PREFETCH=True)
    assert "dp4a" in q8 and "prmt" in q8
    f32 = gk.gemv_f32_kernel.ptx("sm_90", FMT=FMT, WT=np.uint8, WARPS=4, BATCH=1, MODE=0, KW=1,
                                 PREFETCH=False)
    deq = dk.dequantize_rows8.ptx("sm_80", FMT=FMT, BLOCK_ELEMS=32, BLOCK_BYTES=17,
                                  T=np.float16)
    for ptx, arch in ((q8, "sm_90"), (f32, "sm_90"), (deq, "sm_80")):
        assemble(ptx, arch)


def test_gpt_oss_file_experts_dequantize_bit_exact(device):
    """The MXFP4 expert tensors of the tiny gpt-oss file (written by llama.cpp's tools), as
    stacked (expert, rows, row_bytes) bytes: the device decode equals gguf-py's."""
    from gguf import GGUFReader

    from shared_data import GOLDEN, require
    reader = GGUFReader(require(str(GOLDEN / "tiny" / "tiny-gpt-oss-mxfp4.gguf")))
    tensors = [t for t in reader.tensors if t.tensor_type == MXFP4]
    assert tensors, "the file holds MXFP4 experts"
    for t in tensors[:3]:
        raw = np.ascontiguousarray(t.data).reshape(-1, t.data.shape[-1])
        n = raw.shape[1] // 17 * 32
        want = gguf_quants.dequantize(raw, MXFP4)
        got = dequantize(raw, "MXFP4", n)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), t.name
