"""The runner's Q8_0 KV cache on the device: rows quantized as ggml does (bit for bit against the
host quantizer, itself checked against ggml's bytes), the fused RoPE + cache write into it, and
the rows read back as f16 for prefill (CPU target and GPU)."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import rotary as R
from stdlib_kernels.attention import kv_q8


def assert_rows_equal(cache, expected: kv_q8.Q8Cache, positions, what: str):
    """cache's rows `positions` hold exactly expected's quants and f16 scale bits."""
    got_q = cache.quants.numpy()[:, positions]
    got_d = cache.scales.numpy()[:, positions].view(np.uint16)
    assert np.array_equal(got_q, expected.quants.numpy()), f"{what}: quants differ"
    assert np.array_equal(got_d, expected.scales.numpy().view(np.uint16)), \
        f"{what}: scales differ"


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_store_rows_and_read_back(device, rng, seed, head_dim):
    tokens, n_kv, max_len, start = 4, 3, 11, 6
    scale = rng.uniform(1e-3, 30.0, (tokens, n_kv, 1))      # rows of very different ranges
    k = (rng.standard_normal((tokens, n_kv, head_dim)) * scale).astype(np.float32)
    v = rng.standard_normal((tokens, n_kv, head_dim)).astype(np.float32)
    k[0, 1, :32] = 0.0                                      # an all-zero block: d = 0, q = 0
    v[1, 0, :32] = np.clip(v[1, 0, :32], -100, 100)         # d = 1: halves round away from 0
    v[1, 0, :4] = [127.0, 2.5, -3.5, 0.5]                   # (roundf, not round-to-even)
    ck, cv = (kv_q8.allocate((n_kv, max_len, head_dim)) for _ in range(2))
    kv_q8.store_rows(pk.to_device(k), pk.to_device(v), ck, cv,
                     pk.to_device(np.array([start], np.int32)))
    rows = list(range(start, start + tokens))
    for got, x, what in ((ck, k, "k"), (cv, v, "v")):
        assert_rows_equal(got, kv_q8.quantize_kv(x.transpose(1, 0, 2)), rows,
                          f"{what} (seed {seed})")
    # slots past the cache (start + t >= max_len) are skipped: a start near the end
    kv_q8.store_rows(pk.to_device(k), pk.to_device(v), ck, cv,
                     pk.to_device(np.array([max_len - 1], np.int32)))
    assert_rows_equal(ck, kv_q8.quantize_kv(k[:1].transpose(1, 0, 2)), [max_len - 1],
                      f"last slot (seed {seed})")
    out = pk.full((n_kv, max_len + 3, head_dim), np.nan, np.float16)
    kv_q8.dequantize_into(ck, out, max_len)
    with np.errstate(over="ignore", invalid="ignore"):   # never-written rows hold any bytes
        expected16 = kv_q8.dequantize_kv(ck)[:, :max_len].astype(np.float16)
    got = out.numpy()
    written = rows[:max_len - 1 - start] + [max_len - 1]
    assert np.array_equal(got[:, written], expected16[:, written]), f"seed {seed}"
    assert np.isnan(got[:, max_len:]).all(), "rows past n_rows were written"


@pytest.mark.parametrize("style,head_dim,norms", [("normal", 64, False), ("neox", 128, True),
                                                  ("neox", 256, False)])
def test_rope_kv_cache_into_q8_0(device, rng, seed, style, head_dim, norms):
    """The fused RoPE + cache write into a Q8_0 cache stores exactly ggml's Q8_0 of what it
    stores into an f32 cache (rotated k, copied v), q rotated in place the same way."""
    tokens, q_heads, kv_heads, max_len = 3, 4, 2, 9
    q, k, v = (rng.standard_normal((tokens, h, head_dim)).astype(np.float32)
               for h in (q_heads, kv_heads, kv_heads))
    pos = np.array([2, 3, 7], np.int32)
    extra = {}
    if norms:
        extra = {"norms": R.HeadNorms(*(rng.uniform(0.5, 2.0, head_dim).astype(np.float32)
                                        for _ in range(2)))}
    ck32, cv32 = (pk.zeros((kv_heads, max_len, head_dim), np.float32) for _ in range(2))
    q32 = pk.to_device(q)
    R.rope_kv_cache(k, v, ck32, cv32, pos, R.RopeSpec(1e6, style), q=q32, **extra)
    ck, cv = (kv_q8.allocate((kv_heads, max_len, head_dim)) for _ in range(2))
    q8 = pk.to_device(q)
    R.rope_kv_cache(k, v, ck, cv, pk.to_device(pos), R.RopeSpec(1e6, style), q=q8, **extra)
    for got, f32_cache, what in ((ck, ck32, "k"), (cv, cv32, "v")):
        assert_rows_equal(got, kv_q8.quantize_kv(f32_cache.numpy()[:, pos]), pos,
                          f"{what} (seed {seed})")
    assert np.array_equal(q8.numpy(), q32.numpy()), f"q (seed {seed})"


def test_q8_0_cache_errors(device):
    ck = kv_q8.allocate((2, 8, 64))
    with pytest.raises(ValueError, match="head_dim a multiple of 32"):
        kv_q8.allocate((2, 8, 80))
    with pytest.raises(ValueError, match="two Q8Cache"):
        R.rope_kv_cache(np.zeros((1, 2, 64), np.float32), np.zeros((1, 2, 64), np.float32),
                        ck, pk.zeros((2, 8, 64), np.float16), np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="float16"):
        kv_q8.dequantize_into(ck, pk.zeros((2, 8, 64), np.float32), 8)
