"""Q1_0 GEMV on binary tensor cores (stdlib_kernels.quant.gemv_q1_0) and the Q8-planes
activation quantizer (q8_planes.py).

Exact model: with the planes' int8 q, d_x and s = d_x sum(q) per 128-value group, and the
weights' d_w and bits per block, the kernel computes
    y = sum_b d_w[b] (2 d_x[b] sum_{bit set} q - s[b])
to float32 rounding (checked at 1e-5 of the sum of absolute terms). Against float64
dequantize(W) @ x the only other error is the activations' rounding: |d_x q - x| <= d_x / 2
(q = roundf(x / d_x), d_x = amax / 127 over 128 values, +2^-17 relative for the f32 division),
and every |w| = d_w of its block, so
    |y - W x| <= sum_b d_w[b] * 128 * d_x[b] / 2 * (1 + 2^-17) (+ 2e-5 of the absolute sum).
This is Q8_1's bound with the scale taken over 128 values instead of 32 (llama.cpp's Q1_0 path
uses Q8_1, so results differ from it by this much more at most).
"""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemv import gemv, gemv_glu, gemv_residual, weight_words
from stdlib_kernels.quant.gemv_q1_0 import Q1Config, gemv_q1_0_into
from stdlib_kernels.quant.q8_planes import (dequantize_q8_planes, q8_planes_bytes,
                                            quantize_q8_planes, reference_q8_planes)


def q1_0_weights(rng, rows, n):
    """Q1_0 rows (uint8 (rows, n/128*18)) and their float64 scales d_w (rows, n/128)."""
    raw = ref.quantize(rng.standard_normal((rows, n)).astype(np.float32), "Q1_0")
    dw = raw.reshape(rows, -1, 18)[:, :, :2].copy().view(np.float16)[:, :, 0]
    return raw, dw.astype(np.float64)


def check(y, raw, dw, x, seed, what=""):
    """y (batch, rows) against the exact planes model and the activation-rounding bound."""
    n = x.shape[-1]
    W = ref.dequantize(raw, "Q1_0", n).astype(np.float64)              # (rows, n)
    q, dx, s = dequantize_q8_planes(reference_q8_planes(x), n)         # (batch, n), (batch, G)
    bits = (W > 0).astype(np.float64)
    sbit = np.einsum("rgk,bgk->bgr", bits.reshape(len(W), -1, 128),
                     q.reshape(len(q), -1, 128), optimize=True)
    model = np.einsum("rg,bgr->br", dw, 2 * dx[:, :, None] * sbit - s[:, :, None],
                      optimize=True)
    absum = np.einsum("rg,bgr->br", np.abs(dw), 2 * dx[:, :, None] * np.abs(sbit) +
                      np.abs(s)[:, :, None], optimize=True)
    y = y.reshape(model.shape)
    assert np.all(np.abs(y - model) <= 1e-5 * absum + 1e-30), \
        f"{what}: BMMA GEMV differs from its Q8-planes model (seed {seed})"
    bound = 64 * (1 + 2.0 ** -17) * dx @ np.abs(dw).T                 # (batch, rows)
    err = np.abs(y - x.astype(np.float64) @ W.T)
    assert np.all(err <= bound + 2e-5 * absum + 1e-30), \
        f"{what}: error {err.max():.3g} exceeds the per-128 int8 rounding bound (seed {seed})"


def test_quantize_q8_planes_bit_exact(device, rng, seed):
    x = rng.standard_normal((3, 384)).astype(np.float32) * 10.0 ** rng.uniform(-3, 3, (3, 1))
    x[1, :128] = 0.0                                  # amax 0: q = 0, d = 0
    x[2, 128:256] = 0.5                               # constant group: q = 127 everywhere
    x[0, :6] = [0.5, -0.5, 1.5, -2.5, 127.0, -127.0]
    got = quantize_q8_planes(x).numpy()
    assert got.shape == (3, q8_planes_bytes(384))
    assert np.array_equal(got, reference_q8_planes(x)), f"planes bytes differ (seed {seed})"
    q, dx, _ = dequantize_q8_planes(got, 384)
    assert np.all(np.abs(q * np.repeat(dx, 128, axis=1) - x) <= np.repeat(dx, 128, axis=1) / 2
                  * (1 + 2.0 ** -17)), f"planes decode (seed {seed})"


@pytest.mark.parametrize("rows,blocks,batch", [(1, 1, 1), (15, 2, 2), (17, 3, 1), (33, 4, 8),
                                             (20, 8, 2)])
def test_gemv_q1_0_shapes(device, rng, seed, rows, blocks, batch):
    """One block (u16 rows), odd and even block counts, rows around the 16-row tile, a
    multiple of 8 blocks (the shared-memory stage)."""
    n = 128 * blocks
    raw, dw = q1_0_weights(rng, rows, n)
    x = rng.standard_normal((batch, n)).astype(np.float32)
    y = gemv(raw, "Q1_0", x).numpy()
    check(y, raw, dw, x, seed, f"{rows}x{n} batch {batch}")


