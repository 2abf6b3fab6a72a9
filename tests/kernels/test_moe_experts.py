"""MoE expert kernels (stdlib_kernels.moe: decode path, grouped path, grouping) against the
float64 reference (moe/reference.py), random data, awkward shapes, outputs poisoned.

Error bound per output, derived from what the kernels compute (as test_quant_gemv.py):
- gate / up see x as its Q8_1 rounding xh (bit-exact with ref.quantize_q8_1, for the types
  with Q8_1 kernels; x itself for F32/F16), so the reference uses xh; the kernels' dot is
  exact integer sums times f32 scales, f32-accumulated: |err| <= F32_DOT * |W| @ |xh|, plus,
  for types whose block offset goes through Q8_1's s (O: -dmin m, -8d, ...; s is f16),
  |O| @ 2^-11 blocksum|xh|.
- h = act(g, u): |dh| <= 1.1 (|u| + 1) dg + (|g| + 1) du (both activations' slopes).
- down sees h as its Q8_1 rounding: |hq - h| <= (0.5 + 127 2^-11) d per element (d the block
  scale, rounded to f16) + dh; then the same dot and offset terms; the k outputs weighted.
"""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.moe.experts import MoeConfig, MoeWorkspace, expert_weights
from stdlib_kernels.moe.ffn import moe_ffn_into
from stdlib_kernels.moe.grouping import group_into, group_reference, max_tiles
from stdlib_kernels.moe.reference import glu_reference
from stdlib_kernels.moe.router import route_reference
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemv import Q8_1_TYPES
from stdlib_kernels.quant.q8_1 import quantize_q8_1

from test_quant_gemv import offsets

F32_DOT = 2e-5          # > (K / 32 + 5 + 8) 2^-24 for the rows here (K <= 512)
Q8_STEP = 0.5 + 127 * 2.0 ** -11


def make_experts(rng, type_name, n_expert, rows, n):
    w = (rng.standard_normal((n_expert * rows, n)) / np.sqrt(n)).astype(np.float32)
    if type_name == "F32":
        raw = w.view(np.uint8)
    elif type_name == "F16":
        raw = w.astype(np.float16).view(np.uint8)
    else:
        raw = ref.quantize(w, type_name)
    deq = ref.dequantize(raw, type_name, n).astype(np.float64)
    off = offsets(raw, type_name, n)[:, ::32]                      # (rows, n / 32)
    return raw, deq.reshape(n_expert, rows, n), off.reshape(n_expert, rows, -1)


def seen_by_kernel(v, q8: bool):
    """(the values a kernel multiplies, per-element Q8_1 rounding bound d, |s| blocks)."""
    if not q8:
        return v, np.zeros_like(v)
    q = ref.quantize_q8_1(v.astype(np.float32))
    vh = ref.dequantize(q, "Q8_1", v.shape[-1]).astype(np.float64)
    d = q.reshape(v.shape[0], -1, 36)[:, :, :2].copy().view(np.float16)[:, :, 0]
    return vh, np.repeat(d.astype(np.float64), 32, axis=1)


def blocksum(v):
    return np.abs(v).reshape(v.shape[0], -1, 32).sum(axis=2)


def expected_and_bound(x, experts, types, ids, route_w, act, biases, res):
    (g_w, g_o), (u_w, u_o), (d_w, d_o) = experts
    q8_in, q8_h = types[0] in Q8_1_TYPES, types[2] in Q8_1_TYPES
    xh, _ = seen_by_kernel(x.astype(np.float64), q8_in)
    tokens, k = ids.shape
    y = np.zeros((tokens, d_w.shape[1])) if res is None else res.astype(np.float64)
    bound = np.zeros_like(y)
    for t in range(tokens):
        for j in range(k):
            e, wt = int(ids[t, j]), float(route_w[t, j])
            g = g_w[e] @ xh[t] + biases[0][e]
            u = u_w[e] @ xh[t] + biases[1][e]
            s_err = 2.0 ** -11 * blocksum(xh[t:t + 1])[0]
            dg = F32_DOT * (np.abs(g_w[e]) @ np.abs(xh[t])) + np.abs(g_o[e]) @ s_err
            du = F32_DOT * (np.abs(u_w[e]) @ np.abs(xh[t])) + np.abs(u_o[e]) @ s_err
            h = glu_reference(g, u, act)
            dh = 1.1 * (np.abs(u) + 1) * dg + (np.abs(g) + 1) * du
            _, d = seen_by_kernel(h[None], q8_h)
            eh = Q8_STEP * d[0] + dh
            y[t] += wt * (d_w[e] @ h + biases[2][e])
            down_err = (np.abs(d_w[e]) + np.abs(np.repeat(d_o[e], 32, axis=1))) @ eh + \
                np.abs(d_o[e]) @ (2.0 ** -11 * blocksum((np.abs(h) + eh)[None])[0]) + \
                F32_DOT * (np.abs(d_w[e]) @ (np.abs(h) + eh))
            bound[t] += abs(wt) * down_err
    return y, bound + F32_DOT * np.abs(y) + 1e-30


