"""Decode GEMV on GGUF weights (stdlib_kernels.quant.gemv) against float64 dequantize(W) @ x.

Q8_1 path: the kernel must equal, to float32 rounding, its exact model
    y = sum_k (W - O)[k] * xh[k] + sum_b O[b] * s[b]
(xh = dequantized Q8_1 activations, s = their stored f16 d sum(q), O = the weight offset a block
applies through s: -8d for Q4_0, m for Q4_1, -dmin*m for Q4_K, 0 otherwise), and be within
    sum_k |W - O|[k] |xh - x|[k] + sum_b |O[b]| |s[b] - sum_{k in b} x[k]|  (+ rounding)
of the float64 product: the Q8_1 rounding bound documented in docs/stdlib.md.
"""
import numpy as np
import pytest

from stdlib_kernels.quant import reference as ref
import pykernel as pk
from stdlib_kernels.quant.gemv import (F32_TYPES, GPU_ONLY, Q8_1_TYPES, VARIANTS, GemvConfig,
                                       gemv, gemv_glu, gemv_q8_into, gemv_residual,
                                       kernel_format, weight_words)
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1, quantize_q8_1_into
from stdlib_kernels.quant.rmsnorm_q8_1 import rmsnorm_q8_1

# bytes of a block holding quantized values: zeroing them leaves the offset the block applies
# through Q8_1's s = d sum(q) (the DP4A kernels of these types use s)
OFFSET_BYTES = {"Q4_0": (2, 18), "Q4_1": (4, 20), "Q5_0": (2, 22), "Q5_1": (4, 24),
                "Q1_0": (2, 18), "Q4_K": (16, 144), "Q5_K": (16, 176)}


GLU_MODES = ("swiglu", "geglu")


def make_weights(rng, type_name, rows, n):
    w = rng.standard_normal((rows, n)).astype(np.float32)
    if type_name == "F32":
        return w.view(np.uint8)
    if type_name == "F16":
        return w.astype(np.float16).view(np.uint8)
    return ref.quantize(w, type_name)


def row_len(type_name, blocks=1):
    return max(ref.block_size(type_name)[0], 32) * blocks


def offsets(raw, type_name, n):
    """Per-element weight offset applied through s (see the module docstring), float64."""
    if type_name not in OFFSET_BYTES:
        return np.zeros((raw.shape[0], n))
    elems, nbytes = ref.block_size(type_name)
    blocks = raw.reshape(raw.shape[0], -1, nbytes).copy()
    lo, hi = OFFSET_BYTES[type_name]
    blocks[:, :, lo:hi] = 0
    return ref.dequantize(blocks.reshape(raw.shape[0], -1), type_name, n).astype(np.float64)


def check_q8_1(y, raw, type_name, x, seed):
    n = x.shape[-1]
    W = ref.dequantize(raw, type_name, n).astype(np.float64)
    O = offsets(raw, type_name, n)
    xq = ref.quantize_q8_1(x).reshape(x.shape[0], -1, 36)
    xh = ref.dequantize(xq.reshape(x.shape[0], -1), "Q8_1", n).astype(np.float64)
    s = xq[:, :, 2:4].copy().view(np.float16).astype(np.float64)[:, :, 0]   # (batch, n/32)
    O32 = O[:, ::32]                                                         # (rows, n/32)
    model = xh @ (W - O).T + s @ O32.T
    scale = np.abs(xh) @ np.abs(W - O).T + np.abs(s) @ np.abs(O32).T
    assert np.all(np.abs(y - model) <= 1e-5 * scale + 1e-30), \
        f"{type_name}: GEMV differs from its Q8_1 model (seed {seed})"
    x64 = x.astype(np.float64)
    xsum = x64.reshape(x.shape[0], -1, 32).sum(axis=2)
    bound = np.abs(xh - x64) @ np.abs(W - O).T + np.abs(s - xsum) @ np.abs(O32).T
    assert np.all(np.abs(y - x64 @ W.T) <= bound + 2e-5 * scale + 1e-30), \
        f"{type_name}: GEMV error exceeds the Q8_1 rounding bound (seed {seed})"


def test_quantize_q8_1_bit_exact(device, rng, seed):
    x = rng.standard_normal((3, 96)).astype(np.float32) * 10.0 ** rng.uniform(-3, 3, (3, 1))
    x[1, :32] = 0.0
    x[2, 32:64] = 0.5
    x[0, :6] = [0.5, -0.5, 1.5, -2.5, 127.0, -127.0]
    got = quantize_q8_1(x).numpy()
    assert np.array_equal(got, ref.quantize_q8_1(x)), f"Q8_1 bytes differ (seed {seed})"


