"""Kernels of the int8 tensor-core prefill GEMM per 256-value K step (Q4_K, Q5_K, Q6_K; Q4_0,
Q8_0, Q4_1, Q5_0, Q5_1 when K % 256 == 0): Y[t, r] = sum_k W[r, k] X[t, k], X as Q8_1 rows.
Launched by gemm_q8_k.gemm_q8k_into (tile shapes, split-K plan); staging copies, the scale pass
and the A fragments are gemm_q8_k_parts.py's.

Same arithmetic as gemm_q8.py (llama.cpp's mmq: int8 `mma` per 32-value block, scaled into f32
accumulators: acc += d_w d_x isum, Q4_K also acc -= dmin m s_x), organised for the 256-value
super-blocks. Q4_K's min term is summed over a step's 8 blocks by one f16 `mma` per tile
(min_term: the 6-bit mins and the f16 block sums are exact f16 operands) and scaled by dmin
once, instead of one fma per block and accumulator. One K step = one super-block. Each step's
raw bytes (the BM weight rows' super-blocks, the BN tokens' 8 Q8_1 blocks) are copied
unchanged into a shared-memory stage with 16-byte `cp.async` (Q6_K's 210-byte blocks are only
2-byte aligned: 4-byte copies of the aligned words around them), STAGES deep, so the copies
of later steps overlap the mma of this one. For the K-quants, once a step has landed, one pass
of the whole block turns its 6-bit scales (and the activations' (d, s)) into floats in shared
memory, one step ahead of its use; the warps then build the int8 A fragments straight from
the raw quants (Q4_K: a shift and a mask; Q6_K: low nibbles | high bits - 32; Q5_K: Q4_K's
nibbles | the qh bit) and run the mma (Q6_K: `mma.m16n8k16` per 16-value half on CUDA, so
both halves' scales apply; two zero-padded k32 mma on the CPU target). One barrier per K step.
Q4_0 / Q8_0: a K step is 8 raw 32-blocks per row (144 / 272 B, 16-byte aligned as K % 256 == 0);
the scale pass reads each block's f16 d, the fragments are word-aligned or funnel-shifted by 2
bytes (known per block at compile time), Q4_0's nibbles minus 8 exactly as int8 (sign-bit trick).
The 32-value formats (Q4_0, Q8_0, Q4_1, Q5_0, Q5_1) form each tile's 16 x 8 products d_w d_x
with one f16 mma (scale_products) from the f16 scales as they lie in the stage, exact, instead
of an FMUL per value, and need no scale pass (the GEMM is issue-bound: the 8B's GEMMs took
11-31% less on an H100, benchmarks/RESULTS.md "The int8 GEMM without its scale pass") and no
scale buffers in shared memory.
Q4_1 / Q5_0 / Q5_1 (160 / 176 / 192 B steps) likewise, Q5's fifth bits merged from qh (Q5_0's
values minus 16); the mins of Q4_1 / Q5_1 (W = d q + m: + m s_x per block) go through
min_term as Q4_K's do (f16 mins, "dmin" -1), one f16 mma per tile and step instead of an fma
per accumulator and block.
Shared memory: see gemm_q8_k_parts.py (200 KB for 128 x 128 tiles, 3 stages; dynamic).
Split-K (split > 1, auto_split by default on a GPU): grid z splits the K steps; each block
writes its fragments to a per-stream workspace and the last block of a tile (a counter per
tile) adds them in split order and stores C: deterministic whatever the blocks' timing.
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32

from .._select import last_block_done
from .formats import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from .gemm import store_c
from .gemm_q8_k_parts import B_STRIDE, a_fragment, issue_stage, q6k_shift, scale_pass


@pk.func
def mma_halves(GPU: Const[int], a0: u32, a1: u32, a2: u32, a3: u32, b0: u32, b1: u32):
    """Integer products of k 0..15 and of k 16..31 of a k32 fragment pair, separately."""
    if GPU == 1:
        p0, p1, p2, p3 = pk.asm(
            "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {$0,$1,$2,$3}, {$4,$5}, {$6}, "
            "{$7,$7,$7,$7};", "=r,=r,=r,=r,r,r,r,r", (i32, i32, i32, i32), a0, a1, b0, 0)
        q0, q1, q2, q3 = pk.asm(
            "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {$0,$1,$2,$3}, {$4,$5}, {$6}, "
            "{$7,$7,$7,$7};", "=r,=r,=r,=r,r,r,r,r", (i32, i32, i32, i32), a2, a3, b1, 0)
        return p0, p1, p2, p3, q0, q1, q2, q3
    else:
        p0, p1, p2, p3 = pk.mma_m16n8k32_s8(a0, a1, u32(0), u32(0), b0, b1, 0, 0, 0, 0)
        q0, q1, q2, q3 = pk.mma_m16n8k32_s8(u32(0), u32(0), a2, a3, b0, b1, 0, 0, 0, 0)
        return p0, p1, p2, p3, q0, q1, q2, q3


@pk.func
def scale_products(GPU: Const[int], a0: u32, a1: u32, b0: u32):
    """(c0, c1, c2, c3): the products d_row d_token of an m16n8 tile, by one f16 mma of the
    rows' and tokens' f16 scales at k = 0 (a0 / a1 / b0 of the lanes with t = 0, zero
    elsewhere): exact in f32, as the FMUL of the two scales is. m16n8k8 on CUDA (half the
    tensor work of k16); on the CPU target m16n8k16 with k 8..15 zero, the same values."""
    if GPU == 1:
        return pk.asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {$0,$1,$2,$3}, "
                      "{$4,$5}, {$6}, {$7,$7,$7,$7};", "=f,=f,=f,=f,r,r,r,f",
                      (f32, f32, f32, f32), a0, a1, b0, f32(0.0))
    else:
        return pk.mma_m16n8k16_f16(a0, a1, u32(0), u32(0), b0, u32(0), 0.0, 0.0, 0.0, 0.0)


@pk.func
def min_term(FMT: Const[int], sm: Ptr[u32], smf: Ptr[f32], base: i32, sbase: i32, bbase: i32,
             acc, rbase: i32, cbase: i32, g: i32, tg: i32, MI: Const[int], NI: Const[int],
             AS: Const[int]):
    """The mins' term of one super-block step on the tensor cores: Q4_K / Q5_K's acc -=
    dmin_r sum_kb m_r,kb s_t,kb (6-bit mins from the scale pass, scaled by the row's dmin),
    Q4_1 / Q5_1's acc += sum_kb m_r,kb s_t,kb (W = d q + m; their f16 m straight from the
    stage). The 8 mins and the activations' block sums (f16 in the Q8_1 words) are exact f16
    operands of one m16n8k16 mma per tile (k 8..15 zero): 8 mma + 4 MI NI adds instead of
    32 MI NI fma."""
    bs = pk.local_array(u32, NI)
    for ni in pk.static_range(NI):        # B: s of token g, blocks 2 tg and 2 tg + 1
        w = bbase + (cbase + 8 * ni + g) * B_STRIDE + 18 * tg
        bs[ni] = (sm[w] >> u32(16)) | (sm[w + 9] & u32(0xFFFF0000))
    for mi in pk.static_range(MI):
        r = rbase + 16 * mi + g
        if FMT == Q4_1 or FMT == Q5_1:    # m = high half of each block's (d, m) word
            W = 5 if FMT == Q4_1 else 6   # words per block
            a0 = (sm[base + r * AS + 2 * W * tg] >> u32(16)) | \
                (sm[base + r * AS + W * (2 * tg + 1)] & u32(0xFFFF0000))
            a1 = (sm[base + (r + 8) * AS + 2 * W * tg] >> u32(16)) | \
                (sm[base + (r + 8) * AS + W * (2 * tg + 1)] & u32(0xFFFF0000))
            for ni in pk.static_range(NI):
                i = 4 * (NI * mi + ni)
                c0, c1, c2, c3 = pk.mma_m16n8k16_f16(a0, a1, u32(0), u32(0), bs[ni], u32(0),
                                                     0.0, 0.0, 0.0, 0.0)
                acc[i] += c0
                acc[i + 1] += c1
                acc[i + 2] += c2
                acc[i + 3] += c3
        else:
            a0 = sm[sbase + 16 * r + 8 + tg]          # mins of blocks 2 tg, 2 tg + 1, row r
            a1 = sm[sbase + 16 * (r + 8) + 8 + tg]
            dmin0 = smf[sbase + 16 * r + 12]
            dmin8 = smf[sbase + 16 * (r + 8) + 12]
            for ni in pk.static_range(NI):
                i = 4 * (NI * mi + ni)
                c0, c1, c2, c3 = pk.mma_m16n8k16_f16(a0, a1, u32(0), u32(0), bs[ni], u32(0),
                                                     0.0, 0.0, 0.0, 0.0)
                acc[i] = pk.fma(-dmin0, c0, acc[i])
                acc[i + 1] = pk.fma(-dmin0, c1, acc[i + 1])
                acc[i + 2] = pk.fma(-dmin8, c2, acc[i + 2])
                acc[i + 3] = pk.fma(-dmin8, c3, acc[i + 3])


@pk.func
def fold2(acc: f32, dx: f32, s0: f32, p: i32, s1: f32, q: i32) -> f32:
    """acc + dx (s0 p + s1 q): the two 16-value halves of a Q6_K block. (Applying the two i8
    scales in integers, one int -> float instead of two, measured 2% slower on the H200.)"""
    return pk.fma(dx, pk.fma(s0, f32(p), s1 * f32(q)), acc)


@pk.func
def compute_stage(FMT: Const[int], GPU: Const[int], sm: Ptr[u32], smf: Ptr[f32], base: i32,
                  sbase: i32, acc, rbase: i32, cbase: i32, g: i32, tg: i32, row0: i32,
                  rows: i32, row_bytes: i32, sb: i32, MI: Const[int], NI: Const[int],
                  BM: Const[int], AS: Const[int]):
    """The warp's 16 MI x 8 NI tile over one landed super-block step. Fragment c_e of an m16n8
    tile: row g + 8 (e // 2), token 2 tg + e % 2."""
    bbase = base + BM * AS
    shift = pk.local_array(i32, 2 * MI)
    for h in pk.static_range(2 * MI):
        shift[h] = 0
        if FMT == Q6_K:
            shift[h] = q6k_shift(min(row0 + rbase + 8 * h + g, rows - 1), row_bytes, sb)
    if FMT == Q4_K or FMT == Q5_K or FMT == Q4_1 or FMT == Q5_1:
        min_term(FMT, sm, smf, base, sbase, bbase, acc, rbase, cbase, g, tg, MI, NI, AS)
    k0_mask = u32(0xFFFF) if tg == 0 else u32(0)    # scale_products' k = 0 lanes
    # the 32-value formats: one f16 d at the start of each block of DB bytes
    RAW_D = FMT == Q8_0 or FMT == Q4_0 or FMT == Q5_0 or FMT == Q4_1 or FMT == Q5_1
    DB = 34 if FMT == Q8_0 else (18 if FMT == Q4_0 else (22 if FMT == Q5_0 else (
        20 if FMT == Q4_1 else 24)))
    for kb in pk.static_range(8):
        bq = pk.local_array(u32, 2 * NI)
        dx = pk.local_array(f32, 2 * NI)
        bd = pk.local_array(u32, NI)
        for ni in pk.static_range(NI):
            t = cbase + 8 * ni
            bq[2 * ni] = sm[bbase + (t + g) * B_STRIDE + 9 * kb + 1 + tg]
            bq[2 * ni + 1] = sm[bbase + (t + g) * B_STRIDE + 9 * kb + 5 + tg]
            if RAW_D:   # token g's f16 d, straight from its Q8_1 block's (d, s) word
                bd[ni] = sm[bbase + (t + g) * B_STRIDE + 9 * kb] & k0_mask
            else:
                for e in pk.static_range(2):   # d of the token's block
                    dx[2 * ni + e] = smf[sbase + 16 * BM + 16 * (t + 2 * tg + e) + 2 * kb]
        for mi in pk.static_range(MI):
            r = rbase + 16 * mi + g
            a0, a2 = a_fragment(FMT, sm, base + r * AS, shift[2 * mi], kb, tg)
            a1, a3 = a_fragment(FMT, sm, base + (r + 8) * AS, shift[2 * mi + 1], kb, tg)
            ad0 = u32(0)      # RAW_D: rows g and g + 8's f16 d (byte DB kb of the step)
            ad1 = u32(0)
            u0 = f32(0.0)     # the scale pass's floats: Q4_K / Q5_K d * sc, Q6_K the halves'
            u8 = f32(0.0)
            v0 = f32(0.0)
            v8 = f32(0.0)
            if RAW_D:
                ad0 = (sm[base + r * AS + DB * kb // 4] >> u32(8 * (DB * kb % 4))) & k0_mask
                ad1 = (sm[base + (r + 8) * AS + DB * kb // 4] >> u32(8 * (DB * kb % 4))) & \
                    k0_mask
            elif FMT == Q6_K:
                u0, v0 = pk.load_vec(smf, sbase + 16 * r + 2 * kb, 2)
                u8, v8 = pk.load_vec(smf, sbase + 16 * (r + 8) + 2 * kb, 2)
            else:
                u0 = smf[sbase + 16 * r + kb]
                u8 = smf[sbase + 16 * (r + 8) + kb]
            for ni in pk.static_range(NI):
                i = 4 * (NI * mi + ni)
                b0 = bq[2 * ni]
                b1 = bq[2 * ni + 1]
                if RAW_D:   # d_w d_x of the tile by the tensor cores, not 4 FMUL
                    p0, p1, p2, p3 = pk.mma_m16n8k32_s8(a0, a1, a2, a3, b0, b1, 0, 0, 0, 0)
                    s0, s1, s2, s3 = scale_products(GPU, ad0, ad1, bd[ni])
                    acc[i] = pk.fma(s0, f32(p0), acc[i])
                    acc[i + 1] = pk.fma(s1, f32(p1), acc[i + 1])
                    acc[i + 2] = pk.fma(s2, f32(p2), acc[i + 2])
                    acc[i + 3] = pk.fma(s3, f32(p3), acc[i + 3])
                elif FMT != Q6_K:   # u = the block's scale
                    p0, p1, p2, p3 = pk.mma_m16n8k32_s8(a0, a1, a2, a3, b0, b1, 0, 0, 0, 0)
                    acc[i] = pk.fma(u0 * dx[2 * ni], f32(p0), acc[i])
                    acc[i + 1] = pk.fma(u0 * dx[2 * ni + 1], f32(p1), acc[i + 1])
                    acc[i + 2] = pk.fma(u8 * dx[2 * ni], f32(p2), acc[i + 2])
                    acc[i + 3] = pk.fma(u8 * dx[2 * ni + 1], f32(p3), acc[i + 3])
                else:             # (u, v) = scales of the two 16-value halves
                    p0, p1, p2, p3, q0, q1, q2, q3 = mma_halves(GPU, a0, a1, a2, a3, b0, b1)
                    acc[i] = fold2(acc[i], dx[2 * ni], u0, p0, v0, q0)
                    acc[i + 1] = fold2(acc[i + 1], dx[2 * ni + 1], u0, p1, v0, q1)
                    acc[i + 2] = fold2(acc[i + 2], dx[2 * ni], u8, p2, v8, q2)
                    acc[i + 3] = fold2(acc[i + 3], dx[2 * ni + 1], u8, p3, v8, q3)


@pk.kernel
def gemm_q8k_kernel(w: Ptr["WT", "ro"], xq: Ptr[u32, "ro"], y: Ptr[f32], ldy: i32,
                    col0: i32, res: Ptr[f32], rows: i32, row_words: i32, K: i32, tokens: i32,
                    part: Ptr[f32], counters: Ptr[i32],
                    FMT: Const[int], WT: Const[pk.dtype], GPU: Const[int], MI: Const[int],
                    NI: Const[int], WM: Const[int], WN: Const[int], STAGES: Const[int],
                    HAS_RES: Const[bool], SPLIT: Const[int], AS: Const[int], AW: Const[int]):
    sm = pk.dynamic_shared(u32)
    smf = pk.dynamic_shared(f32)
    BM = 16 * MI * WM
    BN = 8 * NI * WN
    NT = 32 * WM * WN
    NACC = 4 * MI * NI
    SW = BM * AS + BN * B_STRIDE
    SCALES = STAGES * SW          # two scale buffers of 16 (BM + BN) floats follow the stages
    tid = pk.thread_idx.x
    lane = tid % 32
    rbase = (tid // 32) % WM * 16 * MI
    cbase = (tid // 32) // WM * 8 * NI
    row0 = pk.block_idx.x * BM
    tok0 = pk.block_idx.y * BN
    xstride = K // 32 * 9
    nsb = K // 256
    # split-K: block z runs K steps first .. first + n - 1 (SPLIT 1: all of them)
    z = pk.block_idx.z
    first = z * nsb // SPLIT
    n = (z + 1) * nsb // SPLIT - first
    row_bytes = row_words * (2 if FMT == Q6_K else 4)
    acc = pk.local_array(f32, NACC)
    for i in pk.static_range(NACC):
        acc[i] = 0.0
    for s in pk.static_range(STAGES - 1):
        if s < n:
            issue_stage(FMT, sm, s * SW, w, xq, rows, row_words, tokens, xstride, row0, tok0,
                        first + s, tid, BM, BN, NT, AS, AW)
        pk.cp_async_commit()
    pk.cp_async_wait(STAGES - 2)
    pk.syncthreads()
    scale_pass(FMT, sm, smf, 0, SCALES, row0, rows, row_bytes, first, tid, BM, BN, NT, AS)
    for j in range(n):
        pk.cp_async_wait(STAGES - 3)      # step j + 1 has landed (for its scale pass)
        pk.syncthreads()                  # ... for every thread; step j - 1 is finished
        ahead = j + STAGES - 1
        if ahead < n:
            issue_stage(FMT, sm, ahead % STAGES * SW, w, xq, rows, row_words, tokens, xstride,
                        row0, tok0, first + ahead, tid, BM, BN, NT, AS, AW)
        pk.cp_async_commit()
        if j + 1 < n:
            scale_pass(FMT, sm, smf, (j + 1) % STAGES * SW, SCALES + (j + 1) % 2 * 16 *
                       (BM + BN), row0, rows, row_bytes, first + j + 1, tid, BM, BN, NT, AS)
        compute_stage(FMT, GPU, sm, smf, j % STAGES * SW, SCALES + j % 2 * 16 * (BM + BN),
                      acc, rbase, cbase, lane // 4, lane % 4, row0, rows, row_bytes, first + j,
                      MI, NI, BM, AS)
    r_out = row0 + rbase + lane // 4
    t_out = tok0 + cbase + 2 * (lane % 4)
    if SPLIT == 1:
        store_c(acc, y, ldy, col0, res, rows, tokens, r_out, t_out, MI, NI, HAS_RES)
    else:
        # each split's fragments to part; the block finishing last sums them in split order
        # (the same sum whichever block that is: deterministic) and stores C
        tile = pk.block_idx.y * pk.grid_dim.x + pk.block_idx.x
        stride = pk.grid_dim.x * pk.grid_dim.y * NACC * NT
        mine = tile * NACC * NT + tid
        for i in pk.static_range(NACC):
            part[z * stride + mine + i * NT] = acc[i]
        done = pk.shared_array(i32, 1)
        if last_block_done(counters, tile, SPLIT, done):
            for i in pk.static_range(NACC):
                acc[i] = 0.0
            for zz in range(SPLIT):
                for i in pk.static_range(NACC):
                    acc[i] += part[zz * stride + mine + i * NT]
            store_c(acc, y, ldy, col0, res, rows, tokens, r_out, t_out, MI, NI, HAS_RES)
