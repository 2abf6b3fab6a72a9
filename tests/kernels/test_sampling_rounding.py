"""The samplers' draws under adversarial rounding: weights whose chunked prefix sums stepped
back, or stepped up at a zero weight, before _select.block_scan clamped them (zero weights at
the scan's chunk starts, padding right after the last logit, -Inf blocks), and uniforms placed
exactly on every step of those sums. Every draw must be a token below n whose weight is > 0:
sample_temp (temperature only), draw_from_candidates (sample() with top-k) and rows_draw
(sample_rows). Weights come from the device's own exp, so the targets sit where the kernels'
sums do."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32
from stdlib_kernels import sample_kernels as K
from stdlib_kernels import sampling as S
from tests.kernels import scan_model as M
from tests.kernels.test_select_scan import targets_on_every_step

F32 = np.float32


@pk.kernel
def device_weights(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32, m: f32, inv_temp: f32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[i] = pk.exp((x[i] - m) * inv_temp)   # the samplers' weight, bit for bit


def uniforms_hitting(targets, total):
    """u in [0, 1) with fl(u * total) == target, for every target some u reaches."""
    found = []
    for t in targets:
        u = F32(np.float64(t) / np.float64(total))
        for _ in range(4):
            if F32(u * F32(total)) == t:
                break
            u = np.nextafter(u, F32(np.inf) if F32(u * F32(total)) < t else F32(0))
        if F32(u * F32(total)) == t and 0 <= u < 1:
            found.append(u)
    assert len(found) >= len(targets) // 2, "too few targets reachable by a uniform"
    return np.array(found, F32)


def temp_logits(rng, blocks):
    """Logits for sample_temp (UNITS = 2: 2048 a block, 8-logit chunks in the unit scan):
    -Inf on each chunk's first unit, the last block padded after 150 chunks, odd blocks all
    -Inf (zero weights at the block scan's chunk starts), 0 (the max: scale 1) in the rest."""
    span, chunk = 4 * 2 * K.PASS_THREADS, 8
    n = (blocks - 1) * span + 150 * chunk
    x = np.clip(rng.standard_normal(n) * 3, -40, -0.01).astype(F32)
    starts = np.arange(0, n, chunk)
    x[(starts[:, None] + np.arange(4)).ravel()] = -np.inf
    for b in range(blocks):
        if b % 2 == 1 and b != blocks - 1:
            x[b * span:(b + 1) * span] = -np.inf
        else:
            x[b * span + 4] = 0.0
    return x


@pytest.mark.parametrize("blocks", [1, 23])
def test_sample_temp_never_draws_a_zero_weight(device, rng, seed, blocks):
    x = temp_logits(rng, blocks)
    n = x.size
    S.sample(x, F32(0.5))                                  # fills the workspace's sums
    ws = S._workspace(blocks, blocks * 2 * K.PASS_THREADS, None)
    units = 2 * K.PASS_THREADS
    for b in range(blocks):
        cum = ws.unit_cum.numpy()[b * units:(b + 1) * units]
        unit_w = np.isfinite(x[b * 4 * units:(b + 1) * 4 * units])
        unit_w = np.pad(unit_w, (0, 4 * units - unit_w.size)).reshape(units, 4).any(axis=1)
        prev = np.concatenate([[F32(0)], cum[:-1]])
        assert np.all(cum >= prev), f"seed={seed}: block {b}'s unit sums decrease"
        assert np.all(cum[~unit_w] == prev[~unit_w]), f"seed={seed}: a zero unit steps"
    if blocks == 1:
        cum = ws.unit_cum.numpy()[:units]
        targets = targets_on_every_step([cum], cum[-1])
    else:   # every block's scale is 1 (its max is the row's) or 0 (-Inf only)
        blk = ws.blk_sum.numpy()[:blocks]
        cum = M.block_scan(blk, K.PASS_THREADS)
        targets = targets_on_every_step([cum, M.plain_scan(blk, K.PASS_THREADS)], cum[-1])
    u = uniforms_hitting(targets, cum[-1])
    got = S.sample(x, pk.to_device(u), out=pk.full(u.size, -7, np.int32)).numpy()
    assert np.all((got >= 0) & (got < n)), f"seed={seed}: drew {got[(got < 0) | (got >= n)]}"
    bad = got[~np.isfinite(x[got])]
    assert bad.size == 0, f"seed={seed}: drew zero-weight tokens {bad[:5]}"


def topk_case(rng, n, top_k, temperature):
    """Distinct logits whose top-k survivors' weights partly underflow to 0 at this
    temperature, interleaved by index; (x, survivor indices in index order, their weights)."""
    x = (rng.permutation(n) * F32(6.0 / n) + rng.random(n) * F32(1e-3)).astype(F32)
    inv_temp = F32(1.0 / temperature)
    keep = np.sort(np.argsort(-x, kind="stable")[:top_k])
    w = pk.full(top_k, np.nan, np.float32)
    device_weights[-(-top_k // 256), 256](pk.to_device(x[keep]), w, top_k, x.max(), inv_temp)
    return x, keep, w.numpy()


def expected_picks(keep, w, u):
    """The draw the kernels make: first survivor whose (model) cumulative weight exceeds
    fl(u * total); at or past the total, the first reaching it."""
    cum = M.block_scan(w, K.SAMPLE_THREADS)
    t = (u * cum[-1]).astype(F32)
    i = np.minimum(np.searchsorted(cum, t, side="right"), w.size - 1)
    i[t >= cum[-1]] = np.searchsorted(cum, cum[-1], side="left")
    return keep[i], cum


def adversarial_uniforms(w):
    cum = M.block_scan(w, K.SAMPLE_THREADS)
    plain = M.plain_scan(w, K.SAMPLE_THREADS)
    return uniforms_hitting(targets_on_every_step([cum, plain], cum[-1]), cum[-1])


def test_top_k_draw_never_picks_a_zero_weight(device, rng, seed):
    n, top_k, temperature = 3000, 700, 0.01
    x, keep, w = topk_case(rng, n, top_k, temperature)
    assert np.any(w == 0) and np.any(w > 0)
    u = adversarial_uniforms(w)
    got = S.sample(x, pk.to_device(u), temperature=temperature, top_k=top_k,
                   out=pk.full(u.size, -7, np.int32)).numpy()
    want, _cum = expected_picks(keep, w, u)
    weight_of = dict(zip(keep.tolist(), w.tolist()))
    bad = [g for g in got.tolist() if weight_of.get(g, 0.0) <= 0]
    assert not bad, f"seed={seed}: drew tokens of zero weight {bad[:5]}"
    assert np.array_equal(got, want), f"seed={seed}: draws differ from the model's"


def test_rows_draw_never_picks_a_zero_weight(device, rng, seed):
    n, top_k, temperature = 1000, 300, 0.01
    x, keep, w = topk_case(rng, n, top_k, temperature)
    u = adversarial_uniforms(w)
    prev = np.concatenate([[F32(0)], M.plain_scan(w, K.SAMPLE_THREADS)[:-1]])
    plain = M.plain_scan(w, K.SAMPLE_THREADS)
    steps = plain[(w == 0) & (plain != prev)]     # where the plain scan would have failed
    risky = np.isin((u * M.block_scan(w, K.SAMPLE_THREADS)[-1]).astype(F32), steps)
    u = np.concatenate([u[risky], rng.choice(u, 24)])[:48]
    settings = S.row_settings(u, temperature=temperature, top_k=top_k)
    got = S.sample_rows(np.tile(x, (u.size, 1)), settings,
                        out=pk.full(u.size, -7, np.int32)).numpy()
    want, _cum = expected_picks(keep, w, settings[:, 0].astype(F32))
    assert np.all(np.isin(got, keep[w > 0])), f"seed={seed}: drew a zero-weight token"
    assert np.array_equal(got, want), f"seed={seed}: draws differ from the model's"
