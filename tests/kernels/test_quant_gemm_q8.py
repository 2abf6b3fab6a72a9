"""Int8 tensor-core prefill GEMM (stdlib_kernels.quant.gemm_q8) against float64 references.

The kernel must equal, to float32 accumulation rounding, its exact model
    y = xh @ (W - O)^T + s @ O32^T
(xh = the dequantized Q8_1 activations, s = their stored f16 block sums, O = the weight offset a
block applies through s: -dmin*m for Q4_K, m for Q4_1/Q5_1, 0 for Q4_0/Q5_0/Q8_0/Q6_K whose
offsets are exact int8),
and be within the Q8_1 rounding bound of the float64 product dequantize(W) @ x:
    |y - x W^T| <= |xh - x| @ |W - O|^T + |s - sum_b x| @ |O32|^T  (+ 2e-5 of the magnitude)
"""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemm_q8 import (CPU_TILES, INT8_GEMM_TYPES, TUNED_TILES, Q8GemmTiles,
                                          gemm_q8, gemm_q8_into)
from stdlib_kernels.quant.gemm_q8_k import CPU_KTILES, TUNED_KTILES, Q8KTiles, gemm_q8k_into
from stdlib_kernels.quant.matmul import matmul, matmul_into, prefill_path
from stdlib_kernels.quant.gemv import weight_words
from stdlib_kernels.quant.q8_1 import q8_1_bytes

TYPES = sorted(INT8_GEMM_TYPES)


def make_weights(rng, type_name, rows, n):
    return ref.quantize(rng.standard_normal((rows, n)).astype(np.float32), type_name)


# (block bytes, where its quants start): the types whose blocks add an offset (a min)
OFFSET_BLOCKS = {"Q4_K": (144, 16), "Q5_K": (176, 16), "Q4_1": (20, 4), "Q5_1": (24, 4)}


def weight_offsets(raw, type_name, n):
    """Dequantized with the quants (and Q5_1's high bits) zeroed: -dmin*m per element for
    Q4_K, m for Q4_1 / Q5_1; zeros for the types without an offset."""
    if type_name not in OFFSET_BLOCKS:
        return np.zeros((raw.shape[0], n))
    size, quants = OFFSET_BLOCKS[type_name]
    blocks = raw.reshape(raw.shape[0], -1, size).copy()
    blocks[:, :, quants:] = 0
    return ref.dequantize(blocks.reshape(raw.shape[0], -1), type_name, n).astype(np.float64)


def check(y, raw, type_name, x, seed):
    n = x.shape[1]
    W = ref.dequantize(raw, type_name, n).astype(np.float64)
    O = weight_offsets(raw, type_name, n)
    xq = ref.quantize_q8_1(x).reshape(x.shape[0], -1, 36)
    xh = ref.dequantize(xq.reshape(x.shape[0], -1), "Q8_1", n).astype(np.float64)
    s = xq[:, :, 2:4].copy().view(np.float16).astype(np.float64)[:, :, 0]
    O32 = O[:, ::32]
    scale = np.abs(xh) @ np.abs(W - O).T + np.abs(s) @ np.abs(O32).T
    model = xh @ (W - O).T + s @ O32.T
    assert y.shape == model.shape, (y.shape, model.shape)
    assert np.all(np.abs(y - model) <= 1e-5 * scale + 1e-30), \
        f"{type_name}: int8 GEMM differs from its Q8_1 model, max " \
        f"{np.max(np.abs(y - model) / (scale + 1e-30)):.2e} of the magnitude (seed {seed})"
    x64 = x.astype(np.float64)
    xsum = x64.reshape(x.shape[0], -1, 32).sum(axis=2)
    bound = np.abs(xh - x64) @ np.abs(W - O).T + np.abs(s - xsum) @ np.abs(O32).T
    assert np.all(np.abs(y - x64 @ W.T) <= bound + 2e-5 * scale + 1e-30), \
        f"{type_name}: int8 GEMM error exceeds the Q8_1 rounding bound (seed {seed})"