@pytest.mark.parametrize("blocks_per_warp", [4, 12])
def test_quantize_q8_1_blocks_per_warp(device, rng, seed, blocks_per_warp):
    """Several blocks per warp (large inputs): the same bytes, with a block count that leaves
    the last warp partly past the end."""
    x = (rng.standard_normal((7, 1376)) * 10.0 ** rng.uniform(-3, 3, (7, 1))).astype(np.float32)
    x[3, 64:96] = 0.0
    out = pk.full((7, q8_1_bytes(1376)), 0xAB, np.uint8)
    quantize_q8_1_into(pk.to_device(x), out, blocks_per_warp=blocks_per_warp)
    assert np.array_equal(out.numpy(), ref.quantize_q8_1(x)), f"Q8_1 bytes differ (seed {seed})"


def gemv_on_q8_1(raw, type_name, x):
    """gemv() on Q8_1 activations; Q1_0, which gemv() runs on binary tensor cores with its own
    activation format (test_gemv_q1_0.py), through its DP4A kernel (the runner's path)."""
    if type_name != "Q1_0":
        return gemv(raw, type_name, x).numpy()
    rows, n = raw.shape[0], x.shape[-1]
    y = pk.full((x.shape[0], rows), np.nan, np.float32)
    gemv_q8_into(weight_words(pk.to_device(raw), type_name, n)[0], type_name,
                 quantize_q8_1(x), y, rows, n, x.shape[0])
    return y.numpy()


@pytest.mark.parametrize("type_name", sorted(Q8_1_TYPES))
def test_gemv_q8_1(device, rng, seed, type_name):
    # K = one block, M = 1; one batch size per type (each BATCH is a separate compile)
    for rows, blocks in ((3, 1), (1, 2)):
        n = row_len(type_name, blocks)
        raw = make_weights(rng, type_name, rows, n)
        x = rng.standard_normal((2, n)).astype(np.float32)
        check_q8_1(gemv_on_q8_1(raw, type_name, x), raw, type_name, x, seed)


@pytest.mark.parametrize("config", [GemvConfig(warps=4, split=2, rows=2, unroll=2, widen=2),
                                    GemvConfig(warps=2, split=1, rows=3, unroll=3, widen=4,
                                               kernel=""),
                                    GemvConfig(warps=4, split=2, rows=1, unroll=1, widen=2,
                                               stage_x=1, per_sm=1)])
def test_gemv_q8_1_launch_shapes(device, rng, seed, config):
    # the GPU's shapes: unrolled trips plus a remainder, rows not a multiple of the block's rows
    rows, n = 7, 256 * 17
    raw = make_weights(rng, "Q4_K", rows, n)
    x = rng.standard_normal((1, n)).astype(np.float32)
    xq = quantize_q8_1(x)
    y = pk.full((1, rows), np.nan, np.float32)
    gemv_q8_into(weight_words(raw, "Q4_K", n)[0], "Q4_K", xq, y, rows, n, config=config)
    check_q8_1(y.numpy(), raw, "Q4_K", x, seed)


@pytest.mark.parametrize("type_name", F32_TYPES)
def test_gemv_f32(device, rng, seed, type_name):
    rows, n = 3, row_len(type_name)
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((2, n)).astype(np.float32)
    y = gemv(raw, type_name, x, activations="f32").numpy()
    W = ref.dequantize(raw, type_name, n).astype(np.float64)
    scale = np.abs(x.astype(np.float64)) @ np.abs(W).T
    assert np.all(np.abs(y - x @ W.T) <= 1e-5 * scale + 1e-30), f"{type_name} (seed {seed})"


@pytest.mark.parametrize("type_name,activations", [("Q4_K", "q8_1"), ("Q5_K", "f32"),
                                                   ("Q1_0", "q8_1")])
