"""RoPE (normal / NEOX, partial rotary dim, freq factors, offsets) and the fused
RoPE + KV-cache write, vs float64 numpy references (CPU and GPU)."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import rotary as R


def angle_tol(positions):
    # f32 angles: absolute error ~ position * 2^-24 (as in llama.cpp), plus rounding of x
    return 4e-7 * (float(np.max(positions)) + 8) + 1e-6


@pytest.mark.parametrize("style", ["normal", "neox"])
@pytest.mark.parametrize("tokens,heads,head_dim,rot_dim,factors", [
    (3, 4, 64, None, False), (2, 3, 10, 6, True), (1, 2, 128, 64, True), (5, 1, 2, None, False)])
def test_rope_matches_reference(device, rng, seed, style, tokens, heads, head_dim, rot_dim,
                                factors):
    x = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    pos = rng.integers(0, 300, tokens).astype(np.int32)
    ff = rng.uniform(1, 8, (rot_dim or head_dim) // 2).astype(np.float32) if factors else None
    theta = float(rng.choice([10000.0, 1e6]))
    out = R.rope(x, pos, theta, style, rot_dim=rot_dim, freq_factors=ff, pos_offset=7,
                 out=pk.full(x.shape, np.nan, np.float32)).numpy()
    ref = R.rope_reference(x, pos, theta, style, rot_dim, ff, pos_offset=7)
    err = np.max(np.abs(out - ref))
    assert err < angle_tol(pos + 7), f"seed={seed} err {err}"
    if rot_dim:
        assert np.array_equal(out[..., rot_dim:], x[..., rot_dim:]), f"seed={seed}"


def test_rope_in_place_f16(device, rng, seed):
    x = rng.standard_normal((2, 3, 32)).astype(np.float16)
    pos = np.array([0, 41], np.int32)
    arr = pk.to_device(x)
    R.rope(arr, pos, 10000.0, "neox", out=arr)
    ref = R.rope_reference(x, pos, 10000.0, "neox")
    assert np.allclose(arr.numpy(), ref, atol=3e-3), f"seed={seed}"
    assert np.allclose(R.rope(x, np.zeros(2, np.int32)).numpy(), x), "position 0 is identity"


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("style", ["normal", "neox"])
def test_rope_kv_cache_writes_slots(device, rng, seed, cache_dtype, style):
    tokens, q_heads, kv_heads, head_dim, max_len = 3, 4, 2, 16, 40
    q, k, v = (rng.standard_normal((tokens, h, head_dim)).astype(np.float32)
               for h in (q_heads, kv_heads, kv_heads))
    pos = np.array([5, 6, 39], np.int32)
    positions = pk.to_device(pos)   # device array: a CUDA graph replays with new contents
    ck = pk.full((kv_heads, max_len, head_dim), np.nan, cache_dtype)
    cv = pk.full((kv_heads, max_len, head_dim), np.nan, cache_dtype)
    qd = pk.to_device(q)
    R.rope_kv_cache(k, v, ck, cv, positions, R.RopeSpec(5e5, style, 8), q=qd)
    tol = angle_tol(pos) + (2e-3 if cache_dtype == np.float16 else 0)
    kr = R.rope_reference(k, pos, 5e5, style, 8)
    ckn, cvn = ck.numpy(), cv.numpy()
    for t, p in enumerate(pos):
        assert np.max(np.abs(ckn[:, p] - kr[t])) < tol, f"seed={seed} token {t}"
        assert np.allclose(cvn[:, p], v[t], atol=tol), f"seed={seed} token {t}"
    untouched = np.delete(np.arange(max_len), pos)
    assert np.isnan(ckn[:, untouched]).all() and np.isnan(cvn[:, untouched]).all()
    assert np.max(np.abs(qd.numpy() - R.rope_reference(q, pos, 5e5, style, 8))) < tol
    positions.copy_from(np.array([0, 1, 45], np.int32))   # slot 45 >= max_len: skipped
    R.rope_kv_cache(k, v, ck, cv, positions, R.RopeSpec(5e5, style, 8))
    assert np.allclose(cv.numpy()[:, 1], v[1], atol=tol)


@pytest.mark.parametrize("style", ["normal", "neox"])
def test_rope_kv_cache_spec_freq_factors_and_offset(device, rng, seed, style):
    # every RopeSpec field reaches the launch: Llama 3.1's freq_factors divide the
    # frequencies, pos_offset moves both the angle and the cache slot (slot pos + offset)
    tokens, q_heads, kv_heads, head_dim, max_len, offset = 3, 2, 1, 16, 24, 5
    q, k, v = (rng.standard_normal((tokens, h, head_dim)).astype(np.float32)
               for h in (q_heads, kv_heads, kv_heads))
    ff = rng.uniform(1.0, 8.0, 6).astype(np.float32)
    pos = np.array([0, 7, 18], np.int32)         # 18 + 5 = 23: the last slot
    ck, cv = (pk.full((kv_heads, max_len, head_dim), np.nan, np.float32) for _ in range(2))
    qd = pk.to_device(q)
    R.rope_kv_cache(k, v, ck, cv, pk.to_device(pos),
                    R.RopeSpec(1e4, style, 12, freq_factors=ff, pos_offset=offset), q=qd)
    tol = angle_tol(pos + offset)
    want_q = R.rope_reference(q, pos, 1e4, style, 12, ff, pos_offset=offset)
    want_k = R.rope_reference(k, pos, 1e4, style, 12, ff, pos_offset=offset)
    assert np.max(np.abs(qd.numpy() - want_q)) < tol, f"q (seed {seed})"
    for t, p in enumerate(pos + offset):
        assert np.max(np.abs(ck.numpy()[:, p] - want_k[t])) < tol, f"k {t} (seed {seed})"
        np.testing.assert_array_equal(cv.numpy()[:, p], v[t], f"v {t} (seed {seed})")
    assert np.isnan(np.delete(ck.numpy(), pos + offset, axis=1)).all()
    with pytest.raises(ValueError, match="freq_factors has 6 entries, needs 8"):
        R.rope_kv_cache(k, v, ck, cv, pk.to_device(pos), R.RopeSpec(freq_factors=ff), q=qd)
    with pytest.raises(TypeError, match="must be a RopeSpec"):
        R.rope_kv_cache(k, v, ck, cv, pk.to_device(pos), 1e4)


@pytest.mark.parametrize("style", ["normal", "neox"])
def test_rope_mscale_scales_the_rotated_dims_only(device, rng, seed, style):
    # YaRN's magnitude scale multiplies cos and sin (ggml's rope_yarn), so the rotated dims
    # and not the copied ones, in the plain launch and the fused cache write alike
    tokens, heads, head_dim, rot_dim, mscale = 3, 2, 16, 12, float(rng.uniform(1.05, 1.5))
    x = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
    pos = rng.integers(0, 200, tokens).astype(np.int32)
    want = R.rope_reference(x, pos, 1e4, style, rot_dim, mscale=mscale)
    got = R.rope(x, pos, 1e4, style, rot_dim=rot_dim, mscale=mscale,
                 out=pk.full(x.shape, np.nan, np.float32)).numpy()
    tol = angle_tol(pos) * mscale
    assert np.max(np.abs(got - want)) < tol, f"seed={seed}"
    np.testing.assert_array_equal(got[..., rot_dim:], x[..., rot_dim:])
    ck, cv = (pk.full((heads, 256, head_dim), np.nan, np.float32) for _ in range(2))
    qd = pk.to_device(x)
    R.rope_kv_cache(x, x, ck, cv, pk.to_device(pos),
                    R.RopeSpec(1e4, style, rot_dim, mscale=mscale), q=qd)
    assert np.max(np.abs(qd.numpy() - want)) < tol, f"seed={seed}"
    for t, p in enumerate(pos):
        assert np.max(np.abs(ck.numpy()[:, p] - want[t])) < tol, f"seed={seed} token {t}"


@pytest.mark.parametrize("style", ["normal", "neox"])
def test_rope_kv_cache_cols_matches_separate_arrays(device, rng, seed, style):
    # the fused projection's output read in place (q | k | v columns of a wider row, plus
    # 5 columns after them that must stay as they are): same cache rows and rotated q as
    # rope_kv_cache on the three copied blocks
    tokens, q_heads, kv_heads, head_dim, max_len = 5, 4, 2, 16, 12
    width = (q_heads + 2 * kv_heads) * head_dim + 5
    qkv = rng.standard_normal((tokens, width)).astype(np.float32)
    nq, nkv = q_heads * head_dim, kv_heads * head_dim
    q, k, v = (qkv[:, a:b].reshape(tokens, -1, head_dim).copy()
               for a, b in ((0, nq), (nq, nq + nkv), (nq + nkv, nq + 2 * nkv)))
    positions = pk.to_device(np.array([3, 4, 5, 6, 7], np.int32))
    caches = [pk.full((kv_heads, max_len, head_dim), np.nan, np.float32) for _ in range(4)]
    qd = pk.to_device(q)
    spec = R.RopeSpec(1e4, style, rot_dim=12)
    R.rope_kv_cache(k, v, caches[0], caches[1], positions, spec, q=qd)
    qkvd = pk.to_device(qkv)
    R.rope_kv_cache_cols(qkvd, q_heads, kv_heads, head_dim, caches[2], caches[3], positions,
                         spec)
    got = qkvd.numpy()
    np.testing.assert_array_equal(got[:, :nq], qd.numpy().reshape(tokens, nq))
    np.testing.assert_array_equal(got[:, nq:], qkv[:, nq:])          # k, v, the rest: as given
    np.testing.assert_array_equal(caches[2].numpy(), caches[0].numpy())
    np.testing.assert_array_equal(caches[3].numpy(), caches[1].numpy())
    with pytest.raises(ValueError, match="qkv must be float32"):
        R.rope_kv_cache_cols(qkvd, q_heads + 1, kv_heads, head_dim, caches[2], caches[3],
                             positions)


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
def test_rope_kv_cache_cols_one_sequence_per_token(device, rng, seed, cache_dtype):
    # batched decode: token t of the fused projection belongs to sequence t, at its own
    # position, in cache_k[t] / cache_v[t] of (tokens, kv_heads, max_len, head_dim) caches;
    # its rotated q goes to q_out and qkv stays as it was. Each sequence alone through
    # rope_kv_cache on its own 3-d cache is the reference
    tokens, q_heads, kv_heads, head_dim, max_len = 3, 6, 2, 32, 9
    width = (q_heads + 2 * kv_heads) * head_dim + 3
    qkv = rng.standard_normal((tokens, width)).astype(np.float32)
    nq, nkv = q_heads * head_dim, kv_heads * head_dim
    pos = np.array([8, 0, 4], np.int32)
    ck = pk.full((tokens, kv_heads, max_len, head_dim), np.nan, cache_dtype)
    cv = pk.full((tokens, kv_heads, max_len, head_dim), np.nan, cache_dtype)
    q_out = pk.full((tokens, nq), np.nan, np.float32)
    qkvd = pk.to_device(qkv)
    R.rope_kv_cache_cols(qkvd, q_heads, kv_heads, head_dim, ck, cv, pk.to_device(pos),
                         R.RopeSpec(1e4, "neox"), q_out=q_out)
    np.testing.assert_array_equal(qkvd.numpy(), qkv)
    for t in range(tokens):
        one = [pk.full((kv_heads, max_len, head_dim), np.nan, cache_dtype) for _ in range(2)]
        q = pk.to_device(qkv[t:t + 1, :nq].reshape(1, q_heads, head_dim))
        R.rope_kv_cache(qkv[t:t + 1, nq:nq + nkv].reshape(1, kv_heads, head_dim),
                        qkv[t:t + 1, nq + nkv:nq + 2 * nkv].reshape(1, kv_heads, head_dim),
                        one[0], one[1], pk.to_device(pos[t:t + 1]), R.RopeSpec(1e4, "neox"),
                        q=q)
        np.testing.assert_array_equal(q_out.numpy()[t], q.numpy().reshape(-1),
                                      err_msg=f"seed {seed} token {t}")
        np.testing.assert_array_equal(ck.numpy()[t], one[0].numpy(), f"seed {seed} token {t}")
        np.testing.assert_array_equal(cv.numpy()[t], one[1].numpy(), f"seed {seed} token {t}")
    with pytest.raises(ValueError, match=r"must be \(3, 2, max_len, 32\)"):
        R.rope_kv_cache_cols(qkvd, q_heads, kv_heads, head_dim, ck[:2], cv[:2],
                             pk.to_device(pos))
    with pytest.raises(ValueError, match="q_out must be float32"):
        R.rope_kv_cache_cols(qkvd, q_heads, kv_heads, head_dim, ck, cv, pk.to_device(pos),
                             q_out=pk.zeros((tokens, nq - 1), np.float32))


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
def test_rope_kv_cache_cols_slot_table(device, rng, seed, cache_dtype):
    # several prompts in one pass: token t's rows go to slot slots[t] of (n_slots, kv_heads,
    # max_len, head_dim) caches at its own position (q rotated in place); each prompt alone
    # through rope_kv_cache_cols on its own slot is the reference, other slots untouched
    q_heads, kv_heads, head_dim, max_len = 4, 2, 32, 12
    slots = np.array([3, 3, 3, 0, 2, 2], np.int32)          # prompts of 3, 1 and 2 tokens
    pos = np.array([5, 6, 7, 0, 9, 10], np.int32)
    tokens, width = len(slots), (q_heads + 2 * kv_heads) * head_dim + 5
    qkv = rng.standard_normal((tokens, width)).astype(np.float32)
    ck = pk.full((4, kv_heads, max_len, head_dim), np.nan, cache_dtype)
    cv = pk.full((4, kv_heads, max_len, head_dim), np.nan, cache_dtype)
    qkvd = pk.to_device(qkv)
    R.rope_kv_cache_cols(qkvd, q_heads, kv_heads, head_dim, ck, cv, pk.to_device(pos),
                         R.RopeSpec(1e4, "normal"), slots=slots)
    for first, n in ((0, 3), (3, 1), (4, 2)):
        slot = int(slots[first])
        one = [pk.full((kv_heads, max_len, head_dim), np.nan, cache_dtype) for _ in range(2)]
        alone = pk.to_device(qkv[first:first + n])
        R.rope_kv_cache_cols(alone, q_heads, kv_heads, head_dim, one[0], one[1],
                             pk.to_device(pos[first:first + n]), R.RopeSpec(1e4, "normal"))
        np.testing.assert_array_equal(qkvd.numpy()[first:first + n], alone.numpy(),
                                      err_msg=f"seed {seed} prompt at {first}")
        np.testing.assert_array_equal(ck.numpy()[slot], one[0].numpy(), f"seed {seed}")
        np.testing.assert_array_equal(cv.numpy()[slot], one[1].numpy(), f"seed {seed}")
    assert np.isnan(ck.numpy()[1]).all() and np.isnan(cv.numpy()[1]).all()
    with pytest.raises(ValueError, match=r"slots must be 6 ints in 0..3"):
        R.rope_kv_cache_cols(qkvd, q_heads, kv_heads, head_dim, ck, cv, pk.to_device(pos),
                             slots=np.array([0, 0, 0, 0, 0, 4]))
    with pytest.raises(ValueError, match="slots_dev must be 6 int32"):
        R.rope_kv_cache_cols(qkvd, q_heads, kv_heads, head_dim, ck, cv, pk.to_device(pos),
                             slots=slots, slots_dev=pk.to_device(slots[:5]))


def rms_reference(x, weight, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


@pytest.mark.parametrize("cache_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("style,head_dim,rot_dim", [("neox", 128, None), ("normal", 64, 32),
                                                    ("neox", 256, None)])
def test_rope_kv_cache_with_head_norms(device, rng, seed, cache_dtype, style, head_dim, rot_dim):
    # qwen3 / gemma3: each q and k head RMS-normalized (weights q_norm / k_norm) before the
    # rotation, in the same launch; inputs of very different scales per head
    tokens, q_heads, kv_heads, max_len = 2, 6, 2, 9
    q, k, v = ((rng.standard_normal((tokens, h, head_dim)) *
                10.0 ** rng.uniform(-2, 2, (tokens, h, 1))).astype(np.float32)
               for h in (q_heads, kv_heads, kv_heads))
    wq, wk = (rng.uniform(0.5, 2.0, head_dim).astype(np.float32) for _ in range(2))
    pos = np.array([3, 8], np.int32)
    ck = pk.full((kv_heads, max_len, head_dim), np.nan, cache_dtype)
    cv = pk.full((kv_heads, max_len, head_dim), np.nan, cache_dtype)
    qd = pk.to_device(q)
    R.rope_kv_cache(k, v, ck, cv, pk.to_device(pos), R.RopeSpec(1e6, style, rot_dim), q=qd,
                    norms=R.HeadNorms(wq, wk, 1e-6))
    tol = angle_tol(pos) * 4 + (4e-3 if cache_dtype == np.float16 else 0)
    q_ref = R.rope_reference(rms_reference(q, wq, 1e-6), pos, 1e6, style, rot_dim)
    k_ref = R.rope_reference(rms_reference(k, wk, 1e-6), pos, 1e6, style, rot_dim)
    assert np.max(np.abs(qd.numpy() - q_ref)) < tol, f"q (seed {seed})"
    for t, p in enumerate(pos):
        assert np.max(np.abs(ck.numpy()[:, p] - k_ref[t])) < tol, f"k token {t} (seed {seed})"
        # v is stored as given, rounded to the cache's type (round to nearest even, as numpy;
        # a relative bound fails on f16's subnormals, which the per-head scales reach)
        assert np.array_equal(cv.numpy()[:, p], v[t].astype(cache_dtype)), \
            f"v token {t} (seed {seed})"
    with pytest.raises(ValueError, match="with both weights"):
        R.rope_kv_cache(k, v, ck, cv, pk.to_device(pos), q=qd, norms=R.HeadNorms(wq, None))
    with pytest.raises(ValueError, match="expected head_dim"):
        R.rope_kv_cache(k, v, ck, cv, pk.to_device(pos), q=qd, norms=R.HeadNorms(wq[:8], wk))


def test_rope_errors(device):
    x = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="style"):
        R.rope(x, np.zeros(2, np.int32), style="gptj")
    with pytest.raises(ValueError, match="positions for 2 tokens"):
        R.rope(x, np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="rot_dim"):
        R.rope(x, np.zeros(2, np.int32), rot_dim=5)


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_rope_qkv_cache_slot_table_ptx_assembles(arch, assemble):
    """rope_qkv_cache with a slot per token (SLOTS): PTX that ptxas accepts for every arch."""
    ptx = R.rope_qkv_cache.ptx(arch, HAS_Q=True, HAS_FF=False, NEOX=True, T=pk.f32,
                               C=pk.f16, NORM=False, Q8=False, SLOTS=True)
    assemble(ptx, arch)

