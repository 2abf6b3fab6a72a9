"""The persistent decode kernel (stdlib_kernels/persistent/decode.py) on random F32 weights of
awkward shapes, CPU target: each step's logits and K/V rows against a float64 numpy decode step
(GQA groups, normal and NeoX RoPE, partial rotation, f32 and f16 caches), the schedule's tables
and checks, bad arguments, and ptxas on the kernel for sm_90. Quantized weights against the
runner's decode graphs: tests/llm/test_persistent_runner.py."""
import numpy as np
import pytest

from stdlib_kernels.persistent.decode import decode_kernel
from stdlib_kernels.persistent.decode_runner import DecodeRunner
from stdlib_kernels.persistent.decode_schedule import (
    ATTN,
    GEMV,
    GLU,
    KIND,
    XQ,
    DecodeShape,
    decode_schedule,
)
from stdlib_kernels.persistent.decode_weights import pack_decode_weights
from stdlib_kernels.persistent.schedule import ScheduleError, validate_chain

pytestmark = pytest.mark.usefixtures("cpu_device")
EPS32 = float(np.finfo(np.float32).eps)
THETA = 10000.0


def _weights(rng, shape: DecodeShape) -> dict:
    """Matrices N(0, 1/n_in) and norm weights near 1: activations stay O(1)."""
    out = {}
    for name, dims in shape.weight_shapes().items():
        if len(dims) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(dims) / np.sqrt(dims[-1])).astype(np.float32)
    return out