def test_gemv_fused(device, rng, seed, type_name, activations):
    rows, n = 5, 256
    gate, up = (make_weights(rng, type_name, rows, n) for _ in range(2))
    x = rng.standard_normal((2, n)).astype(np.float32)
    res = rng.standard_normal((2, rows)).astype(np.float32)
    g = gemv(gate, type_name, x, activations=activations).numpy().astype(np.float64)
    u = gemv(up, type_name, x, activations=activations).numpy().astype(np.float64)
    swiglu = gemv_glu(gate, up, type_name, x, "swiglu", activations).numpy()
    geglu = gemv_glu(gate, up, type_name, x, "geglu", activations).numpy()
    added = gemv_residual(gate, type_name, x, res, activations).numpy()
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    tol = 1e-5 * (np.abs(g) + 1) * (np.abs(u) + 1)
    assert np.all(np.abs(swiglu - g / (1 + np.exp(-g)) * u) <= tol), f"swiglu (seed {seed})"
    assert np.all(np.abs(geglu - gelu * u) <= tol), f"geglu (seed {seed})"
    assert np.all(np.abs(added - (g + res)) <= 1e-5 * (np.abs(g) + np.abs(res))), \
        f"residual (seed {seed})"


def test_gemv_rejects_bad_input(device, rng):
    raw = make_weights(rng, "Q4_0", 2, 64)
    with pytest.raises(ValueError, match="rows, 36"):
        gemv(raw[:, :30], "Q4_0", np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        gemv(raw, "Q4_0", np.zeros(48, np.float32))
    with pytest.raises(ValueError, match="batch 9"):
        gemv(raw, "Q4_0", np.zeros((9, 64), np.float32))
    with pytest.raises(ValueError, match="unknown quantization type"):
        gemv(raw, "Q9_9", np.zeros(64, np.float32))


@pytest.mark.parametrize("n,rows,aligned", [(96, 3, True), (1056, 3, True), (4096, 2, True),
                                            (1056, 2, False), (544, 11, True),
                                            (544, 17, True), (96, 19, False)])
def test_rmsnorm_q8_1_fused(device, rng, seed, n, rows, aligned):
    """Rows of one, two (1056 = 33 Q8_1 blocks: one past a block's 512 values and 16 warps)
    and more chunks; a row spread over blocks (rows <= SPREAD_ROWS) and one block per row
    (17 and 19 rows); rows not 16-byte aligned (scalar loads); every output byte poisoned first
    (a chunk left unwritten once went unnoticed at n <= 1024, the only sizes tested, and fed
    the 1.5B / 8B decode stale bytes)."""
    from stdlib_kernels.quant.rmsnorm_q8_1 import SPREAD_ROWS, rmsnorm_q8_1_into
    assert (rows > SPREAD_ROWS) == (rows > 16)
    x = (rng.standard_normal((rows, n)) * 10.0 ** rng.uniform(-3, 3, (rows, 1))).astype(np.float32)
    weight = rng.standard_normal(n).astype(np.float32)
    xq = pk.full((rows, n // 32 * 36), 0xFF, np.uint8)      # 0xFFFF: an f16 NaN scale
    out = pk.full((rows, n), np.nan, np.float32)
    padded = pk.to_device(np.concatenate([[0.0] if not aligned else [], x.reshape(-1)])
                          .astype(np.float32))
    dev_x = (padded if aligned else padded[1:]).reshape(rows, n)
    assert (dev_x.ptr % 16 == 0) == aligned
    rmsnorm_q8_1_into(dev_x, pk.to_device(weight), 1e-5, xq, out)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-5) * weight
    assert np.allclose(out.numpy(), want, rtol=2e-6, atol=0), f"rmsnorm values (seed {seed})"
    # the Q8_1 bytes are exactly those of the normalized f32 values the kernel produced
    assert np.array_equal(xq.numpy(), ref.quantize_q8_1(out.numpy())), f"Q8_1 (seed {seed})"
    if n == 96:
        with pytest.raises(ValueError, match="multiple of 32"):
            rmsnorm_q8_1(np.zeros((1, 40), np.float32))


@pytest.mark.parametrize("type_name,variant,blocks",
                         [("Q6_K", "words", 2), ("Q6_K", "", 2), ("Q2_K", "", 2), ("Q4_K", "", 2),
                          ("Q8_0", "", 16), ("Q3_K", "wide", 6), ("Q3_K", "", 2),
                          ("Q1_0", "rows", 6), ("Q1_0", "", 4)])
def test_gemv_kernel_variants(device, rng, seed, type_name, variant, blocks):
    # each kernel variant (gemv.VARIANTS) besides the defaults of test_gemv_q8_1: the u32-word
    # kernels of 2-byte-aligned blocks (even and odd blocks, 2-byte shifted; the last block of
    # the buffer odd) and the u16 ones, the scalar-activation ones
    rows, n = 3, row_len(type_name, blocks)
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((2, n)).astype(np.float32)
    xq = quantize_q8_1(x)
    if variant:   # the variant really runs (Q8_1 rows aligned for its vector loads)
        fmt_id = VARIANTS[type_name][variant][0]
        assert kernel_format(type_name, n, xq, 2, variant)[0] in (fmt_id, GPU_ONLY.get(fmt_id))
    y = pk.full((2, rows), np.nan, np.float32)
    gemv_q8_into(weight_words(raw, type_name, n)[0], type_name, xq, y, rows, n, 2,
                 config=GemvConfig(warps=4, split=2, rows=2, unroll=1, kernel=variant))
    check_q8_1(y.numpy(), raw, type_name, x, seed)


def test_gemv_Q3_K_wide_every_bit_pattern(device, rng, seed):
    # random bytes as Q3_K blocks (a finite d): every hmask bit pattern and 6-bit scale from 0
    # (-32) to 63 (+31) in the "wide" kernel's word-shifted reads, even and odd blocks (2-byte
    # shifted), both halves
    rows, blocks = 3, 4
    n = 256 * blocks
    raw = rng.integers(0, 256, (rows, blocks, 110), dtype=np.uint8)
    raw[:, :, 108:110] = (rng.uniform(0.5, 2.0, (rows, blocks, 1)).astype(np.float16)
                          .view(np.uint8))
    raw[0, 0, 96:108] = [0x0F] * 4 + [0xF0] * 4 + [0xFF] * 2 + [0x00] * 2   # 63, 48, 15, 0
    raw = raw.reshape(rows, -1)
    x = rng.standard_normal((2, n)).astype(np.float32)
    xq = quantize_q8_1(x)
    assert kernel_format("Q3_K", n, xq, 2, "wide")[0] == VARIANTS["Q3_K"]["wide"][0]
    y = pk.full((2, rows), np.nan, np.float32)
    gemv_q8_into(weight_words(raw, "Q3_K", n)[0], "Q3_K", xq, y, rows, n, 2,
                 config=GemvConfig(warps=4, split=2, rows=2, unroll=1, kernel="wide"))
    check_q8_1(y.numpy(), raw, "Q3_K", x, seed)


@pytest.mark.slow
@pytest.mark.parametrize("type_name,rows,n,rows_per_warp,warps,stages,mode,split",
                         [("Q3_K", 37, 2048, 4, 1, 1, None, 1),
                          ("Q3_K", 9, 4096, 2, 2, 1, "residual", 1),
                          ("Q3_K", 5, 6144, 4, 1, 1, None, 1),
                          ("Q3_K", 61, 2048, 2, 2, 3, "residual", 1),
                          ("Q6_K", 37, 2048, 4, 1, 1, None, 1),
                          ("Q6_K", 9, 4096, 2, 2, 1, "residual", 1),
                          ("Q6_K", 5, 6144, 1, 4, 1, None, 1),
                          ("Q6_K", 75, 2048, 1, 2, 2, "residual", 1),
                          ("Q6_K", 45, 2048, 2, 1, 4, "swiglu", 1),
                          ("Q4_K", 37, 256, 4, 1, 1, None, 1),
                          ("Q4_K", 9, 1280, 2, 2, 1, "residual", 1),
                          ("Q4_K", 21, 768, 2, 2, 1, "swiglu", 1),
                          ("Q4_K", 50, 4352, 1, 2, 3, "geglu", 1),
                          ("Q6_K", 13, 14336, 1, 4, 1, "residual", 4),
                          ("Q6_K", 7, 10240, 1, 6, 1, None, 3),
                          ("Q3_K", 5, 4096, 1, 2, 1, None, 2),
                          ("Q4_K", 11, 3584, 1, 8, 1, "residual", 4),
                          ("Q4_K", 9, 1792, 1, 6, 1, "swiglu", 3),
                          ("Q5_K", 37, 256, 4, 1, 1, None, 1),
                          ("Q5_K", 9, 1280, 2, 2, 1, "residual", 1),
                          ("Q5_K", 50, 4352, 1, 2, 3, "swiglu", 1),
                          ("Q5_K", 11, 3584, 1, 8, 1, "residual", 4),
                          ("Q8_0", 37, 256, 4, 1, 1, None, 1),
                          ("Q8_0", 9, 1280, 2, 2, 1, "residual", 1),
                          ("Q8_0", 50, 4352, 1, 2, 3, "swiglu", 1),
                          ("Q8_0", 11, 3584, 1, 8, 1, "residual", 4),
                          ("Q4_0", 37, 256, 4, 1, 1, None, 1),
                          ("Q4_0", 9, 1280, 2, 2, 1, "residual", 1),
                          ("Q4_0", 50, 4352, 1, 2, 3, "swiglu", 1),
                          ("Q4_0", 11, 3584, 1, 8, 1, "residual", 4),
                          ("Q4_1", 37, 256, 4, 1, 1, None, 1),
                          ("Q4_1", 50, 4352, 1, 2, 3, "swiglu", 1),
                          ("Q4_1", 11, 3584, 1, 8, 1, "residual", 4)],
                         ids=["q3k_rows_off_groups", "q3k_residual_2warps", "q3k_three_items",
                              "q3k_ring3", "q6k_rows_off_groups", "q6k_residual_2warps",
                              "q6k_three_items", "q6k_ring2", "q6k_ring4_swiglu",
                              "q4k_one_block", "q4k_residual_odd_blocks", "q4k_swiglu",
                              "q4k_ring3_geglu", "q6k_split4_residual", "q6k_split3_uneven",
                              "q3k_split2", "q4k_split4_residual", "q4k_split3_swiglu",
                              "q5k_one_block", "q5k_residual_odd_blocks", "q5k_ring3_swiglu",
                              "q5k_split4_residual", "q8_0_one_unit", "q8_0_residual_odd_units",
                              "q8_0_ring3_swiglu", "q8_0_split4_residual", "q4_0_one_unit",
                              "q4_0_residual_odd_units", "q4_0_ring3_swiglu",
                              "q4_0_split4_residual", "q4_1_one_unit", "q4_1_ring3_swiglu",
                              "q4_1_split4_residual"])
def test_gemv_bulk(device, rng, seed, type_name, rows, n, rows_per_warp, warps, stages, mode,
                   split):
    """Rows of every bulk type by bulk copies into shared memory (gemv_bulk, sm_90+ on the
    GPU): the Q8_1 model and the register kernel's result; row counts off the warp's row
    group, the residual and gated (w2 rows in the same stage) modes, rows of 2-3 items per lane
    (Q6_K: blocks starting on odd half-words; Q4_K: odd block counts), rings of 2-4 stages
    (one wave of blocks looping over more row groups than warps), and rows split over 2-4
    warps (gemv_bulk_split: chunks of unequal unit counts, rows off the block's row count)."""
    from stdlib_kernels.quant.gemv_bulk import gemv_bulk_into
    if device.kind == "cuda" and int(device.arch[3:]) < 90:
        pytest.skip("bulk copies need sm_90+")
    raw = make_weights(rng, type_name, rows, n)
    raw2 = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((1, n)).astype(np.float32)
    xq = quantize_q8_1(x)
    w = weight_words(raw, type_name, n)[0]
    w2 = weight_words(raw2, type_name, n)[0] if mode in ("swiglu", "geglu") else None
    res = rng.standard_normal(rows).astype(np.float32) if mode == "residual" else None
    res_d = None if res is None else pk.to_device(res)
    y = pk.full((1, rows), np.nan, np.float32)
    gemv_bulk_into(w, type_name, xq, y, rows, n, w2=w2, res=res_d, mode=mode,
                   rows_per_warp=rows_per_warp, warps=warps, stages=stages, split=split)
    if w2 is None:
        check_q8_1(y.numpy() - (0 if res is None else res), raw, type_name, x, seed)
    register = pk.full((1, rows), np.nan, np.float32)
    gemv_q8_into(w, type_name, xq, register, rows, n, w2=w2, res=res_d, mode=mode,
                 config=GemvConfig())
    # the kernels sum in different orders; the gated modes multiply two such sums, so the
    # bound is relative to the output's scale
    want = register.numpy()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=2e-5 * np.abs(want).max(),
                               err_msg=f"vs register kernel (seed {seed})")
    via_config = pk.full((1, rows), np.nan, np.float32)   # gemv_q8_into's "bulk" kernel
    gemv_q8_into(w, type_name, xq, via_config, rows, n, w2=w2, res=res_d, mode=mode,
                 config=GemvConfig(warps=warps, rows=rows_per_warp, kernel="bulk",
                                   stages=stages, split=split))
    np.testing.assert_array_equal(via_config.numpy(), y.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("type_name,batch,rows,n,rows_per_warp,warps,stages,mode,split",
                         [("Q4_K", 2, 37, 512, 2, 2, 1, None, 1),
                          ("Q4_K", 8, 9, 1280, 4, 1, 1, "residual", 1),
                          ("Q4_K", 3, 21, 768, 1, 2, 2, "swiglu", 1),
                          ("Q6_K", 5, 13, 2048, 2, 2, 1, "geglu", 1),
                          ("Q6_K", 4, 7, 10240, 1, 4, 1, "residual", 4),
                          ("Q3_K", 7, 5, 4096, 1, 2, 1, None, 2),
                          ("Q5_K", 6, 11, 3584, 1, 6, 1, "swiglu", 3),
                          ("Q8_0", 2, 45, 512, 2, 1, 3, "residual", 1),
                          ("Q4_0", 8, 19, 768, 4, 2, 1, None, 1),
                          ("Q4_1", 4, 9, 9216, 1, 8, 1, "residual", 4)],
                         ids=["q4k_b2", "q4k_b8_residual", "q4k_b3_ring_swiglu",
                              "q6k_b5_geglu", "q6k_b4_split4_residual", "q3k_b7_split2",
                              "q5k_b6_split3_swiglu", "q8_0_b2_ring3_residual", "q4_0_b8",
                              "q4_1_b4_split4_residual"])
def test_gemv_bulk_batch(device, rng, seed, type_name, batch, rows, n, rows_per_warp, warps,
                         stages, mode, split):
    """2..8 tokens through the bulk kernels (whole rows, rings, rows split over warps; every
    mode): each token's row of the result is the Q8_1 model's and the register kernel's at
    the same batch; a pre-filled output row past the batch stays untouched."""
    from stdlib_kernels.quant.gemv_bulk import gemv_bulk_into
    if device.kind == "cuda" and int(device.arch[3:]) < 90:
        pytest.skip("bulk copies need sm_90+")
    if device.kind == "cpu" and batch * rows_per_warp * (2 if mode in GLU_MODES else 1) > 4:
        pytest.skip("CPU target: more than 4 unrolled row-token dots compile for minutes "
                    "(the GPU runs this case)")
    raw = make_weights(rng, type_name, rows, n)
    raw2 = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((batch, n)).astype(np.float32)
    xq = quantize_q8_1(x)
    w = weight_words(raw, type_name, n)[0]
    w2 = weight_words(raw2, type_name, n)[0] if mode in ("swiglu", "geglu") else None
    res = rng.standard_normal((batch, rows)).astype(np.float32) if mode == "residual" else None
    res_d = None if res is None else pk.to_device(res)
    out = pk.full((batch + 1, rows), np.nan, np.float32)
    y = out[:batch]
    gemv_bulk_into(w, type_name, xq, y, rows, n, w2=w2, res=res_d, mode=mode, batch=batch,
                   rows_per_warp=rows_per_warp, warps=warps, stages=stages, split=split)
    got = out.numpy()
    assert np.isnan(got[batch]).all(), f"wrote past the batch (seed {seed})"
    if w2 is None:
        check_q8_1(got[:batch] - (0 if res is None else res), raw, type_name, x, seed)
    register = pk.full((batch, rows), np.nan, np.float32)
    gemv_q8_into(w, type_name, xq, register, rows, n, batch, w2=w2, res=res_d, mode=mode,
                 config=GemvConfig(kernel=""))
    want = register.numpy()
    np.testing.assert_allclose(got[:batch], want, rtol=1e-5, atol=2e-5 * np.abs(want).max(),
                               err_msg=f"vs register kernel (seed {seed})")


@pytest.mark.parametrize("type_name", ["Q3_K", "Q6_K"])
def test_gemv_bulk_rejects_bad_buffers(device, type_name):
    """Misaligned or short weights, rows off 16-byte multiples, other types, mode misuse,
    row splits the row's 16-byte units or the launch shape cannot take."""
    from stdlib_kernels.quant.gemv_bulk import BLOCK_BYTES, gemv_bulk_into
    raw = pk.zeros((4, 2 * 2048 // 256 * BLOCK_BYTES[type_name] + 16), np.uint8)
    xq = quantize_q8_1(np.zeros((1, 4096), np.float32))
    y = pk.empty((1, 4), np.float32)
    words = raw.reshape(-1)[4:].view(np.uint32)          # 4 bytes off 16-byte alignment
    with pytest.raises(ValueError, match="16-byte aligned"):
        gemv_bulk_into(words, type_name, xq, y, 4, 4096)
    short = raw.reshape(-1)[:1000].view(np.uint32)       # truncated
    with pytest.raises(ValueError, match="at least"):
        gemv_bulk_into(short, type_name, xq, y, 4, 4096)
    with pytest.raises(ValueError, match="multiple of 2048"):
        gemv_bulk_into(raw.reshape(-1).view(np.uint32), type_name, xq, y, 4, 1024)
    with pytest.raises(ValueError, match="no bulk-copy kernel for Q2_K"):
        gemv_bulk_into(raw.reshape(-1).view(np.uint32), "Q2_K", xq, y, 4, 4096)
    whole = raw.reshape(-1).view(np.uint32)
    with pytest.raises(ValueError, match="'swiglu' needs w2"):
        gemv_bulk_into(whole, type_name, xq, y, 4, 4096, mode="swiglu")
    with pytest.raises(ValueError, match="'residual' needs res"):
        gemv_bulk_into(whole, type_name, xq, y, 4, 4096, mode="residual")
    for bad in (dict(split=3), dict(split=2, warps=3), dict(split=2, stages=2),
                dict(split=2, rows_per_warp=2)):                 # 4096 values: 2 units of 8
        with pytest.raises(ValueError, match="rows split over"):
            gemv_bulk_into(whole, type_name, xq, y, 4, 4096, **bad)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "F16"])
def test_gemv_in_a_pdl_graph_prefetches_and_matches(device, rng, seed, type_name):
    """Captured with capture_graph(pdl=True) the GEMV prefetches its first weight rows into L2
    before waiting for the previous kernel (cuda); the result must equal a plain launch."""
    from stdlib_kernels.quant.gemv import gemv_f32_into
    rows, n = 37, 512
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((1, n)).astype(np.float32)
    words = weight_words(raw, type_name, n)[0]
    xd = pk.to_device(x)
    xq = quantize_q8_1(x) if type_name in Q8_1_TYPES else None

    def run(y):
        if xq is not None:
            gemv_q8_into(words, type_name, xq, y, rows, n)
        else:
            gemv_f32_into(words, type_name, xd, y, rows, n)
    plain, graphed = (pk.full((1, rows), np.nan, np.float32) for _ in range(2))
    run(plain)
    stream = pk.Stream()
    with pk.capture_graph(stream, pdl=True) as graph:
        run(graphed)
    graph.replay(stream)
    stream.synchronize()
    assert np.array_equal(plain.numpy(), graphed.numpy()), f"{type_name} (seed {seed})"


def test_gemv_prefetch_is_in_the_ptx_only_when_asked():
    from stdlib_kernels.quant import gemv_kernels as gk
    spec = dict(FMT=12, WT=np.uint32, ITEMS=8, WARPS=4, BATCH=1, MODE=gk.MODE_SWIGLU, ROWS=2,
                KW=2, UNROLL=1, WIDEN=1, STAGE_X=0)
    with_prefetch = gk.gemv_q8_kernel.ptx("sm_90", PREFETCH=True, **spec)
    assert with_prefetch.count("prefetch.global.L2") == 2      # gate and up rows
    assert with_prefetch.index("prefetch.global.L2") < with_prefetch.index("griddepcontrol.wait")
    assert "prefetch.global.L2" not in gk.gemv_q8_kernel.ptx("sm_90", PREFETCH=False, **spec)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 14336])
