"""The MoE feed-forward of prompts and batched decode on int8 tensor cores (llama.cpp's
mul_mat_id idea): the (token, expert) pairs sorted by expert on the device (grouping.py), their
Q8_1 activations gathered in that order, and one GEMM launch per expert matrix over all
experts at once.

    grouped_ffn_into(ws, gate, up, down, xq, y, ids, route_w, tokens, act, biases, res)
        the contract of ffn.moe_ffn_into (experts.py), x given as Q8_1 rows xq (tokens, ...)
    grouped_matmul_into(wt, xq, out, tiles, n_tiles, plan)   one expert matrix, sorted rows
    gemm_applies(gate, down) / token_tile(pairs, n_expert)   what the router of ffn.py asks

Launches (each a fixed grid: graph-capturable, no host round trip):
  group_kernel     order / slot_of / tiles (expert, first sorted row, count <= BN) with BATCH =
                   BN, the GEMM's token tile: one tile entry = one token tile of one expert
  gather_kernel    x_sorted[s] = xq[order[s] // k]
  grouped_*_kernel grid (row tiles of one expert's matrix, tile entries); a block reads its
                   entry, exits if it is an unused one (count 0), else computes rows
                   e R + bx BM .. of the stacked weights against sorted rows first ..
                   first + count - 1 with the dense GEMM's tile functions, absolute row and
                   token bounds (so no pointer is offset and no alignment changes), and stores
                   C at out[first.., bx BM..]: gate into ws.h, up into ws.u, down into ws.ys
  glu_q8_1_kernel  hq[s] = Q8_1(act(g[s] + bg_e, u[s] + bu_e)), e the row's expert
  combine_kernel   y[t] = (res[t] +) sum_j route_w[t, j] (ys[slot_of[t k + j]] + bd_e)

Kernels per format (formats.GEMM_MOE): K % 256 == 0 and a super-block type: gemm_q8_k.py's
pipelined stages (issue_stage, scale_pass, compute_stage); else the 32-value formats per
32-block: gemm_q8.py's load_weight_tile / load_act_tile / mma_block, MXFP4 among them (its
doubled e2m1 values are exact int8, its scale 2^(e - 128)). Same arithmetic as the dense
int8 GEMM, so the same Q8_1 error model (tests/kernels/test_moe_grouped_gemm.py).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .. import _launch as L
from ..quant.formats import GEMM_MOE, Q6_K, get_format, type_ids
from ..quant.gemm import store_c
from ..quant.gemm_q8 import Q8GemmTiles, block_tile
from ..quant.gemm_q8_k import SUPERBLOCK_GEMM_TYPES, TUNED_KTILES, Q8KTiles, block_resources
from ..quant.gemm_q8_k_kernels import compute_stage
from ..quant.gemm_q8_k_parts import B_STRIDE, STEP_WORDS, a_stride, issue_stage, scale_pass
from ..quant.gemv import word_dtype
from ..quant.q8_1 import Q8_1_WORDS, q8_1_bytes, store_q8_1_block
from . import expert_kernels as ek
from .experts import ACTS, ExpertWeights, MoeWorkspace
from .grouping import combine_kernel, gather_kernel, group_into, max_tiles

GROUPED_TYPES = type_ids(GEMM_MOE)     # type name -> ggml id
GLU_WARPS = 4
# token tiles (BN) by the mean tokens per expert, the dense GEMM's short-prompt tile shapes
# (gemm_q8_k.SMALL_KTILES: 64 weight rows x BN tokens) up to 64, its tuned 128 x 128 above;
# the per-32-block kernel's likewise (64 rows, Q4_0's tuned 64 x 128 at the top)
TOKEN_TILES = (8, 16, 32, 64, 128)
SMALL_KQ = {8: Q8KTiles(1, 1, 4, 1, 3), 16: Q8KTiles(1, 2, 4, 1, 3),
            32: Q8KTiles(1, 4, 4, 1, 3), 64: Q8KTiles(1, 4, 4, 2, 3)}
BLOCK_TILES = {8: Q8GemmTiles(2, 1, 2, 1, 4), 16: Q8GemmTiles(2, 2, 2, 1, 4),
               32: Q8GemmTiles(2, 4, 2, 1, 4), 64: Q8GemmTiles(2, 4, 2, 2, 4),
               128: Q8GemmTiles(2, 4, 2, 4, 4)}
# the CPU target emulates threads: one warp, 16-row x 8-token tiles
CPU_KQ = Q8KTiles(1, 1, 1, 1, 3)
CPU_BLOCK = Q8GemmTiles(1, 1, 1, 1, 2)


@pk.func
def tile_entry(tiles: Ptr[i32, "ro"], rows: i32):
    """(count, first sorted row, first stacked weight row) of this block's tile entry."""
    t = pk.block_idx.y
    return tiles[3 * t + 2], tiles[3 * t + 1], tiles[3 * t] * rows