@pytest.mark.parametrize("config,blocks", [(Q1Config(4, 2, 1, 2, 0), 14),
                                           (Q1Config(2, 1, 2, 3, 0), 14),
                                           (Q1Config(4, 4, 1, 1, 0), 14),
                                           (Q1Config(4, 2, 1, 1, 2), 24),
                                           (Q1Config(1, 1, 2, 1, 4), 16),
                                           (Q1Config(2, 1, 1, 1, 3), 40),
                                           (Q1Config(2, 1, 1, 1, 2, 8), 24),
                                           (Q1Config(4, 2, 1, 1, 1, 16), 32)])
def test_gemv_q1_0_launch_shapes(device, rng, seed, config, blocks):
    """K split with a shared-memory reduction, two tiles per warp, unrolled trips plus a
    remainder (direct loads, 14 blocks); the cp.async ring with the split and a round where
    one warp of the split has no chunk (24 blocks), deeper than the chunk count with two tiles
    (16 blocks), wrapping around (40 blocks = 5 chunks, 3 stages); the bulk-copy ring (3 chunks
    through 2 stages; 16-block chunks, one stage, K split). Into a poisoned output; the
    residual mode with res aliasing y."""
    rows, n = 37, 128 * blocks
    raw, dw = q1_0_weights(rng, rows, n)
    x = rng.standard_normal((2, n)).astype(np.float32)
    w = weight_words(raw, "Q1_0", n)[0]
    xp = quantize_q8_planes(x)
    y = pk.full((2, rows), np.nan, np.float32)
    gemv_q1_0_into(w, xp, y, rows, n, 2, config=config)
    plain = y.numpy()
    check(plain, raw, dw, x, seed, str(config))
    res = rng.standard_normal((2, rows)).astype(np.float32)
    y2 = pk.to_device(res)
    gemv_q1_0_into(w, xp, y2, rows, n, 2, res=y2, mode="residual", config=config)
    assert np.allclose(y2.numpy(), plain + res, rtol=1e-6, atol=1e-6), \
        f"residual {config} (seed {seed})"


def test_gemv_q1_0_fused_modes(device, rng, seed):
    rows, n = 19, 256
    (gate, _), (up, _) = q1_0_weights(rng, rows, n), q1_0_weights(rng, rows, n)
    x = rng.standard_normal((2, n)).astype(np.float32)
    res = rng.standard_normal((2, rows)).astype(np.float32)
    g = gemv(gate, "Q1_0", x).numpy().astype(np.float64)
    u = gemv(up, "Q1_0", x).numpy().astype(np.float64)
    swiglu = gemv_glu(gate, up, "Q1_0", x, "swiglu").numpy()
    geglu = gemv_glu(gate, up, "Q1_0", x, "geglu").numpy()
    added = gemv_residual(gate, "Q1_0", x, res).numpy()
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    tol = 1e-5 * (np.abs(g) + 1) * (np.abs(u) + 1)
    assert np.all(np.abs(swiglu - g / (1 + np.exp(-g)) * u) <= tol), f"swiglu (seed {seed})"
    assert np.all(np.abs(geglu - gelu * u) <= tol), f"geglu (seed {seed})"
    assert np.all(np.abs(added - (g + res)) <= 1e-5 * (np.abs(g) + np.abs(res))), \
        f"residual (seed {seed})"


@pytest.mark.parametrize("config", [Q1Config(2, 1, 1, 1, 3), Q1Config(4, 2, 1, 1, 2),
                                    Q1Config(2, 1, 1, 1, 2, 8)])
def test_gemv_q1_0_ring_glu(device, rng, seed, config):
    """swiglu through the ring (gate and up rows share each stage), 20 rows x 24 blocks, into a
    poisoned output, against the plain GEMVs of the two matrices in the same launch shape (the
    same summation order: a K split adds the partial sums in another order than no split)."""
    rows, n = 20, 128 * 24
    (gate, _), (up, _) = q1_0_weights(rng, rows, n), q1_0_weights(rng, rows, n)
    x = rng.standard_normal((2, n)).astype(np.float32)
    xp = quantize_q8_planes(x)
    wg, wu = weight_words(gate, "Q1_0", n)[0], weight_words(up, "Q1_0", n)[0]
    plain = [pk.full((2, rows), np.nan, np.float32) for _ in range(3)]
    gemv_q1_0_into(wg, xp, plain[0], rows, n, 2, config=config)
    gemv_q1_0_into(wu, xp, plain[1], rows, n, 2, config=config)
    gemv_q1_0_into(wg, xp, plain[2], rows, n, 2, w2=wu, mode="swiglu", config=config)
    g, u = (a.numpy().astype(np.float64) for a in plain[:2])
    tol = 1e-5 * (np.abs(g) + 1) * (np.abs(u) + 1)
    assert np.all(np.abs(plain[2].numpy() - g / (1 + np.exp(-g)) * u) <= tol), \
        f"ring swiglu {config} (seed {seed})"