@pytest.mark.parametrize("type_name", sorted(Q8_1_TYPES))
def test_gpu_default_configs_at_model_shapes(rng, seed, type_name, n):
    """The shipped per-type, per-row-length configurations (gemv.TUNED_SHORT / TUNED_CONFIGS,
    the variant kernels they name) at model row lengths, batch 1 and 2, on the GPU."""
    pk.set_device("cuda")
    rows = 300                                   # not a multiple of any config's row group
    raw = make_weights(rng, type_name, rows, n)
    for batch in (1, 2):
        x = rng.standard_normal((batch, n)).astype(np.float32)
        check_q8_1(gemv_on_q8_1(raw, type_name, x), raw, type_name, x, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1536, 8960])
@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q8_0"])
def test_gpu_fused_gemvs_at_odd_block_counts(rng, seed, type_name, n):
    """qwen2-1.5B's row lengths (6 and 35 super-blocks: odd counts of 256-value blocks) with
    Q8_1 activations, plain, SwiGLU and residual, batch 1, on the GPU's default configs."""
    pk.set_device("cuda")
    rows = 300
    gate, up = (make_weights(rng, type_name, rows, n) for _ in range(2))
    x = rng.standard_normal((1, n)).astype(np.float32)
    res = rng.standard_normal((1, rows)).astype(np.float32)
    check_q8_1(gemv_on_q8_1(gate, type_name, x), gate, type_name, x, seed)
    g = gemv(gate, type_name, x).numpy().astype(np.float64)
    u = gemv(up, type_name, x).numpy().astype(np.float64)
    swiglu = gemv_glu(gate, up, type_name, x, "swiglu").numpy()
    added = gemv_residual(gate, type_name, x, res).numpy()
    tol = 1e-5 * (np.abs(g) + 1) * (np.abs(u) + 1)
    assert np.all(np.abs(swiglu - g / (1 + np.exp(-g)) * u) <= tol), f"swiglu (seed {seed})"
    assert np.all(np.abs(added - (g + res)) <= 1e-5 * (np.abs(g) + np.abs(res)) + 1e-6), \
        f"residual (seed {seed})"