def _rope(x, pos, rot_dim, neox):
    """x (heads, head_dim) float64 rotated at pos (llama.cpp's angles)."""
    x = x.copy()
    i = np.arange(rot_dim // 2)
    theta = pos * THETA ** (-2.0 * i / rot_dim)
    c, s = np.cos(theta), np.sin(theta)
    d0, d1 = (i, i + rot_dim // 2) if neox else (2 * i, 2 * i + 1)
    a, b = x[:, d0].copy(), x[:, d1].copy()
    x[:, d0], x[:, d1] = a * c - b * s, a * s + b * c
    return x


def _reference_step(t, s: DecodeShape, cache_k, cache_v, token, pos, rot_dim, neox, eps,
                    cache=np.float32):
    """One decode token in float64; writes K/V row pos of the float64 caches (rounded to
    the kernel's cache type); logits."""
    t = {k: v.astype(np.float64) for k, v in t.items()}

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x) + eps) * w

    x = t["token_embd"][token].copy()
    hd, group = s.head_dim, s.n_head // s.n_head_kv
    for il in range(s.n_layer):
        qkv = t[f"blk.{il}.qkv"] @ norm(x, t[f"blk.{il}.attn_norm"])
        q = _rope(qkv[:s.q_rows].reshape(s.n_head, hd), pos, rot_dim, neox)
        k = _rope(qkv[s.q_rows:s.q_rows + s.kv_rows].reshape(-1, hd), pos, rot_dim, neox)
        v = qkv[s.q_rows + s.kv_rows:].reshape(-1, hd)
        if cache == np.float16:
            k, v = k.astype(np.float16).astype(np.float64), v.astype(np.float16).astype(np.float64)
        cache_k[il, :, pos], cache_v[il, :, pos] = k, v
        attn = np.empty((s.n_head, hd))
        for h in range(s.n_head):
            scores = cache_k[il, h // group, :pos + 1] @ q[h] / np.sqrt(hd)
            p = np.exp(scores - scores.max())
            attn[h] = p @ cache_v[il, h // group, :pos + 1] / p.sum()
        x = x + t[f"blk.{il}.attn_out"] @ attn.reshape(-1)
        gu = t[f"blk.{il}.gate_up"] @ norm(x, t[f"blk.{il}.ffn_norm"])
        g, u = gu[:s.n_ff], gu[s.n_ff:]
        x = x + t[f"blk.{il}.down"] @ (g / (1 + np.exp(-g)) * u)
    return t["output"] @ norm(x, t["output_norm"])


# attention splits, granule: (8, 16) one split at these positions, (4, 2) and (3, 1) several
@pytest.mark.parametrize("dims,rot_dim,neox,tile_rows,grid,cache,splits", [
    ((2, 36, 6, 2, 6, 50, 37), 6, False, 5, 3, np.float32, (4, 2)),   # GQA 3:1, odd tiles
    ((1, 32, 4, 4, 8, 24, 19), 4, True, 16, 1, np.float32, (8, 16)),  # MHA, NeoX, half rotated
    ((3, 40, 4, 1, 10, 33, 41), 10, True, 3, 64, np.float32, (3, 1)),  # MQA, blocks > items
    ((2, 36, 6, 2, 6, 50, 37), 6, True, 7, 5, np.float16, (32, 1))])   # the runner's f16 cache
def test_decode_steps_match_numpy(rng, dims, rot_dim, neox, tile_rows, grid, cache, splits):
    """Random prefix in the cache, then 3 tokens: logits and the new K/V rows against float64.
    Bound: the f32 dots along a token's path (stage by stage, lengths summed) each off by at
    most ~n eps/2 relative to the O(1) activations (Higham's gamma_n), to first order adding
    up; x4 for the exp / rsqrt / sin / cos roundings the dots carry along. An f16 cache: the
    reference rounds its new K/V rows to f16 too, so they differ only where the kernel's f32
    value and the float64 one round to neighbouring halves (one f16 ulp, 2^-10 relative),
    which reaches the logits through one attention per layer: that term is added per layer.
    Split attention adds the merge: exp(m_j - M) and the products and sums over the splits,
    a few roundings per split (attn_splits added to the path)."""
    n_ctx, prefix, eps = 16, int(rng.integers(0, 8)), 1e-5
    s = DecodeShape(*dims, n_ctx=n_ctx)
    sched = decode_schedule(s, tile_rows, attn_splits=splits[0], split_rows=splits[1])
    tensors = _weights(rng, s)
    runner = DecodeRunner(sched, pack_decode_weights(sched, tensors), eps=eps,
                          scale=1 / np.sqrt(s.head_dim), rope_theta=THETA, rot_dim=rot_dim,
                          neox=neox, grid=grid, cache_dtype=cache)
    kv = (s.n_layer, s.n_head_kv, n_ctx, s.head_dim)
    cache_k, cache_v = rng.standard_normal(kv), rng.standard_normal(kv)
    for il in range(s.n_layer):
        runner.set_cache(il, cache_k[il, :, :prefix], cache_v[il, :, :prefix])
    cache_k, cache_v = cache_k.astype(cache).astype(np.float64), \
        cache_v.astype(cache).astype(np.float64)
    for pos in range(prefix, prefix + 3):
        token = int(rng.integers(0, s.n_vocab))
        got = runner.step(token, pos).astype(np.float64)
        want = _reference_step(tensors, s, cache_k, cache_v, token, pos, rot_dim, neox, eps,
                               cache)
        path = s.n_layer * (3 * s.n_embd + s.head_dim + pos + 1 + s.q_rows + s.n_ff +
                            splits[0])
        f16_term = 0.0 if cache == np.float32 else 4 * s.n_layer * 2.0 ** -10
        bound = (4 * path * EPS32 + f16_term) * max(1.0, np.abs(want).max())
        assert np.abs(got - want).max() <= bound, (pos, np.abs(got - want).max(), bound)
        for mine, theirs in ((runner.cache_k, cache_k), (runner.cache_v, cache_v)):
            row = mine.numpy()[:, :, pos].astype(np.float64)
            assert np.abs(row - theirs[:, :, pos]).max() <= bound
        assert not runner.counters.numpy().any()


def test_schedule_items_and_stages():
    s = DecodeShape(2, 36, 6, 2, 6, 50, 37, n_ctx=16)
    sched = decode_schedule(s, 5)
    kinds = sched.stages[:, KIND].tolist()
    assert kinds[1:6] == [GEMV, ATTN, GEMV, GLU, GEMV] and len(kinds) == 2 + 5 * 2
    per_stage = np.bincount(sched.items[:, 0])
    # embed 36/5, qkv 60/5, 8 splits of each head, o 36/5, ffn 50/5, down 36/5, then 37/5
    assert per_stage.tolist() == [8] + [12, 6 * 8, 8, 10, 8] * 2 + [8]
    assert sched.counters == 2 + len(kinds) + 6      # + a merge counter per query head
    with pytest.raises(ValueError, match="tile_rows must be positive"):
        decode_schedule(s, 0)
    with pytest.raises(ValueError, match="not a multiple of n_head_kv"):
        DecodeShape(1, 8, 3, 2, 4, 8, 8, 8)
    with pytest.raises(ValueError, match="n_ctx must be positive"):
        DecodeShape(1, 8, 2, 2, 4, 8, 8, 0)
    with pytest.raises(ValueError, match="attn_splits must be in 1..32"):
        decode_schedule(s, 5, attn_splits=33)
    with pytest.raises(ValueError, match="split_rows must be positive"):
        decode_schedule(s, 5, split_rows=0)
    with pytest.raises(ValueError, match="head_dim 264"):
        decode_schedule(DecodeShape(1, 8, 1, 1, 264, 8, 8, 8))


def test_item_plan_per_model():
    """decode_plan's sizes for the two models the issue measures, on an H200's grid of 396:
    no row stage needs more than one round of the grid, one row per warp where that fits
    (SmolLM2), and attention splits that fill at most one round."""
    from stdlib_kernels.persistent.decode import WARPS
    from stdlib_kernels.persistent.decode_plan import plan_items
    small = DecodeShape(30, 576, 9, 3, 64, 1536, 49152, n_ctx=200)
    big = DecodeShape(32, 4096, 32, 8, 128, 14336, 128256, n_ctx=4352)
    for shape, tiles, splits in ((small, (8, 8, 8, 8, 8, 128), 13),
                                 (big, (16, 16, 16, 40, 16, 328), 12)):
        plan = plan_items(shape, 396)
        assert tuple(plan.tile_rows.values()) == tiles and plan.attn_splits == splits
        sched = decode_schedule(shape, plan.tile_rows, None, plan.attn_splits,
                                plan.split_rows)
        per_stage = np.bincount(sched.items[:, 0])
        assert per_stage.max() <= 396 and all(t % WARPS == 0 for t in tiles)
    assert plan_items(DecodeShape(1, 8, 2, 1, 4, 8, 8, 8), 396).attn_splits == 1   # n_ctx 8
    with pytest.raises(ValueError, match="grid must be positive"):
        plan_items(small, 0)
    with pytest.raises(ValueError, match="one per stage"):
        decode_schedule(small, {"qkv": 8})


def test_schedule_checks_reject_broken_waits():
    sched = decode_schedule(DecodeShape(1, 8, 2, 1, 4, 8, 8, 8), 4)
    rows = sched.stages[:, 6].tolist()
    items = sched.items.copy()
    items[5, 4] -= 1                             # waits for one tile fewer than it reads
    with pytest.raises(ScheduleError, match="waits for"):
        validate_chain(items, rows, sched.counters)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate_chain(sched.items[::-1].copy(), rows, sched.counters)


def test_bad_arguments_are_named(rng):
    s = DecodeShape(1, 8, 2, 1, 4, 8, 8, 8)
    sched = decode_schedule(s, 4)
    flat = pack_decode_weights(sched, _weights(rng, s))
    with pytest.raises(ValueError, match="uint8 with"):
        DecodeRunner(sched, flat[:-1], eps=1e-5, scale=0.5, rope_theta=THETA, rot_dim=4,
                     neox=False)
    with pytest.raises(ValueError, match="cache_dtype"):
        DecodeRunner(sched, flat, eps=1e-5, scale=0.5, rope_theta=THETA, rot_dim=4, neox=False,
                     cache_dtype=np.int8)
    with pytest.raises(ValueError, match="reads F32"):
        decode_schedule(s, 4, formats={"blk.0.qkv": (("Q5_K", 16),)})
    with pytest.raises(ValueError, match="row groups covering"):
        decode_schedule(s, 4, formats={"blk.0.qkv": (("Q8_0", 3),)})
    with pytest.raises(ValueError, match="rot_dim must be even"):
        DecodeRunner(sched, flat, eps=1e-5, scale=0.5, rope_theta=THETA, rot_dim=3, neox=False)
    with pytest.raises(ValueError, match="missing tensors"):
        pack_decode_weights(sched, {})
    runner = DecodeRunner(sched, flat, eps=1e-5, scale=0.5, rope_theta=THETA, rot_dim=4,
                          neox=False, grid=2)
    with pytest.raises(ValueError, match="set_cache"):
        runner.set_cache(0, np.zeros((2, 3, 4)), np.zeros((2, 3, 4)))


@pytest.mark.parametrize("cache,profile", [(np.float16, False), (np.float32, False),
                                           (np.float16, True)])
def test_decode_kernel_ptx_sm90(assemble, cache, profile):
    ptx = decode_kernel.ptx("sm_90", NEOX=False, C=cache, PREFETCH=True, PROFILE=profile)
    assert "ld.acquire.gpu" in ptx and "atom.release.gpu" in ptx and "nanosleep" in ptx
    assert "dp4a" in ptx          # the quantized rows' DP4A dots
    assert "cp.async.bulk.prefetch.L2.global" in ptx      # weights into L2 before the wait
    assert ("%globaltimer" in ptx) == profile             # the default build has no stamps
    assert ".maxntid 256" in ptx and ".minnctapersm 3" in ptx
    assemble(ptx, "sm_90")
    no_prefetch = decode_kernel.ptx("sm_80", NEOX=False, C=cache, PREFETCH=False,
                                    PROFILE=profile)
    assert "cp.async.bulk" not in no_prefetch
    assemble(no_prefetch, "sm_80")


def _quant_formats(shape: DecodeShape) -> dict:
    """Every format the step reads, a two-group qkv (q|k Q4_K, v Q6_K as Q4_K_M files have
    it) and a two-group down."""
    e, half = shape.n_embd, shape.n_embd // 2
    formats = {"token_embd": (("Q6_K", shape.n_vocab),), "output": (("Q4_K", shape.n_vocab),)}
    for il in range(shape.n_layer):
        formats.update({f"blk.{il}.qkv": (("Q4_K", shape.q_rows + shape.kv_rows),
                                          ("Q6_K", shape.kv_rows)),
                        f"blk.{il}.attn_out": (("Q4_1", e),),
                        f"blk.{il}.gate_up": (("Q8_0", 2 * shape.n_ff),),
                        f"blk.{il}.down": (("Q6_K", half), ("Q8_0", e - half))})
    return formats


def _quantized(rng, shape, formats):
    """Random tensors; (the quantized groups for the step, their dequantized f32 values)."""
    from stdlib_kernels.quant.reference import dequantize, quantize
    groups, dense = {}, {}
    for name, value in _weights(rng, shape).items():
        if name not in formats:
            groups[name] = dense[name] = value
            continue
        parts, start = [], 0
        for type_name, rows in formats[name]:
            parts.append(quantize(value[start:start + rows], type_name))
            start += rows
        groups[name] = parts
        dense[name] = np.concatenate([dequantize(p, t, value.shape[1])
                                      for p, (t, _) in zip(parts, formats[name])])
    return groups, dense


# n_ff 4352: down rows of 136 Q8_0 / Q6_K items, so a lane's items take decode_rows'
# unrolled visits (ROW_UNROLL) and then the remainder loop; head_dim 48: heads are not whole
# Q8_1 blocks, so the O-projection's input gets a QUANT stage (o_in) instead of the merge's
# Q8_1; splits (attn_splits, split_rows): (8, 16) one split here, (3, 2) / (4, 2) several;
# gate_up tiles (the GLU items writing the down projection's Q8_1 blocks): 16 rows, two items
# a block; 24 and 40, items straddling two blocks shared with other items, and whole blocks;
# fold: the normed inputs (8 blocks) written by the last item of the stage before (the
# default), or by QUANT stages (fold_norm_blocks 0)
@pytest.mark.parametrize("n_ff,head_dim,splits,glu_rows,fold", [
    (512, 64, (8, 16), 16, True), (4352, 64, (3, 2), 40, True), (512, 48, (4, 2), 24, False)])
def test_quantized_step_tracks_its_dequantized_weights(rng, seed, n_ff, head_dim, splits,
                                                       glu_rows, fold):
    """Every format and a two-group matrix: the step on GGUF weights (Q8_1 inputs) against the
    same kernel on those weights dequantized to F32 (f32 inputs). They differ by the Q8_1
    rounding of each matmul input, at most half a step (amax / 254) a value plus its f16
    scale's 2^-11: for Gaussian-like blocks ~1% of the input's norm, which 4 matmuls a layer
    and 2 layers compound to well under 1e-1 in relative L2; a wrong block decode is O(1).
    Then the launch replayed on NaN-poisoned activations: bit-identical, counters zero."""
    s = DecodeShape(2, 256, 4, 2, head_dim, n_ff, 77, n_ctx=16)
    formats = _quant_formats(s)
    groups, dense = _quantized(rng, s, formats)
    args = {"eps": 1e-5, "scale": head_dim ** -0.5, "rope_theta": THETA, "rot_dim": head_dim,
            "neox": False, "grid": 7, "cache_dtype": np.float16}
    tiles = {"embed": 16, "qkv": 16, "o": 16, "gate_up": glu_rows, "down": 16, "lm_head": 16}
    sched = decode_schedule(s, tiles, formats, *splits, fold_norm_blocks=32 if fold else 0)
    quant = DecodeRunner(sched, pack_decode_weights(sched, groups), **args)
    ref_sched = decode_schedule(s, 16, None, *splits)
    ref = DecodeRunner(ref_sched, pack_decode_weights(ref_sched, dense), **args)
    names = sched.stage_names
    o_in = ("o_in",) if head_dim % 32 else ()      # else the attention's merge writes it
    normed = () if fold else ("qkv_in",)
    assert names[1:4 + len(normed + o_in)] == (*normed, "qkv", "attn", *o_in, "o") and \
        names[-2:] == ("down" if fold else "lm_head_in", "lm_head") and "down_in" not in names
    assert fold == ("gate_up_in" not in names)
    # the GLU output's Q8_1 blocks: an arrival counter each, after the heads'
    assert sched.counters == 2 + sched.n_stages + s.n_head + n_ff // 32
    assert "_in" not in "".join(ref_sched.stage_names)     # F32 rows: no QUANT stages
    prefix = int(rng.integers(3, 8))       # position >= 3: (3, 2) and (4, 2) use 2+ splits
    kv = rng.standard_normal((s.n_layer, s.n_head_kv, prefix, s.head_dim))
    for runner in (quant, ref):
        for il in range(s.n_layer):
            runner.set_cache(il, kv[il], -kv[il])
    for pos in range(prefix, prefix + 2):
        token = int(rng.integers(0, s.n_vocab))
        got, want = quant.step(token, pos), ref.step(token, pos)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert err < 1e-1, f"seed {seed}: pos {pos}: rel L2 {err:.3g}"
    # the LM head's QUANT items wrote Q8_1(rmsnorm(x, output_norm)) once: the decode graph's
    # rmsnorm_q8_1 bytes, bit for bit
    from stdlib_kernels.quant.rmsnorm_q8_1 import rmsnorm_q8_1
    x_off, n = sched.acts["x"]
    want_q, _ = rmsnorm_q8_1(quant.acts.numpy()[None, x_off:x_off + n],
                             groups["output_norm"], args["eps"])
    want_q = np.asarray(want_q).reshape(-1).view(np.uint32)
    np.testing.assert_array_equal(quant.xq.numpy()[:want_q.size], want_q, err_msg=f"{seed}")
    # the GLU items wrote the last layer's Q8_1(act) for the down projection as its blocks
    # completed: quantize_q8_1's bytes of the GLU output, bit for bit
    from stdlib_kernels.quant.q8_1 import quantize_q8_1
    f_off, n_ff_ = sched.acts["ffn"]
    want_f = quantize_q8_1(quant.acts.numpy()[f_off:f_off + n_ff_]).numpy().view(np.uint32)
    last_down = len(names) - 1 - names[::-1].index("down")
    xq_ffn = int(sched.stages[last_down, XQ])
    np.testing.assert_array_equal(quant.xq.numpy()[xq_ffn:xq_ffn + want_f.size], want_f,
                                  err_msg=f"{seed}")
    first = quant.logits()
    for _ in range(2):
        quant.acts.fill(np.nan)
        quant.xq.fill(0xFFFFFFFF)
        quant.launch()
        np.testing.assert_array_equal(quant.logits(), first)
        assert not quant.counters.numpy().any()
    # a position outside the cache (io written on the device, as a broken argmax could):
    # NaN logits, no cache row written, every counter (the heads' merge counters too) zero
    cache_before = quant.cache_k.numpy().copy()
    quant.io.copy_from(np.array([token, s.n_ctx], np.int32))
    quant.launch()
    assert np.isnan(quant.logits()).all(), f"seed {seed}"
    np.testing.assert_array_equal(quant.cache_k.numpy(), cache_before)
    assert not quant.counters.numpy().any()


def test_profiled_launch_stamps_every_item(rng, seed):
    """The profiling build (PROFILE) computes the same logits bit for bit as the default one,
    and stamps every item in order (taken <= ready <= prepped <= done); the per-kind summary
    counts every item once and its critical shares add up to the launch."""
    from stdlib_kernels.persistent.decode_profile import (
        format_profile,
        profile_summary,
        stage_kinds,
    )
    s = DecodeShape(2, 36, 6, 2, 6, 50, 37, n_ctx=8)
    sched = decode_schedule(s, 7)
    flat = pack_decode_weights(sched, _weights(rng, s))
    args = {"eps": 1e-5, "scale": 0.5, "rope_theta": THETA, "rot_dim": 6, "neox": False,
            "grid": 3}
    plain = DecodeRunner(sched, flat, **args)
    profiled = DecodeRunner(sched, flat, profile=True, **args)
    with pytest.raises(ValueError, match="profile=True"):
        plain.profile()
    token, pos = int(rng.integers(0, s.n_vocab)), int(rng.integers(0, s.n_ctx))
    want = plain.step(token, pos)
    np.testing.assert_array_equal(profiled.step(token, pos), want, err_msg=f"seed {seed}")
    stamps = profiled.profile().astype(np.int64)
    assert (stamps > 0).all() and (np.diff(stamps, axis=1) >= 0).all(), f"seed {seed}"
    rows, totals = profile_summary(sched, profiled.profile())
    assert list(rows) == stage_kinds(sched) == ["embed", "qkv", "attn", "o", "gate_up",
                                                "down", "lm_head"]
    assert sum(r["items"] for r in rows.values()) == sched.n_items
    assert rows["attn"]["items"] == s.n_layer * s.n_head * sched.attn_splits
    critical = sum(r["critical_us"] for r in rows.values())
    assert critical == pytest.approx(totals["launch_us"], rel=1e-9, abs=1e-6)
    assert "| lm_head | 6 |" in format_profile(rows, totals)
    assert not profiled.counters.numpy().any()