@pytest.mark.parametrize("type_name", TYPES)
def test_gemm_q8_awkward_shapes(device, rng, seed, type_name):
    # rows and tokens not multiples of the tile (16 x 16 on the CPU target, 64..128 x 128 on CUDA);
    # K = one super-block on the CPU target (two K steps of its 64-wide tiles)
    rows, n, tokens = (19, 256, 9) if device.kind == "cpu" else (130, 768, 77)
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    check(gemm_q8(raw, type_name, x).numpy(), raw, type_name, x, seed)
    if type_name in ("Q4_1", "Q5_0", "Q5_1", "Q5_K"):   # also the per-block kernel
        check(gemm_q8(raw, type_name, x, CPU_TILES).numpy(), raw, type_name, x, seed)


@pytest.mark.slow
def test_gemm_q8_dispatched_tile_shape(device, rng, seed):
    # the 8-warp 64 x 128 tile matmul uses for Q4_0 on CUDA (~20 s on the CPU target)
    raw = make_weights(rng, "Q4_0", 67, 256)
    x = rng.standard_normal((20, 256)).astype(np.float32)
    check(gemm_q8(raw, "Q4_0", x, TUNED_TILES["Q4_0"]).numpy(), raw, "Q4_0", x, seed)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1"])
def test_gemm_q8_one_block(device, rng, seed, type_name):
    # K = one 32-value block: the K step shrinks to it; one token row per tile edge
    raw = make_weights(rng, type_name, 17, 32)
    x = (rng.standard_normal((17, 32)) * 100).astype(np.float32)
    check(gemm_q8(raw, type_name, x, Q8GemmTiles(1, 2, 1, 1, 4)).numpy(), raw, type_name, x,
          seed)


@pytest.mark.parametrize("tiles", [Q8GemmTiles(1, 1, 1, 2, 2), None])
def test_gemm_q8_zero_and_odd_activations(device, rng, seed, tiles):
    # all-zero token (Q8_1 d = 0) next to large and tiny rows; the per-block kernel with a
    # 2-warp tile shape, then the K-quant super-block kernel (gemm_q8_k.py)
    raw = make_weights(rng, "Q4_K", 8, 256)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[0] = 0.0
    x[1] *= 1e3   # Q8_1's f16 block sum s overflows past 65504 (as in llama.cpp)
    x[2] *= 1e-4
    check(gemm_q8(raw, "Q4_K", x, tiles).numpy(), raw, "Q4_K", x, seed)


SUPERBLOCK_TYPES = ["Q4_K", "Q6_K", "Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1", "Q5_K"]


@pytest.mark.parametrize("type_name", SUPERBLOCK_TYPES)
def test_gemm_q8k_pipeline_wraps(device, rng, seed, type_name):
    # the super-block kernel: 3 K steps through 3 stages (every buffer and both scale buffers
    # reused), odd rows x odd super-blocks (Q6_K: row starts alternate between 0 and 2 bytes
    # past a word; the buffer ends mid-word; Q4_0 / Q8_0: 8 blocks of 32 per step, half of
    # them 2 bytes off a word), partial row and token tiles
    rows, n, tokens = (17, 768, 11) if device.kind == "cpu" else (133, 2816, 203)
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    tiles = CPU_KTILES if device.kind == "cpu" else TUNED_KTILES[type_name]
    check(gemm_q8(raw, type_name, x, tiles).numpy(), raw, type_name, x, seed)