def test_bulk_routing_follows_the_measurements(device):
    """Default routing (gemv_bulk.bulk_eligible) where the runner measured the bulk kernel
    faster: Q5_K's 8B matrices (11.5 MB and up) and every Q5_K row over LONG_ROW values (split
    over warps), but not qwen2-1.5B's 9.5 MB gate / up or smaller; rows off 256 values never;
    Q4_0 from 16 MB; Q4_1 only when asked for."""
    from stdlib_kernels.quant.gemv_bulk import bulk_eligible
    if device.kind == "cuda" and int(device.arch[3:]) < 90:
        pytest.skip("bulk copies need sm_90+")
    assert bulk_eligible("Q5_K", 14336, 4096) and bulk_eligible("Q5_K", 4096, 4096)
    assert bulk_eligible("Q5_K", 4096, 14336) and bulk_eligible("Q5_K", 1536, 8960)
    assert not bulk_eligible("Q5_K", 8960, 1536) and not bulk_eligible("Q5_K", 1536, 1536)
    assert not bulk_eligible("Q5_K", 4096, 4000)
    # Q4_0: from 16 MB (the 8B's gate / up / down), not qwen2-1.5B's 2-8 MB matrices
    assert bulk_eligible("Q4_0", 14336, 4096) and bulk_eligible("Q4_0", 4096, 14336)
    assert not bulk_eligible("Q4_0", 4096, 4096) and not bulk_eligible("Q4_0", 8960, 1536)
    assert not bulk_eligible("Q4_1", 14336, 4096)      # its register kernel is faster there


