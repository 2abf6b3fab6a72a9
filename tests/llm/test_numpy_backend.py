"""numpy backend pieces against direct definitions: dequantizers (bit-exact vs ggml's own output),
activation-quantization emulation, RoPE, attention (causal, GQA, sliding window), norms and
activations, on fresh random inputs with awkward sizes."""
import math
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from llm import step as S
from llm.backends.act_quant import round_trip
from llm.backends.dequant import dequantize
from llm.backends.numpy_backend import NumpyBackend
from llm.config import RopeParams
from tests.llm.gguf_helpers import GOLDEN, require

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_bit_exact_vs_ggml(name):
    oracle = np.load(require(GOLDEN / "ggml-quants-seed1.npz"))
    raw, want = oracle[name], oracle[f"{name}_deq"]
    got = dequantize(raw.reshape(-1), Q[name], want.shape)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q8_0"])
def test_fast_paths_equal_gguf_on_random_bytes(name, rng):
    # random bytes include any f16 scale (subnormal, inf, nan): compare bit patterns
    qtype = Q[name]
    block, size = quants.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (45, 3 * size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        want = quants.dequantize(raw, qtype)
        got = dequantize(raw.reshape(-1), qtype, (45, 3 * block))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_into_fused_rows(rng):
    x = rng.standard_normal((40, 64)).astype(np.float32)
    raw = quants.quantize(x, Q.Q8_0)
    fused = np.full((50, 64), np.nan, dtype=np.float32)
    dequantize(raw.reshape(-1), Q.Q8_0, (40, 64), out=fused[10:])
    assert np.array_equal(fused[10:], quants.dequantize(raw, Q.Q8_0))
    assert np.isnan(fused[:10]).all()


def test_q8_0_activation_round_trip_matches_gguf(rng):
    x = (rng.standard_normal((7, 96)) * rng.uniform(0.01, 10, (7, 1))).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    want = quants.dequantize(quants.quantize(x, Q.Q8_0), Q.Q8_0)
    assert np.array_equal(round_trip(x, "q8_0"), want)


def test_q8_k_activation_round_trip(rng):
    x = rng.standard_normal((3, 512)).astype(np.float32)
    y = round_trip(x, "q8_k")
    step = np.abs(x.reshape(3, 2, 256)).max(-1, keepdims=True) / 127
    assert np.all(np.abs(y - x).reshape(3, 2, 256) <= step / 2 + 1e-6)
    assert len(np.unique(y[0, :256] / step[0, 0])) <= 255


def rope_reference(x, positions, head_dim, p: RopeParams):
    out = x.copy().reshape(len(positions), -1, head_dim)
    half = p.n_rot // 2
    for t, pos in enumerate(positions):
        for i in range(half):
            theta = pos * p.freq_scale * p.base ** (-2 * i / p.n_rot)
            a, b = (i, i + half) if p.neox else (2 * i, 2 * i + 1)
            xa, xb = out[t, :, a].copy(), out[t, :, b].copy()
            out[t, :, a] = xa * math.cos(theta) - xb * math.sin(theta)
            out[t, :, b] = xa * math.sin(theta) + xb * math.cos(theta)
    return out.reshape(x.shape)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [16, 10])
def test_rope(rng, neox, n_rot):
    params = RopeParams(n_rot=n_rot, base=10000.0, neox=neox, freq_scale=0.5)
    x = rng.standard_normal((5, 3 * 16)).astype(np.float32)
    positions = np.array([0, 1, 7, 100, 3001])
    got = NumpyBackend().rope(x.copy(), positions, 16, params)
    assert np.allclose(got, rope_reference(x, positions, 16, params), atol=2e-5)


def attention_reference(q, keys, values, q_pos, n_kv, d, scale, window):
    n, n_head = q.shape[0], q.shape[1] // d
    out = np.zeros((n, n_head * d), dtype=np.float64)
    for t in range(n):
        for h in range(n_head):
            kv = h // (n_head // n_kv)
            allowed = [j for j in range(q_pos[t] + 1) if not window or q_pos[t] - j < window]
            s = np.array([q[t, h * d:(h + 1) * d] @ keys[j, kv] for j in allowed]) * scale
            w = np.exp(s - s.max())
            w /= w.sum()
            out[t, h * d:(h + 1) * d] = sum(wi * values[j, kv] for wi, j in zip(w, allowed))
    return out


@pytest.mark.parametrize("window", [0, 3])
def test_attention_prefill_then_decode(rng, window):
    n_head, n_kv, d, total = 6, 2, 8, 9
    be = NumpyBackend()
    cache = be.kv_cache(1, 16, n_kv, d, d)
    q = rng.standard_normal((total, n_head * d)).astype(np.float32)
    k = rng.standard_normal((total, n_kv * d)).astype(np.float32)
    v = rng.standard_normal((total, n_kv * d)).astype(np.float32)
    out_prefill = be.attention(q[:6], k[:6], v[:6], S.tokens(np.zeros(6), 0), [cache], 0, 0.3,
                               window)
    out_steps = [be.attention(q[t:t + 1], k[t:t + 1], v[t:t + 1], S.tokens([0], t), [cache], 0,
                              0.3, window) for t in range(6, total)]
    got = np.concatenate([out_prefill, *out_steps])
    want = attention_reference(q, k.reshape(total, n_kv, d), v.reshape(total, n_kv, d),
                               np.arange(total), n_kv, d, 0.3, window)
    assert np.allclose(got, want, atol=1e-5)