def test_gemm_q8k_q6k_word_aligned_rows(device, rng, seed):
    # Q6_K rows of a multiple of 4 bytes (K % 512 == 0: every 8B shape), so every row's step
    # starts 0 or 2 bytes past a word by the step's parity alone; 4 steps
    rows, n, tokens = (19, 1024, 9) if device.kind == "cpu" else (133, 2048, 203)
    raw = make_weights(rng, "Q6_K", rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    tiles = CPU_KTILES if device.kind == "cpu" else TUNED_KTILES["Q6_K"]
    check(gemm_q8(raw, "Q6_K", x, tiles).numpy(), raw, "Q6_K", x, seed)


SHORT_PROMPT_TILES = [Q8KTiles(2, 2, 4, 1, 3), Q8KTiles(2, 4, 4, 1, 3), Q8KTiles(2, 4, 4, 2, 3),
                      Q8KTiles(1, 2, 4, 1, 3), Q8KTiles(1, 4, 4, 1, 3), Q8KTiles(1, 4, 4, 2, 3),
                      Q8KTiles(1, 2, 2, 1, 3), Q8KTiles(1, 4, 2, 1, 3), Q8KTiles(1, 8, 4, 2, 3),
                      Q8KTiles(2, 8, 4, 2, 3)]


@pytest.mark.parametrize("type_name", SUPERBLOCK_TYPES)
def test_gemm_q8k_short_prompt_tiles(device, rng, seed, type_name):
    # narrow token tiles (8-128 tokens) and 32-128 row tiles of few warps, for short prompts
    # and batched decode steps (gemm_q8_k.SMALL_KTILES): token counts below, at and above a
    # tile, rows off the tile;
    # tokens past the last one are zero-filled copies (72 on 128-token tiles); 65-256 tokens
    # take gemm_q8_k.wide_tiles (80 / 96 / 112-token tiles for 72 / 96 / 130 and 200)
    if device.kind == "cpu":
        pytest.skip("GPU tile shapes (the CPU target runs CPU_KTILES)")
    raw = make_weights(rng, type_name, 200, 2048)
    for tokens in (6, 8, 9, 16, 31, 40, 64, 72, 96, 130, 200):
        x = rng.standard_normal((tokens, 2048)).astype(np.float32)
        for tiles in SHORT_PROMPT_TILES:
            if type_name == "Q8_0" and tiles.shape == (128, 128):
                continue       # over the shared memory of a block (Q8_0 rows are the widest)
            check(gemm_q8(raw, type_name, x, tiles).numpy(), raw, type_name, x, seed)
        check(gemm_q8(raw, type_name, x).numpy(), raw, type_name, x, seed)   # SMALL_KTILES


@pytest.mark.parametrize("kernel", ["superblock", "per_block"])
def test_gemm_q8_into_columns_with_residual(device, rng, seed, kernel):
    # C written into columns col0.. of a wider output (ldy), plus a residual read at the same
    # places; the columns around stay untouched (the runner's multi-type q|k|v outputs and
    # residual adds go through this instead of copy / add launches)
    rows, n, tokens, ldy, col0 = 21, 512, 11, 40, 13
    raw = make_weights(rng, "Q4_0", rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    res = rng.standard_normal((tokens, ldy)).astype(np.float32)
    xq = pk.empty((tokens, q8_1_bytes(n)), np.uint8)
    from stdlib_kernels.quant.q8_1 import quantize_q8_1_into
    quantize_q8_1_into(pk.to_device(x), xq)
    w = weight_words(pk.to_device(raw), "Q4_0", n)[0]
    tiles = (CPU_KTILES if device.kind == "cpu" else TUNED_KTILES["Q4_0"]) \
        if kernel == "superblock" else Q8GemmTiles(1, 1, 1, 1, 1)
    alone = gemm_q8(raw, "Q4_0", x, tiles).numpy()
    y = pk.full((tokens, ldy), np.nan, np.float32)
    gemm_q8_into(w, "Q4_0", xq, y, rows, n, tokens, tiles=tiles, ldy=ldy, col0=col0,
                 res=pk.to_device(res))
    got = y.numpy()
    np.testing.assert_allclose(got[:, col0:col0 + rows], alone + res[:, col0:col0 + rows],
                               rtol=1e-6, atol=1e-5, err_msg=f"seed {seed}")
    assert np.isnan(got[:, :col0]).all() and np.isnan(got[:, col0 + rows:]).all()
    with pytest.raises(ValueError, match="columns 30..51 inside"):
        gemm_q8_into(w, "Q4_0", xq, y, rows, n, tokens, ldy=ldy, col0=30)


@pytest.mark.slow
@pytest.mark.parametrize("type_name", SUPERBLOCK_TYPES)
def test_gemm_q8k_four_stages_two_warps(device, rng, seed, type_name):
    # 4 stages (a wait depth of 1) and warps tiling both ways (~40 s on the CPU target)
    raw = make_weights(rng, type_name, 35, 1280)
    x = rng.standard_normal((21, 1280)).astype(np.float32)
    check(gemm_q8(raw, type_name, x, Q8KTiles(1, 1, 2, 1, 4)).numpy(), raw, type_name, x, seed)
    check(gemm_q8(raw, type_name, x, Q8KTiles(1, 1, 1, 2, 3)).numpy(), raw, type_name, x, seed)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_gemm_q8k_split_k(device, rng, seed, type_name):
    # K split over blocks (the last block of a tile sums the partials in split order): same
    # contract as unsplit, into strided columns plus a residual in place, bit-identical run to
    # run, and 1..K/256 splits only. 7 K steps: uneven splits of 2, 3 and 7.
    rows, n, tokens, ldy, col0 = 37, 1792, 11, 50, 5
    raw = make_weights(rng, type_name, rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    w, _ = weight_words(raw, type_name, n)
    xq = pk.to_device(ref.quantize_q8_1(x).reshape(tokens, -1))
    tiles = CPU_KTILES if device.kind == "cpu" else Q8KTiles(1, 2, 2, 1, 3)
    for split in (2, 3, 7):
        y = pk.full((tokens, rows), np.nan, np.float32)
        gemm_q8k_into(w, type_name, xq, y, rows, n, tokens, tiles=tiles, split=split)
        check(y.numpy().astype(np.float64), raw, type_name, x, seed)
        again = pk.full((tokens, rows), np.nan, np.float32)
        gemm_q8k_into(w, type_name, xq, again, rows, n, tokens, tiles=tiles, split=split)
        assert (again.numpy() == y.numpy()).all(), f"split {split}: not deterministic"
        res = rng.standard_normal((tokens, ldy)).astype(np.float32)
        out = pk.to_device(res)
        gemm_q8k_into(w, type_name, xq, out, rows, n, tokens, tiles=tiles, split=split,
                      ldy=ldy, col0=col0, res=out)
        got = out.numpy()
        np.testing.assert_allclose(got[:, col0:col0 + rows], y.numpy() + res[:, col0:col0 + rows],
                                   rtol=1e-6, atol=1e-5, err_msg=f"split {split}, seed {seed}")
        assert (got[:, :col0] == res[:, :col0]).all() and \
            (got[:, col0 + rows:] == res[:, col0 + rows:]).all()
    for bad in (0, 8):
        with pytest.raises(ValueError, match=f"split {bad} must be in 1..7"):
            gemm_q8k_into(w, type_name, xq, y, rows, n, tokens, tiles=tiles, split=bad)
    # the workspace (>= 1 Mi partials + 4096 counters) is what memory reports count
    from stdlib_kernels.quant.gemm_q8_k import split_workspace_bytes
    assert split_workspace_bytes(device) >= (1 << 22) + 4 * 4096


def test_auto_split(monkeypatch):
    # small tiles, several to a multiprocessor: about 2 blocks per multiprocessor, at most 8
    # and at least 2 K steps per split; one to a multiprocessor: the fewest modelled waves x
    # (steps per split + fill) while the tiles are under two waves
    from stdlib_kernels import _launch
    from stdlib_kernels.quant.gemm_q8_k import auto_split
    monkeypatch.setattr(_launch, "multiprocessors", lambda: 132)   # an H100 / H200
    assert auto_split(64, 56, per_sm=4) == 4   # llama-8B's down projection at 16 tokens
    assert auto_split(16, 16, per_sm=4) == 8   # a 1024-row v projection
    assert auto_split(16, 6, per_sm=4) == 3    # K = 1536: 3 splits of 2 steps
    assert auto_split(96, 16, per_sm=3) == 3
    assert auto_split(1000, 1) == 1
    assert auto_split(448, 16) == 1            # gate|up: 448 tiles fill the GPU
    assert auto_split(128, 56) == 1            # 512 tokens, 4096 rows: one wave already
    assert auto_split(192, 16) == 2            # 6144-row q|k|v: 1.45 waves -> 3 of half K
    assert auto_split(56, 6) == 2              # qwen2-1.5B's q|k|v at 512 tokens
    assert auto_split(48, 35) == 5             # its down projection
    assert auto_split(32, 56) == 4             # 72 tokens, 128 x 80 tiles, 4096 rows
    assert auto_split(140, 6) == 2             # qwen2-1.5B's gate|up at 72-128 tokens


def test_launch_split_counts_tiles_and_blocks_per_sm(monkeypatch):
    # what gemm_q8k_into picks on a GPU: tiles of the launch, blocks per SM by shared memory
    from stdlib_kernels import _launch
    from stdlib_kernels.quant.gemm_q8_k import launch_split, tuned_tiles
    monkeypatch.setattr(_launch, "multiprocessors", lambda: 132)
    monkeypatch.setattr(_launch, "blocks_per_multiprocessor", lambda shared, threads:
                        max(1, min(233472 // (shared + 1024), 2048 // threads)))
    assert launch_split("Q4_K", 4096, 14336, 72, tuned_tiles("Q4_K", 72)) == 4   # 32 tiles
    assert launch_split("Q8_0", 4096, 14336, 512, tuned_tiles("Q8_0", 512)) == 1
    assert launch_split("Q4_K", 4096, 14336, 16, tuned_tiles("Q4_K", 16)) == 4   # 64 x 16


def test_blocks_per_multiprocessor(device):
    from stdlib_kernels._launch import blocks_per_multiprocessor
    assert blocks_per_multiprocessor(200 * 1024, 256) == 1
    assert blocks_per_multiprocessor(0, 1024) == 2       # threads bound it
    assert 2 <= blocks_per_multiprocessor(60 * 1024, 128) <= 3


def test_tuned_tiles_cover_tokens_with_few_columns():
    # 33-48 and 65-256 tokens: 128-row tiles, as few token columns (steps of 16) as cover the
    # tokens in ceil(tokens / 128) tiles (49-64: 64 x 64); past 256 the tuned tiles
    from stdlib_kernels.quant.gemm_q8_k import tuned_tiles
    for tokens, width in ((33, 48), (48, 48), (65, 80), (72, 80), (96, 96), (104, 112),
                          (128, 128), (136, 80), (160, 80), (200, 112), (256, 128)):
        for type_name in ("Q4_K", "Q6_K", "Q4_0", "Q8_0"):
            if type_name == "Q8_0" and tokens <= 64:    # Q8_0: 64 x 64 from 33 tokens
                continue
            tiles = tuned_tiles(type_name, tokens)
            assert tiles.shape == (128, width), (type_name, tokens, tiles)
    assert tuned_tiles("Q4_K", 56).shape == (64, 64)
    assert tuned_tiles("Q8_0", 40).shape == (64, 64)
    assert tuned_tiles("Q4_K", 257) == TUNED_KTILES["Q4_K"]


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1"])
def test_gemm_q8_small_k_keeps_block_kernel(device, rng, seed, type_name):
    # K = 96 (not a multiple of 256): the default path is the per-32-block kernel, and the
    # super-block kernel refuses it with a clear error
    raw = make_weights(rng, type_name, 10, 96)
    x = rng.standard_normal((9, 96)).astype(np.float32)
    check(gemm_q8(raw, type_name, x).numpy(), raw, type_name, x, seed)
    with pytest.raises(ValueError, match="K = 96 must be a positive multiple of 256"):
        gemm_q8(raw, type_name, x, Q8KTiles(1, 1, 1, 1, 3))


def test_gemm_q8k_tuned_tiles_on_gpu(device, rng, seed):
    # the tile shapes matmul uses on CUDA (skipped work on the CPU target: 256-thread blocks)
    if device.kind == "cpu":
        return
    for type_name, tiles in TUNED_KTILES.items():
        raw = make_weights(rng, type_name, 300, 1024)
        x = rng.standard_normal((150, 1024)).astype(np.float32)
        check(gemm_q8(raw, type_name, x, tiles).numpy(), raw, type_name, x, seed)


def test_matmul_into_int8_prefill(device, rng, seed):
    # the runner's entry point: with a Q8_1 workspace, more than 8 tokens take the int8 GEMM
    # on CUDA where it is the faster path (prefill_path), with the same result contract
    rows, n, tokens = 5, 256, 12
    raw = make_weights(rng, "Q4_0", rows, n)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    w, _ = weight_words(pk.to_device(raw), "Q4_0", n)
    y = pk.full((tokens, rows), np.nan, np.float32)
    xq = pk.empty((tokens, q8_1_bytes(n)), np.uint8)
    matmul_into(w, "Q4_0", pk.to_device(x), y, rows, n, tokens, xq=xq)
    if prefill_path("Q4_0", n, xq) == "int8":
        check(y.numpy(), raw, "Q4_0", x, seed)
    else:   # f16 path: its own tolerance (test_quant_gemm.py)
        W = ref.dequantize(raw, "Q4_0", n).astype(np.float64)
        ref_y = x.astype(np.float64) @ W.T
        assert np.all(np.abs(y.numpy() - ref_y) <=
                      1.2e-3 * (np.abs(x) @ np.abs(W).T) + 1e-30), seed


def test_matmul_int8_prefill(device, rng, seed):
    raw = make_weights(rng, "Q8_0", 3, 64)
    x = rng.standard_normal((9, 64)).astype(np.float32)     # 9 tokens: a GEMM
    y = matmul(raw, "Q8_0", x).numpy()
    if prefill_path("Q8_0", 64, xq=True) == "int8":
        check(y, raw, "Q8_0", x, seed)
    else:
        W = ref.dequantize(raw, "Q8_0", 64).astype(np.float64)
        assert np.all(np.abs(y - x.astype(np.float64) @ W.T) <=
                      1.2e-3 * (np.abs(x) @ np.abs(W).T) + 1e-30), seed


def test_matmul_takes_the_int8_gemm_from_six_tokens(device, rng, seed):
    """quant.matmul's rule (uses_gemm): the int8 GEMM's types take it from INT8_GEMM_TOKENS
    (6) tokens, the others keep the GEMV up to 8; 6 tokens of Q8_0 give the GEMM's own result
    (bit for bit), 5-16 of Q4_K and Q6_K the tensor-core GEMV's (mma_gemv_applies), and 4 the
    GEMV's."""
    from stdlib_kernels.quant.gemv import gemv
    from stdlib_kernels.quant.gemv_mma import gemv_mma, mma_gemv_applies
    from stdlib_kernels.quant.matmul import INT8_GEMM_TOKENS, uses_gemm
    assert INT8_GEMM_TOKENS == 6
    assert not uses_gemm("Q8_0", 256, 5, xq=True) and uses_gemm("Q8_0", 256, 6, xq=True)
    assert not uses_gemm("Q6_K", 256, 4, xq=True) and uses_gemm("Q6_K", 256, 5, xq=True)
    assert not uses_gemm("Q4_K", 256, 4, xq=True) and uses_gemm("Q4_K", 256, 5, xq=True)
    assert not uses_gemm("Q4_K", 256, 6, xq=None)        # no Q8_1 workspace: the GEMV
    assert not uses_gemm("Q2_K", 256, 8, xq=True) and uses_gemm("Q2_K", 256, 9, xq=True)
    assert mma_gemv_applies("Q4_K", 5) and mma_gemv_applies("Q4_K", 16)
    assert not mma_gemv_applies("Q4_K", 4) and not mma_gemv_applies("Q4_K", 17)
    assert mma_gemv_applies("Q6_K", 5) and not mma_gemv_applies("Q8_0", 6)
    raw = make_weights(rng, "Q4_K", 7, 256)
    x = rng.standard_normal((6, 256)).astype(np.float32)
    np.testing.assert_array_equal(matmul(raw, "Q4_K", x).numpy(),
                                  gemv_mma(raw, "Q4_K", x).numpy())
    np.testing.assert_array_equal(matmul(raw, "Q4_K", x[:4]).numpy(),
                                  gemv(raw, "Q4_K", x[:4]).numpy())
    check(matmul(raw, "Q4_K", x).numpy(), raw, "Q4_K", x, seed)
    raw6 = make_weights(rng, "Q6_K", 7, 256)
    np.testing.assert_array_equal(matmul(raw6, "Q6_K", x).numpy(),
                                  gemv_mma(raw6, "Q6_K", x).numpy())
    raw8 = make_weights(rng, "Q8_0", 7, 256)
    np.testing.assert_array_equal(matmul(raw8, "Q8_0", x).numpy(),
                                  gemm_q8(raw8, "Q8_0", x).numpy())


def test_choose_matmul_path_and_its_options():
    """One rule for quant.matmul and the runner (RunnerOptions.kernel_options adds its two
    choices); the options come from the environment once, or are set directly."""
    from stdlib_kernels.options import KernelOptions
    from stdlib_kernels.quant.matmul import (GEMM_F16, GEMM_Q8, GEMV, GEMV_MMA,
                                             choose_matmul_path as path)
    o = KernelOptions()
    assert [path("Q4_K", t, True, o) for t in (4, 5, 16, 17)] == [GEMV, GEMV_MMA, GEMV_MMA,
                                                                  GEMM_Q8]
    assert [path("Q8_0", t, True, o) for t in (5, 6)] == [GEMV, GEMM_Q8]
    assert [path("Q2_K", t, True, o) for t in (8, 9)] == [GEMV, GEMM_F16]
    assert path("Q4_K", 6, False, o) == GEMV and path("Q4_K", 9, False, o) == GEMM_F16
    assert path("F32", 40, True, o) == GEMM_F16
    runner = KernelOptions(f32_weights_gemv=True, route_by_format=True)
    assert path("F32", 40, True, runner) == GEMV
    assert path("Q4_K", 6, False, runner) == GEMM_F16      # left the GEMV by its format
    assert path("Q4_K", 6, True, KernelOptions(mma_gemv=False)) == GEMM_Q8
    assert path("Q8_0", 7, True, KernelOptions(int8_gemm_tokens=9)) == GEMV
    assert path("Q2_K", 5, True, KernelOptions(gemv_tokens=4)) == GEMM_F16
    env = {"PYKERNEL_GEMV_TOKENS": "12", "PYKERNEL_INT8_GEMM_TOKENS": "9",
           "PYKERNEL_MMA_GEMV": "0"}
    assert KernelOptions.from_env(env) == KernelOptions(8, 9, False)     # GEMV: 8 at most
    assert KernelOptions.from_env({}, route_by_format=True) == KernelOptions(
        route_by_format=True)


def test_gemm_q8_rejects_bad_input(device, rng):
    raw = make_weights(rng, "Q2_K", 2, 256)
    with pytest.raises(ValueError, match="no int8 GEMM for Q2_K"):
        gemm_q8(raw, "Q2_K", np.zeros((2, 256), np.float32))
    raw = make_weights(rng, "Q8_0", 2, 64)
    w, _ = weight_words(pk.to_device(raw), "Q8_0", 64)
    y = pk.empty((3, 2), np.float32)
    with pytest.raises(ValueError, match="Q8_1 activations must hold 3 x 72"):
        gemm_q8_into(w, "Q8_0", pk.empty((2, 72), np.uint8), y, 2, 64, 3)
    with pytest.raises(ValueError, match="float32 \\(tokens, K\\)"):
        gemm_q8(raw, "Q8_0", np.zeros(64, np.float32))
    raw = make_weights(rng, "Q6_K", 2, 256)
    w, _ = weight_words(pk.to_device(raw), "Q6_K", 256)
    with pytest.raises(ValueError, match="Q6_K: weights must be uint16 words of 3 rows"):
        gemm_q8k_into(w, "Q6_K", pk.zeros((2, 288), np.uint8), pk.empty((2, 3), np.float32),
                      3, 256, 2)
    with pytest.raises(ValueError, match="no super-block int8 GEMM for Q3_K"):
        gemm_q8k_into(w, "Q3_K", pk.zeros((2, 288), np.uint8), pk.empty((2, 3), np.float32),
                      3, 256, 2)
    with pytest.raises(ValueError, match="K = 288 must be a positive multiple of 256"):
        gemm_q8k_into(w, "Q6_K", pk.zeros((2, 324), np.uint8), pk.empty((2, 2), np.float32),
                      2, 288, 2)