@pk.kernel
def grouped_q8k_kernel(w: Ptr["WT", "ro"], xq: Ptr[u32, "ro"], y: Ptr[f32], ldy: i32,
                       tiles: Ptr[i32, "ro"], rows: i32, row_words: i32, K: i32,
                       FMT: Const[int], WT: Const[pk.dtype], GPU: Const[int], MI: Const[int],
                       NI: Const[int], WM: Const[int], WN: Const[int], STAGES: Const[int],
                       AS: Const[int], AW: Const[int]):
    # gemm_q8_k.gemm_q8k_kernel's pipeline (unsplit) on one expert's rows and tokens
    sm = pk.dynamic_shared(u32)
    smf = pk.dynamic_shared(f32)
    BM = 16 * MI * WM
    BN = 8 * NI * WN
    NT = 32 * WM * WN
    SW = BM * AS + BN * B_STRIDE
    SCALES = STAGES * SW
    count, first, lo = tile_entry(tiles, rows)
    if count > 0:
        end = first + count          # sorted rows first .. end - 1: this tile's tokens
        hi = lo + rows               # the expert's stacked rows lo .. hi - 1
        tid = pk.thread_idx.x
        lane = tid % 32
        rbase = (tid // 32) % WM * 16 * MI
        cbase = (tid // 32) // WM * 8 * NI
        row0 = lo + pk.block_idx.x * BM
        xstride = K // 32 * Q8_1_WORDS
        n = K // 256
        row_bytes = row_words * (2 if FMT == Q6_K else 4)
        acc = pk.local_array(f32, 4 * MI * NI)
        for i in pk.static_range(4 * MI * NI):
            acc[i] = 0.0
        for s in pk.static_range(STAGES - 1):
            if s < n:
                issue_stage(FMT, sm, s * SW, w, xq, hi, row_words, end, xstride, row0, first,
                            s, tid, BM, BN, NT, AS, AW)
            pk.cp_async_commit()
        pk.cp_async_wait(STAGES - 2)
        pk.syncthreads()
        scale_pass(FMT, sm, smf, 0, SCALES, row0, hi, row_bytes, 0, tid, BM, BN, NT, AS)
        for j in range(n):
            pk.cp_async_wait(STAGES - 3)
            pk.syncthreads()
            ahead = j + STAGES - 1
            if ahead < n:
                issue_stage(FMT, sm, ahead % STAGES * SW, w, xq, hi, row_words, end, xstride,
                            row0, first, ahead, tid, BM, BN, NT, AS, AW)
            pk.cp_async_commit()
            if j + 1 < n:
                scale_pass(FMT, sm, smf, (j + 1) % STAGES * SW, SCALES + (j + 1) % 2 * 16 *
                           (BM + BN), row0, hi, row_bytes, j + 1, tid, BM, BN, NT, AS)
            compute_stage(FMT, GPU, sm, smf, j % STAGES * SW, SCALES + j % 2 * 16 * (BM + BN),
                          acc, rbase, cbase, lane // 4, lane % 4, row0, hi, row_bytes, j, MI,
                          NI, BM, AS)
        store_c(acc, y, ldy, 0, y, rows, end, row0 - lo + rbase + lane // 4,
                first + cbase + 2 * (lane % 4), MI, NI, False)


@pk.kernel
def grouped_q8_kernel(w: Ptr["WT", "ro"], xq: Ptr[u32, "ro"], y: Ptr[f32], ldy: i32,
                      tiles: Ptr[i32, "ro"], rows: i32, row_words: i32, K: i32,
                      FMT: Const[int], WT: Const[pk.dtype], MI: Const[int], NI: Const[int],
                      WM: Const[int], WN: Const[int], KB: Const[int]):
    # gemm_q8.gemm_q8_kernel (per 32-value block) on one expert's rows and tokens
    count, first, lo = tile_entry(tiles, rows)
    if count > 0:
        row0 = lo + pk.block_idx.x * (16 * MI * WM)
        block_tile(FMT, w, xq, y, ldy, 0, y, lo + rows, row_words, K, first + count, row0,
                   first, row0 - lo, rows, MI, NI, WM, WN, KB, False)


@pk.kernel
def glu_q8_1_kernel(g: Ptr[f32, "ro"], u: Ptr[f32, "ro"], bias: Ptr[f32, "ro"],
                    bias2: Ptr[f32, "ro"], ids: Ptr[i32, "ro"], order: Ptr[i32, "ro"],
                    hq: Ptr[u32], rows: i32, GLU: Const[int], HAS_BIAS: Const[bool]):
    # grid (sorted rows, groups of GLU_WARPS Q8_1 blocks); one warp per 32-value block
    s = pk.block_idx.x
    b = pk.block_idx.y * (pk.block_dim.x // 32) + pk.thread_idx.x // 32
    lane = pk.thread_idx.x % 32
    if b < rows // 32:
        c = 32 * b + lane
        gv = g[s * rows + c]
        uv = u[s * rows + c]
        if HAS_BIAS:
            e = ids[order[s]]
            gv = gv + bias[e * rows + c]
            uv = uv + bias2[e * rows + c]
        store_q8_1_block(ek.glu(gv, uv, GLU), lane, hq, s * (rows // 32) + b)


def gemm_applies(gate: ExpertWeights, down: ExpertWeights) -> bool:
    """Whether the grouped GEMM serves these experts (formats.GEMM_MOE, both matrices)."""
    return gate.type_name in GROUPED_TYPES and down.type_name in GROUPED_TYPES


def token_tile(pairs: int, n_expert: int) -> int:
    """BN, the token tile: the least of TOKEN_TILES that holds the mean pairs per expert (an
    expert above it takes more tiles; 8 on the CPU target)."""
    if one_warp_default():
        return TOKEN_TILES[0]
    mean = -(-pairs // n_expert)
    return next((bn for bn in TOKEN_TILES if mean <= bn), TOKEN_TILES[-1])


def _superblock(wt: ExpertWeights) -> bool:
    return wt.type_name in SUPERBLOCK_GEMM_TYPES and wt.n % 256 == 0


def one_warp_default() -> bool:
    return pk.current_device().kind == "cpu"


def kernel_tiles(wt: ExpertWeights, bn: int, one_warp: bool) -> Q8KTiles | Q8GemmTiles:
    """The tiles of wt's kernel (Q8KTiles: the super-block one) for token tile bn: the GPU
    tables, or one_warp: the CPU target's 16 x 8 (bn 8)."""
    if _superblock(wt):
        t = CPU_KQ if one_warp else SMALL_KQ.get(bn) or TUNED_KTILES[wt.type_name]
    else:
        t = CPU_BLOCK if one_warp else BLOCK_TILES[bn]
        kb = t.kb
        while (wt.n // 32) % kb:
            kb //= 2
        t = t._replace(kb=kb)
    if t.shape[1] != bn:
        raise ValueError(f"moe grouped GEMM: tiles {t} do not take {bn} tokens (token tiles: "
                         f"{TOKEN_TILES}, one_warp: 8)")
    return t


def grouped_matmul_into(wt: ExpertWeights, xq, out, tiles, n_tiles: int, bn: int,
                        stream=None, one_warp: bool | None = None) -> None:
    """out[s] (rows of wt.rows f32) = W_e x_sorted[s] for every sorted row s of the tile
    entries (tiles: group_kernel's with BATCH = bn; n_tiles of them, unused ones zero).
    xq: the sorted Q8_1 rows as u32 words (rows of q8_1_bytes(wt.n) // 4). one_warp:
    kernel_tiles' (None: on the CPU target)."""
    if wt.type_name not in GROUPED_TYPES:
        raise ValueError(f"moe grouped GEMM: no kernel for {wt.type_name}; supported: "
                         f"{sorted(GROUPED_TYPES)}")
    if n_tiles > 65535:
        raise ValueError(f"moe grouped GEMM: {n_tiles} tiles exceed a grid's 65535 rows")
    t = kernel_tiles(wt, bn, one_warp_default() if one_warp is None else one_warp)
    fmt = get_format(wt.type_name)
    row_bytes = wt.n // fmt.block_elems * fmt.block_bytes
    bm = t.shape[0]
    grid = ((wt.rows + bm - 1) // bm, n_tiles)
    if isinstance(t, Q8GemmTiles):
        row_words = row_bytes // np.dtype(word_dtype(wt.type_name)).itemsize
        grouped_q8_kernel[grid, 32 * t.wm * t.wn, stream](
            wt.words, xq, out, wt.rows, tiles, wt.rows, row_words, wt.n, fmt.id,
            wt.words.dtype, t.mi, t.ni, t.wm, t.wn, t.kb)
        return
    w = wt.words
    if wt.type_name in ("Q4_0", "Q8_0", "Q5_0"):   # u16 words; K % 256: 16-byte steps
        w = w.view(np.uint32)
    gpu = pk.current_device().kind != "cpu"
    dyn, threads = block_resources(fmt.id, t)
    spec = (("FMT", fmt.id), ("WT", w.dtype), ("GPU", int(gpu)), ("MI", t.mi), ("NI", t.ni),
            ("WM", t.wm), ("WN", t.wn), ("STAGES", t.stages), ("AS", a_stride(fmt.id)),
            ("AW", STEP_WORDS.get(fmt.id, 0)))
    L.launch(grouped_q8k_kernel, (*grid, 1), threads,
             (w, xq, out, wt.rows, tiles, wt.rows, row_bytes // w.itemsize, wt.n), spec,
             stream, dyn, bounds=(threads, 1) if gpu else None)


def grouped_ffn_into(ws: MoeWorkspace, gate: ExpertWeights, up: ExpertWeights,
                     down: ExpertWeights, xq, y, ids, route_w, tokens: int, act: str,
                     gate_bias=None, up_bias=None, down_bias=None, res=None,
                     stream=None, bn: int | None = None) -> None:
    """y (tokens, n_embd) = (res +) sum_j route_w[t, j] (down_e h_tj + bd_e), h_tj =
    act(gate_e x_t + bg_e, up_e x_t + bu_e), e = ids[t, j]; x as Q8_1 rows xq (tokens,
    q8_1_bytes(n_embd)); shapes checked by ffn.moe_ffn_into. Module docstring: launches.
    bn: a token tile of TOKEN_TILES and its GPU tiles on any device (tuning, tests); None:
    token_tile's (the one-warp tiles on the CPU target)."""
    if not gemm_applies(gate, down) or gate.type_name != up.type_name:
        raise ValueError(f"moe grouped GEMM: gate/up {gate.type_name}, {up.type_name} and "
                         f"down {down.type_name} must be one of {sorted(GROUPED_TYPES)}")
    if (gate_bias is None) != (up_bias is None):
        raise ValueError("moe grouped GEMM: gate and up biases come together or not at all")
    if act not in ACTS:
        raise ValueError(f"moe: act must be one of {', '.join(ACTS)}, got {act!r}")
    k, n_ff, pairs = ws.k, gate.rows, tokens * ws.k
    one_warp = bn is None and one_warp_default()
    bn = bn or token_tile(pairs, ws.n_expert)
    n_tiles = max_tiles(pairs, ws.n_expert, bn)
    group_into(ids, ws.order, ws.slot_of, ws.tiles, pairs, ws.n_expert, bn, stream)
    words = q8_1_bytes(gate.n) // 4
    x_sorted = ws.x_sorted.reshape(-1)[:pairs * words]
    gather_kernel[pairs, 128, stream](xq.reshape(-1).view(np.uint32), x_sorted, ws.order,
                                      words, k)
    g, u = ws.h.reshape(-1)[:pairs * n_ff], ws.u.reshape(-1)[:pairs * n_ff]
    grouped_matmul_into(gate, x_sorted, g, ws.tiles, n_tiles, bn, stream, one_warp)
    grouped_matmul_into(up, x_sorted, u, ws.tiles, n_tiles, bn, stream, one_warp)
    hq = ws.hq.reshape(-1)[:pairs * q8_1_bytes(n_ff)].view(np.uint32)
    has_bias = gate_bias is not None
    glu_q8_1_kernel[(pairs, -(-n_ff // (32 * GLU_WARPS))), 32 * GLU_WARPS, stream](
        g, u, gate_bias if has_bias else g, up_bias if has_bias else g, ids, ws.order, hq,
        n_ff, ACTS[act], has_bias)
    grouped_matmul_into(down, hq, ws.ys, ws.tiles, n_tiles, bn, stream, one_warp)
    combine_kernel[((down.rows + 127) // 128, tokens), 128, stream](
        ws.ys, ws.slot_of, route_w, ws.ys if down_bias is None else down_bias, ids,
        y if res is None else res, y, down.rows, k, res is not None, down_bias is not None)