def test_bulk_routing_leaves_rows_too_long_for_shared_memory(device):
    """Q8_0 takes the bulk kernel at every size, but never rows whose default launch (long
    rows: a quarter row per warp, 4 warps; gated: plus the up rows) would not fit in a block's
    shared memory; the longest that fits launches."""
    from stdlib_kernels.quant import gemv_bulk as gb
    if device.kind == "cuda" and int(device.arch[3:]) < 90:
        pytest.skip("bulk copies need sm_90+")
    assert gb.bulk_eligible("Q8_0", 1536, 1536) and gb.bulk_eligible("Q8_0", 4096, 14336)
    per_quarter = (gb.shared_limit() - gb.SHARED_RESERVED) // (2 * 4 * gb.BLOCK_BYTES["Q8_0"])
    longest = 4 * per_quarter * 256
    assert gb.bulk_eligible("Q8_0", 4, longest)
    assert not gb.bulk_eligible("Q8_0", 4, longest + 256)
    if device.kind == "cuda":      # the limit is the device's: the longest row launches, gated
        rng = np.random.default_rng(0)
        raw, raw2 = (make_weights(rng, "Q8_0", 4, longest) for _ in range(2))
        xq = quantize_q8_1(rng.standard_normal((1, longest)).astype(np.float32))
        y = pk.full((1, 4), np.nan, np.float32)
        gemv_q8_into(weight_words(raw, "Q8_0", longest)[0], "Q8_0", xq, y, 4, longest,
                     w2=weight_words(raw2, "Q8_0", longest)[0], mode="swiglu")
        assert np.isfinite(y.numpy()).all()