CASES = [  # (gate/up type, down type, n_embd, n_ff, n_expert, k, act)
    ("Q8_0", "Q8_0", 96, 160, 5, 2, "silu"),
    ("Q4_K", "Q6_K", 256, 256, 6, 3, "silu"),
    ("MXFP4", "MXFP4", 64, 96, 5, 2, "oai"),
    ("F32", "F16", 64, 96, 4, 2, "oai"),
]


def run_ffn(rng, seed, case, tokens, grouped, with_bias, with_res, config=None,
            given_xq=False, gemm=None, logits=None):
    """logits None: fresh standard normal router logits (tokens, n_expert)."""
    gtype, dtype_, n_embd, n_ff, n_expert, k, act = case
    gate, up = (make_experts(rng, gtype, n_expert, n_ff, n_embd) for _ in range(2))
    down = make_experts(rng, dtype_, n_expert, n_embd, n_ff)
    x = rng.standard_normal((tokens, n_embd)).astype(np.float32)
    if logits is None:
        logits = rng.standard_normal((tokens, n_expert)).astype(np.float32)
    ids, route_w = route_reference(logits, k, "softmax_norm")
    rows = (n_ff, n_ff, n_embd)
    biases = [(rng.standard_normal((n_expert, r)) * 0.5).astype(np.float32) if with_bias
              else np.zeros((n_expert, r), np.float32) for r in rows]
    res = rng.standard_normal((tokens, n_embd)).astype(np.float32) if with_res else None
    ws = MoeWorkspace(tokens, k, n_embd, n_ff, n_expert, config)
    for buf in (ws.h, ws.u, ws.ys):
        buf.fill(np.nan)
    wts = [expert_weights(pk.to_device(m[0]), t, n_expert)
           for m, t in ((gate, gtype), (up, gtype), (down, dtype_))]
    y = pk.full((tokens, n_embd), np.nan, np.float32)
    dev_bias = [pk.to_device(b) if with_bias else None for b in biases]
    moe_ffn_into(ws, *wts, pk.to_device(x), y, pk.to_device(ids), pk.to_device(route_w),
                 tokens, act, *dev_bias, res=None if res is None else pk.to_device(res),
                 grouped=grouped, xq=quantize_q8_1(x) if given_xq else None, gemm=gemm)
    want, bound = expected_and_bound(x, [(m[1], m[2]) for m in (gate, up, down)],
                                     (gtype, gtype, dtype_), ids, route_w, act, biases, res)
    err = np.abs(y.numpy() - want)
    assert np.all(err <= bound), f"{case} tokens={tokens} grouped={grouped} gemm={gemm}: max " \
                                 f"err/bound {np.max(err / bound):.3g} (seed {seed})"
    return ids


@pytest.mark.parametrize("case", CASES, ids=[c[0] + "-" + c[1] for c in CASES])
def test_decode_path(device, rng, seed, case):
    run_ffn(rng, seed, case, tokens=2, grouped=False, with_bias=case[6] == "oai",
            with_res=True)


@pytest.mark.parametrize("case", CASES, ids=[c[0] + "-" + c[1] for c in CASES])
def test_grouped_path(device, rng, seed, case):
    run_ffn(rng, seed, case, tokens=7, grouped=True, with_bias=case[6] == "oai",
            with_res=case[0] == "Q8_0")


# Q6_K down rows of 2 blocks (its u32-word kernel), MXFP4's word loads at every byte offset
TOKEN_CASES = [("Q4_K", "Q6_K", 256, 512, 5, 3, "silu"), CASES[2]]