def test_gemv_q1_0_rejects_bad_input(device, rng):
    raw, _ = q1_0_weights(rng, 4, 256)
    w = weight_words(raw, "Q1_0", 256)[0]
    xp = quantize_q8_planes(np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError, match="Q8 planes"):
        gemv_q1_0_into(w, xp, pk.empty((2, 4), np.float32), 4, 256, 2)
    with pytest.raises(ValueError, match="batch 9"):
        gemv_q1_0_into(w, xp, pk.empty((9, 4), np.float32), 4, 256, 9)
    with pytest.raises(ValueError, match="multiple of 128"):
        quantize_q8_planes(np.zeros((1, 200), np.float32))


GPU_CONFIGS = [Q1Config(4, 1, 1, 4, 0), Q1Config(16, 16, 1, 1, 0), Q1Config(4, 2, 2, 2, 2),
               Q1Config(1, 1, 1, 1, 2), Q1Config(2, 1, 1, 1, 3), Q1Config(4, 1, 1, 1, 4),
               Q1Config(2, 1, 2, 1, 3), Q1Config(4, 2, 1, 1, 3), Q1Config(8, 8, 1, 1, 3),
               Q1Config(16, 16, 1, 1, 2), Q1Config(16, 8, 1, 1, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n", [(300, 4096), (4096, 14336), (300, 128 * 33)])
def test_gpu_gemv_q1_0_model_shapes(rng, seed, rows, n):
    """The shipped GPU configuration (short and long rows, odd block count) at batch 1, 2, 8,
    and the candidate launch shapes (ring and direct) at batch 1 and 2."""
    pk.set_device("cuda")
    raw, dw = q1_0_weights(rng, rows, n)
    for batch in (1, 2, 8):
        x = rng.standard_normal((batch, n)).astype(np.float32)
        check(gemv(raw, "Q1_0", x).numpy(), raw, dw, x, seed, f"{rows}x{n} batch {batch}")
    w = weight_words(raw, "Q1_0", n)[0]
    for batch in (1, 2):
        x = rng.standard_normal((batch, n)).astype(np.float32)
        xp = quantize_q8_planes(x)
        for config in GPU_CONFIGS:
            y = pk.full((batch, rows), np.nan, np.float32)
            gemv_q1_0_into(w, xp, y, rows, n, batch, config=config)
            check(y.numpy(), raw, dw, x, seed, f"{rows}x{n} batch {batch} {config}")


BULK_CONFIGS = [Q1Config(4, 1, 1, 1, 2, 8), Q1Config(4, 1, 1, 1, 1, 32),
                Q1Config(2, 1, 2, 1, 3, 16), Q1Config(7, 7, 1, 1, 2, 16),
                Q1Config(4, 2, 1, 1, 2, 8), Q1Config(1, 1, 1, 1, 2, 32),
                Q1Config(2, 1, 1, 1, 1, 32)]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,n", [(300, 4096), (4096, 14336)])
def test_gpu_gemv_q1_0_bulk(rng, seed, rows, n):
    """The bulk-copy ring (pk.bulk_copy + mbarriers; 32-block chunks fall back to 8 at 14336
    values) at batch 1 and 2 into poisoned outputs, and swiglu through it against the two
    plain GEMVs of the same launch shape."""
    pk.set_device("cuda")
    raw, dw = q1_0_weights(rng, rows, n)
    w = weight_words(raw, "Q1_0", n)[0]
    for batch in (1, 2):
        x = rng.standard_normal((batch, n)).astype(np.float32)
        xp = quantize_q8_planes(x)
        for config in BULK_CONFIGS:
            y = pk.full((batch, rows), np.nan, np.float32)
            gemv_q1_0_into(w, xp, y, rows, n, batch, config=config)
            check(y.numpy(), raw, dw, x, seed, f"{rows}x{n} batch {batch} {config}")
    up, _ = q1_0_weights(rng, rows, n)
    wu = weight_words(up, "Q1_0", n)[0]
    x = rng.standard_normal((1, n)).astype(np.float32)
    xp = quantize_q8_planes(x)
    config = BULK_CONFIGS[0]
    out = [pk.full((1, rows), np.nan, np.float32) for _ in range(3)]
    gemv_q1_0_into(w, xp, out[0], rows, n, 1, config=config)
    gemv_q1_0_into(wu, xp, out[1], rows, n, 1, config=config)
    gemv_q1_0_into(w, xp, out[2], rows, n, 1, w2=wu, mode="swiglu", config=config)
    g, u = (a.numpy().astype(np.float64) for a in out[:2])
    tol = 1e-5 * (np.abs(g) + 1) * (np.abs(u) + 1)
    assert np.all(np.abs(out[2].numpy() - g / (1 + np.exp(-g)) * u) <= tol), \
        f"bulk swiglu {config} (seed {seed})"