def test_norms_and_activations(rng):
    be = NumpyBackend()
    x = rng.standard_normal((4, 48)).astype(np.float32)
    w = rng.standard_normal(48).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    rms = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * w
    assert np.allclose(be.rms_norm(x, w, 1e-6), rms, atol=1e-5)
    g = x.reshape(4, 3, 16)
    heads = g / np.sqrt((g ** 2).mean(-1, keepdims=True) + 1e-6) * w[:16]
    assert np.allclose(be.rms_norm(x, w[:16], 1e-6, group=16), heads.reshape(4, 48), atol=1e-5)
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    assert np.allclose(be.layer_norm(x, w, b, 1e-5), ln, atol=1e-5)
    gelu = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    assert np.allclose(be.gelu(x), gelu, atol=1e-6)
    assert np.allclose(be.swiglu(x, w[None]), x / (1 + np.exp(-x)) * w, atol=1e-6)
    assert np.allclose(be.geglu_tanh(x, w[None]), gelu * w, atol=1e-6)


def test_thread_chooser_prefers_measured_faster_count():
    from llm.backends.blas_threads import ThreadChooser, get_threads, set_threads
    chooser = ThreadChooser((1, 2), explore_every=10, trial=2, warmup=2)
    speed = {1: 1.0, 2: 0.5}                      # two threads twice as fast
    picks = []
    for _ in range(60):
        t = chooser.pick()
        picks.append(t)
        chooser.record(t, speed[t] * 100, 100)
    assert picks[:4] == [1, 2, 1, 2] and picks[-30:].count(2) >= 24, picks  # 1 re-tried rarely
    speed[2] = 20.0                               # another process arrives: two threads collapse
    for _ in range(60):
        t = chooser.pick()
        picks.append(t)
        chooser.record(t, speed[t] * 100, 100)
    tail = picks[-40:]
    assert tail.count(1) >= 32, tail              # back on one thread, with rare re-tries of 2
    previous = set_threads(1)
    if previous is not None:                      # numpy's OpenBLAS is reachable here
        assert get_threads() == 1
        set_threads(previous)


def resident_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_kv_cache_memory_is_committed_as_positions_are_written():
    """A fresh cache's first token commits little, not the whole cache (numpy's huge pages
    had committed all of a 8192-token cache, 2 MB per head and layer, at the first token);
    the cache grows to a position written beyond it, keeping what it held."""
    from llm.backends.numpy_backend import NumpyKVCache
    before = resident_kib()
    cache = NumpyKVCache(n_layer=30, n_ctx=8192, n_head_kv=3, head_dim=64, head_dim_v=64)
    assert cache.nbytes == 360 << 20
    cache.reserve(5)
    for k, v in zip(cache.k, cache.v):
        k[:, :5] = 1.0
        v[:, :5] = 2.0
    assert resident_kib() - before < 64 << 10, "more than 64 MiB committed for 5 positions"
    cache.reserve(3000)
    assert cache.rows >= 3000
    assert cache.k[7][:, 5:].max() == 0.0 and cache.v[29][1, :5].min() == 2.0
    assert cache.k[0][:, :5].min() == 1.0
    cache.reserve(10 ** 6)
    assert cache.rows == 8192


def test_attention_over_a_growing_cache_equals_a_preallocated_one(rng, seed, monkeypatch):
    """Prefill then decode steps through the numpy backend's attention, across the cache's
    growth (FIRST_ROWS 4), give exactly the outputs of a cache that never grows."""
    from llm.backends.numpy_backend import NumpyKVCache
    n_kv, d, n_head = 2, 16, 6
    outputs = []
    for first_rows in (64, 4):
        monkeypatch.setattr(NumpyKVCache, "FIRST_ROWS", first_rows)
        cache = NumpyKVCache(n_layer=1, n_ctx=40, n_head_kv=n_kv, head_dim=d, head_dim_v=d)
        gen = np.random.default_rng(seed)
        q, k, v = (gen.standard_normal((7, w), dtype=np.float32)
                   for w in (n_head * d, n_kv * d, n_kv * d))
        got = [NumpyBackend.attention_rows(None, q, k, v, cache, 0, 0, 0.25)]
        for pos in range(7, 30):
            q, k, v = (gen.standard_normal((1, w), dtype=np.float32)
                       for w in (n_head * d, n_kv * d, n_kv * d))
            got.append(NumpyBackend.attention_rows(None, q, k, v, cache, 0, pos, 0.25))
        outputs.append(np.concatenate(got))
    assert cache.rows == 32
    assert np.array_equal(outputs[0], outputs[1]), f"seed {seed}"