@pytest.mark.parametrize("tokens", [1, 3, 8])
@pytest.mark.parametrize("case", TOKEN_CASES, ids=[c[0] + "-" + c[1] for c in TOKEN_CASES])
def test_decode_path_token_counts(device, rng, seed, case, tokens):
    run_ffn(rng, seed, case, tokens=tokens, grouped=False, with_bias=case[6] == "oai",
            with_res=tokens != 3)


@pytest.mark.parametrize("gtype", ["Q8_0", "MXFP4", "Q4_K"])
def test_glu_q8_1_output_is_bit_exact(device, rng, seed, gtype):
    """The pairs' GEMV writing h as Q8_1 (hq=) gives the bytes of quantize_q8_1 of its f32
    rows."""
    from stdlib_kernels.moe.experts import glu_into
    n_embd, n_ff, n_expert, k, tokens = 256, 64, 4, 2, 3
    wts = [expert_weights(pk.to_device(make_experts(rng, gtype, n_expert, n_ff, n_embd)[0]),
                          gtype, n_expert) for _ in range(2)]
    xq = quantize_q8_1(rng.standard_normal((tokens, n_embd)).astype(np.float32))
    ids = pk.to_device(rng.integers(0, n_expert, (tokens, k)).astype(np.int32))
    h = pk.full((tokens * k, n_ff), np.nan, np.float32)
    glu_into(*wts, xq, h, ids, ids, tokens * k, k, "silu")
    hq = pk.full((tokens * k, n_ff // 32 * 36), 0xAB, np.uint8)
    glu_into(*wts, xq, h, ids, ids, tokens * k, k, "silu", hq=hq)
    assert np.array_equal(hq.numpy(), quantize_q8_1(h).numpy()), f"seed {seed}"


def test_launch_shapes(device, rng, seed):
    """Rows not a multiple of the block's rows, tiles of 3 rows (partial last tiles)."""
    config = MoeConfig(warps=2, rows=3, batch=3, down_rows=2)
    run_ffn(rng, seed, CASES[0], tokens=5, grouped=True, with_bias=True, with_res=False,
            config=config)
    run_ffn(rng, seed, CASES[0], tokens=1, grouped=False, with_bias=False, with_res=False,
            config=config, given_xq=True)


@pytest.mark.parametrize("pairs,n_expert,batch", [(21, 5, 4), (64, 128, 8), (9, 3, 8),
                                                   (4100, 128, 32)])
def test_grouping_matches_reference(device, rng, seed, pairs, n_expert, batch):
    ids = rng.integers(0, n_expert, pairs).astype(np.int32)
    ids[: min(pairs, 9)] = ids[0]                    # one expert with a long run
    n_tiles = max_tiles(pairs, n_expert, batch)
    order, slot_of = (pk.full((pairs,), -1, np.int32) for _ in range(2))
    tiles = pk.full((n_tiles, 3), -1, np.int32)
    group_into(pk.to_device(ids), order, slot_of, tiles, pairs, n_expert, batch)
    want = group_reference(ids, n_expert, batch)
    for got, exp, name in zip((order, slot_of, tiles), want, ("order", "slot_of", "tiles")):
        assert np.array_equal(got.numpy(), exp), f"{name} differs (seed {seed})"


def test_kernels_assemble_for_the_gpu(assemble):
    """The GPU configurations (MoeConfig()) of every MoE kernel lower to PTX ptxas accepts."""
    from stdlib_kernels.moe import expert_kernels as ek
    from stdlib_kernels.moe import grouping, router
    from stdlib_kernels.quant import gemv_kernels as gk
    from stdlib_kernels.quant.formats import F16, MXFP4, Q4_K, Q6_K
    c = MoeConfig()
    common = dict(WARPS=c.warps, ROWS=c.rows)
    ptx = [
        router.router_kernel.ptx("sm_90", K=8, MODE=router.SOFTMAX_NORM, HAS_BIAS=False,
                                 PER_LANE=4),
        ek.moe_gemv_kernel.ptx("sm_90", FMT=Q4_K, WT=np.uint32, XT=np.uint32, ACT=ek.ACT_Q8,
                               ITEMS=Q8_1_TYPES["Q4_K"], BATCH=c.batch, GLU=ek.GLU_SILU,
                               HAS_BIAS=False, TILED=True, QOUT=False, **common),
        ek.moe_gemv_kernel.ptx("sm_90", FMT=gk.Q4_K_WIDE, WT=np.uint32, XT=np.uint32,
                               ACT=ek.ACT_Q8, ITEMS=4, BATCH=1, GLU=ek.GLU_SILU,
                               HAS_BIAS=False, TILED=False, QOUT=True, WARPS=32 // c.rows,
                               ROWS=c.rows),
        ek.moe_gemv_kernel.ptx("sm_90", FMT=MXFP4, WT=np.uint8, XT=np.uint32, ACT=ek.ACT_Q8,
                               ITEMS=1, BATCH=1, GLU=ek.GLU_OAI, HAS_BIAS=True, TILED=False,
                               QOUT=False, **common),
        ek.moe_gemv_kernel.ptx("sm_90", FMT=ek.MXFP4_WORDS, WT=np.uint32, XT=np.uint32,
                               ACT=ek.ACT_Q8, ITEMS=1, BATCH=1, GLU=ek.GLU_OAI, HAS_BIAS=True,
                               TILED=False, QOUT=True, WARPS=32 // c.rows, ROWS=c.rows),
        ek.moe_gemv_kernel.ptx("sm_90", FMT=F16, WT=np.uint16, XT=np.float32, ACT=ek.ACT_F32,
                               ITEMS=1, BATCH=c.batch, GLU=ek.GLU_NONE, HAS_BIAS=True,
                               TILED=True, QOUT=False, **common),
        ek.moe_down_kernel.ptx("sm_90", FMT=Q6_K, WT=np.uint16, XT=np.uint32, ACT=ek.ACT_Q8,
                               ITEMS=Q8_1_TYPES["Q6_K"], K=8, HAS_BIAS=False, HAS_RES=True,
                               WARPS=c.warps, ROWS=c.down_rows),
        ek.moe_down_kernel.ptx("sm_90", FMT=ek.MXFP4_WORDS, WT=np.uint32, XT=np.uint32,
                               ACT=ek.ACT_Q8, ITEMS=1, K=4, HAS_BIAS=True, HAS_RES=True,
                               WARPS=c.warps, ROWS=c.down_rows),
        grouping.group_kernel.ptx("sm_90", BATCH=c.batch, MAX_EXPERTS=128),
        grouping.gather_kernel.ptx("sm_90"),
        grouping.combine_kernel.ptx("sm_90", K=8, HAS_RES=True, HAS_BIAS=True),
    ]
    for text in ptx:
        assemble(text, "sm_90")


@pytest.mark.parametrize("tokens,grouped", [(2, False), (6, True), (9, True)])
def test_graph_replay_follows_new_routing(device, rng, seed, tokens, grouped):
    """Router + FFN captured once, replayed on new x and logits: the result equals an eager
    run on them (the expert choice is read on the device; nothing of it is baked in)."""
    from stdlib_kernels.moe.router import route_into
    n_embd, n_ff, n_expert, k = 64, 96, 5, 2
    wts = [expert_weights(pk.to_device(make_experts(rng, "Q8_0", n_expert, r, c)[0]), "Q8_0",
                          n_expert) for r, c in ((n_ff, n_embd), (n_ff, n_embd), (n_embd, n_ff))]
    ws = MoeWorkspace(tokens, k, n_embd, n_ff, n_expert)
    x, logits = pk.empty((tokens, n_embd), np.float32), pk.empty((tokens, n_expert), np.float32)
    ids, route_w = pk.empty((tokens, k), np.int32), pk.empty((tokens, k), np.float32)

    def step(y):
        route_into(logits, ids, route_w, k, "softmax_norm")
        moe_ffn_into(ws, *wts, x, y, ids, route_w, tokens, grouped=grouped)

    def new_inputs():
        x.copy_from(rng.standard_normal((tokens, n_embd)).astype(np.float32))
        logits.copy_from(rng.standard_normal((tokens, n_expert)).astype(np.float32) * 3)

    new_inputs()
    graphed = pk.full((tokens, n_embd), np.nan, np.float32)
    stream = pk.Stream()
    with pk.capture_graph(stream) as graph:
        step(graphed)
    for _ in range(2):
        new_inputs()
        graph.replay(stream)
        stream.synchronize()
        eager = pk.full((tokens, n_embd), np.nan, np.float32)
        step(eager)
        assert np.array_equal(graphed.numpy(), eager.numpy()), f"seed {seed}"
        graphed.fill(np.nan)
