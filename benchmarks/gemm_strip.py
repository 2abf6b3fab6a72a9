"""Where the int8 prefill GEMM's time goes (Q8_0, Q6_K: the two types whose GEMM trailed
llama.cpp's, RESULTS.md "The prefill GEMMs kernel by kernel"): the shipped super-block kernel
(gemm_q8_k_kernels.py) timed with parts of its K-step body taken out. Timing only: the stripped
variants compute wrong results.

The body here is compute_stage (in gemm_q8_k.py then, gemm_q8_k_kernels.py now) as of 4ca09d4,
where every type's scales came from the scale pass. Since 3c0c6e1 the 32-value formats
(Q4_0 ... Q8_0) have no scale pass (their scale products are f16 mma, the outcome of variant
8), so this copy no longer runs them correctly and --types accepts only Q6_K, whose body is
unchanged; the Q8_0 / Q4_0 rows of RESULTS.md were measured on 4ca09d4's tree.

Variants (bits of STRIP, combinable):
  0  the body unchanged (times as the library's kernel for Q6_K)
  1  per-block scales off: acc += float(isum) (I2FP + FADD instead of I2FP + FMUL + FFMA;
     Q6_K: one add for both halves instead of fold2's 2 I2FP + FMUL + 2 FFMA)
  2  no scale math at all: the mma accumulate in an int32 tile over the K step (its C
     operand), converted once per step
  4  aligned A fragments: every weight word read as if 4-byte aligned (one shared load, no
     funnel shift; Q6_K: no run-time 2-byte shift)
  (8 / 40, the 32-value formats' scale products by one f16 mma per tile, are now the library's
   scale_products: 4ca09d4's tree has them here)
  16 (Q6_K; exact up to rounding, a candidate) the two halves' i8 scales applied in integers
     (sc0 p + sc1 q, |.| < 2^24 so its float is exact), the token's d_x by one FFMA into a
     per-step sum, the row's d once per step: 2 integer ops + I2FP + FFMA per value instead
     of 2 I2FP + FMUL + 2 FFMA
The variant replaces gemm_q8_k_kernels.compute_stage (looked up by name when the kernel
compiles), so each variant is compiled into the same kernel and launched through
gemm_q8k_into, tiles and split-K as shipped. CUDA-graph replays timed with CUDA events, weights
on one buffer (as quant_gemm.py and llama.cpp's test-backend-ops).

    python3 benchmarks/gemm_strip.py [--types Q6_K] [--strips 0,1,2,4,6,16,20] [--tiles ...]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from pykernel import Const, Ptr, f32, i32, u32  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from benchmarks.quant_gemm import random_weights  # noqa: E402
from stdlib_kernels import _launch as L  # noqa: E402
from stdlib_kernels.quant import gemm_q8_k, gemm_q8_k_kernels  # noqa: E402
from stdlib_kernels.quant.formats import Q4_K, Q5_K, Q6_K  # noqa: E402
from stdlib_kernels.quant.gemm_q8_k_kernels import fold2, mma_halves, min_term  # noqa: E402
from stdlib_kernels.quant.gemm_q8_k import Q8KTiles  # noqa: E402
from stdlib_kernels.quant.gemm_q8_k_parts import (B_STRIDE, a_fragment,  # noqa: E402
                                                  q6k_shift, word_at)
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into  # noqa: E402

SHAPE = (4096, 512, 14336)      # llama-8B's down projection: m rows x n tokens x k


@pk.func
def strip_body(FMT: Const[int], GPU: Const[int], STRIP: Const[int], sm: Ptr[u32],
               smf: Ptr[f32], base: i32, sbase: i32, acc, rbase: i32, cbase: i32, g: i32,
               tg: i32, row0: i32, rows: i32, row_bytes: i32, sb: i32, MI: Const[int],
               NI: Const[int], BM: Const[int], AS: Const[int]):
    """gemm_q8_k.compute_stage for Q8_0 / Q6_K (and the other types unstripped), with STRIP."""
    bbase = base + BM * AS
    shift = pk.local_array(i32, 2 * MI)
    for h in pk.static_range(2 * MI):
        shift[h] = 0
        if FMT == Q6_K and STRIP & 4 == 0:
            shift[h] = q6k_shift(min(row0 + rbase + 8 * h + g, rows - 1), row_bytes, sb)
    if FMT == Q4_K or FMT == Q5_K:
        min_term(FMT, sm, smf, base, sbase, bbase, acc, rbase, cbase, g, tg, MI, NI, AS)
    # STRIP 16 (Q6_K): each fragment row's 16 i8 scales (4 words) and f16 d, read once per step
    scw = pk.local_array(u32, 8 * MI)
    drow = pk.local_array(f32, 2 * MI)
    step = pk.local_array(f32, 4 * MI * NI)
    if FMT == Q6_K and STRIP & 16 != 0:
        for h in pk.static_range(2 * MI):
            a = base + (rbase + 8 * h + g) * AS
            for w in pk.static_range(4):
                scw[4 * h + w] = word_at(sm, a, shift[h] + 192 + 4 * w)
            drow[h], unused = pk.unpack_f16x2(word_at(sm, a, shift[h] + 208) & u32(0xFFFF))
        for i in pk.static_range(4 * MI * NI):
            step[i] = 0.0
    iacc = pk.local_array(i32, 4 * MI * NI)
    for i in pk.static_range(4 * MI * NI):
        iacc[i] = 0
    for kb in pk.static_range(8):
        bq = pk.local_array(u32, 2 * NI)
        dx = pk.local_array(f32, 2 * NI)
        for ni in pk.static_range(NI):
            t = cbase + 8 * ni
            bq[2 * ni] = sm[bbase + (t + g) * B_STRIDE + 9 * kb + 1 + tg]
            bq[2 * ni + 1] = sm[bbase + (t + g) * B_STRIDE + 9 * kb + 5 + tg]
            for e in pk.static_range(2):
                dx[2 * ni + e] = smf[sbase + 16 * BM + 16 * (t + 2 * tg + e) + 2 * kb]
        for mi in pk.static_range(MI):
            r = rbase + 16 * mi + g
            if STRIP & 4 == 0:
                a0, a2 = a_fragment(FMT, sm, base + r * AS, shift[2 * mi], kb, tg)
                a1, a3 = a_fragment(FMT, sm, base + (r + 8) * AS, shift[2 * mi + 1], kb, tg)
            else:   # aligned words at the same places (wrong values, same amount of data)
                a0 = sm[base + r * AS + 8 * kb + tg]
                a2 = sm[base + r * AS + 8 * kb + 4 + tg]
                a1 = sm[base + (r + 8) * AS + 8 * kb + tg]
                a3 = sm[base + (r + 8) * AS + 8 * kb + 4 + tg]
            u0, v0 = pk.load_vec(smf, sbase + 16 * r + 2 * kb, 2)
            u8, v8 = pk.load_vec(smf, sbase + 16 * (r + 8) + 2 * kb, 2)
            for ni in pk.static_range(NI):
                i = 4 * (NI * mi + ni)
                b0 = bq[2 * ni]
                b1 = bq[2 * ni + 1]
                if STRIP & 2 != 0:
                    if FMT != Q6_K:
                        c0, c1, c2, c3 = pk.mma_m16n8k32_s8(a0, a1, a2, a3, b0, b1, iacc[i],
                                                            iacc[i + 1], iacc[i + 2],
                                                            iacc[i + 3])
                    else:
                        p0, p1, p2, p3, q0, q1, q2, q3 = mma_halves(GPU, a0, a1, a2, a3, b0,
                                                                    b1)
                        c0 = iacc[i] + p0 + q0
                        c1 = iacc[i + 1] + p1 + q1
                        c2 = iacc[i + 2] + p2 + q2
                        c3 = iacc[i + 3] + p3 + q3
                    iacc[i] = c0
                    iacc[i + 1] = c1
                    iacc[i + 2] = c2
                    iacc[i + 3] = c3
                elif FMT != Q6_K:
                    p0, p1, p2, p3 = pk.mma_m16n8k32_s8(a0, a1, a2, a3, b0, b1, 0, 0, 0, 0)
                    if STRIP & 1 != 0:
                        acc[i] += f32(p0)
                        acc[i + 1] += f32(p1)
                        acc[i + 2] += f32(p2)
                        acc[i + 3] += f32(p3)
                    else:
                        acc[i] = pk.fma(u0 * dx[2 * ni], f32(p0), acc[i])
                        acc[i + 1] = pk.fma(u0 * dx[2 * ni + 1], f32(p1), acc[i + 1])
                        acc[i + 2] = pk.fma(u8 * dx[2 * ni], f32(p2), acc[i + 2])
                        acc[i + 3] = pk.fma(u8 * dx[2 * ni + 1], f32(p3), acc[i + 3])
                else:
                    p0, p1, p2, p3, q0, q1, q2, q3 = mma_halves(GPU, a0, a1, a2, a3, b0, b1)
                    if STRIP & 16 != 0:   # the halves' i8 scales in integers, d once per step
                        sg0 = i8_at(scw[8 * mi + kb // 2], 2 * (kb % 2))
                        sg1 = i8_at(scw[8 * mi + kb // 2], 2 * (kb % 2) + 1)
                        s80 = i8_at(scw[8 * mi + 4 + kb // 2], 2 * (kb % 2))
                        s81 = i8_at(scw[8 * mi + 4 + kb // 2], 2 * (kb % 2) + 1)
                        step[i] = pk.fma(dx[2 * ni], f32(sg0 * p0 + sg1 * q0), step[i])
                        step[i + 1] = pk.fma(dx[2 * ni + 1], f32(sg0 * p1 + sg1 * q1),
                                             step[i + 1])
                        step[i + 2] = pk.fma(dx[2 * ni], f32(s80 * p2 + s81 * q2), step[i + 2])
                        step[i + 3] = pk.fma(dx[2 * ni + 1], f32(s80 * p3 + s81 * q3),
                                             step[i + 3])
                    elif STRIP & 1 != 0:
                        acc[i] += f32(p0 + q0)
                        acc[i + 1] += f32(p1 + q1)
                        acc[i + 2] += f32(p2 + q2)
                        acc[i + 3] += f32(p3 + q3)
                    else:
                        acc[i] = fold2(acc[i], dx[2 * ni], u0, p0, v0, q0)
                        acc[i + 1] = fold2(acc[i + 1], dx[2 * ni + 1], u0, p1, v0, q1)
                        acc[i + 2] = fold2(acc[i + 2], dx[2 * ni], u8, p2, v8, q2)
                        acc[i + 3] = fold2(acc[i + 3], dx[2 * ni + 1], u8, p3, v8, q3)
    if STRIP & 2 != 0:
        for i in pk.static_range(4 * MI * NI):
            acc[i] += f32(iacc[i])
    if FMT == Q6_K and STRIP & 16 != 0:
        for mi in pk.static_range(MI):
            for ni in pk.static_range(NI):
                i = 4 * (NI * mi + ni)
                acc[i] = pk.fma(drow[2 * mi], step[i], acc[i])
                acc[i + 1] = pk.fma(drow[2 * mi], step[i + 1], acc[i + 1])
                acc[i + 2] = pk.fma(drow[2 * mi + 1], step[i + 2], acc[i + 2])
                acc[i + 3] = pk.fma(drow[2 * mi + 1], step[i + 3], acc[i + 3])


@pk.func
def i8_at(w: u32, byte: Const[int]) -> i32:
    """Byte `byte` of w as a signed integer."""
    return i32(w << u32(24 - 8 * byte)) >> 24


def variant(strip: int):
    """A compute_stage with the shipped one's signature that runs strip_body with STRIP = strip."""
    @pk.func
    def compute_stage(FMT: Const[int], GPU: Const[int], sm: Ptr[u32], smf: Ptr[f32],
                      base: i32, sbase: i32, acc, rbase: i32, cbase: i32, g: i32, tg: i32,
                      row0: i32, rows: i32, row_bytes: i32, sb: i32, MI: Const[int],
                      NI: Const[int], BM: Const[int], AS: Const[int]):
        strip_body(FMT, GPU, STRIP_VALUE, sm, smf, base, sbase, acc, rbase, cbase, g, tg,
                   row0, rows, row_bytes, sb, MI, NI, BM, AS)
    STRIP_VALUE = strip   # noqa: F841  (a closure constant, compiled in)
    return compute_stage


def time_variant(type_name: str, strip: int | None, w, xq, y, tiles=None) -> float:
    M, TOKENS, K = SHAPE
    shipped = gemm_q8_k_kernels.compute_stage
    if strip is not None:
        gemm_q8_k_kernels.compute_stage = variant(strip)
    L._COMPILED.clear()           # launch's in-process cache is keyed by the kernel alone
    try:
        def record():
            for _ in range(3):
                gemm_q8_k.gemm_q8k_into(w, type_name, xq, y, M, K, TOKENS, tiles=tiles)
        return replay_seconds(record, 5) * 1e6 / 3
    finally:
        gemm_q8_k_kernels.compute_stage = shipped
        L._COMPILED.clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q6_K")
    ap.add_argument("--strips", default="0,1,2,4,6,16,20")
    ap.add_argument("--tiles", default="", help="extra tile shapes mi.ni.wm.wn.stages, comma "
                    "separated: every variant is also timed with each")
    args = ap.parse_args()
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    M, TOKENS, K = SHAPE
    print(f"{pk.current_device().name}; (m, n, k) = {SHAPE}, tiles and split-K as shipped")
    print("| type | variant | us | TFLOPS |\n|---|---|---|---|")
    for type_name in args.types.split(","):
        if type_name != "Q6_K":
            raise SystemExit(f"gemm_strip: {type_name}: only Q6_K (see the docstring; the "
                             f"32-value formats' rows need 4ca09d4's tree)")
        w = random_weights(type_name, M, K, rng)
        x = pk.to_device(rng.standard_normal((TOKENS, K)).astype(np.float32))
        xq = pk.empty((TOKENS, q8_1_bytes(K)), np.uint8)
        quantize_q8_1_into(x, xq)
        y = pk.empty((TOKENS, M), np.float32)
        rows = [("library kernel", None)] + [(f"STRIP {s}", int(s))
                                              for s in args.strips.split(",")]
        shapes = [None] + [Q8KTiles(*(int(v) for v in t.split("."))) for t in
                           args.tiles.split(",") if t]
        for tiles in shapes:
            for label, strip in rows:
                try:
                    us = time_variant(type_name, strip, w, xq, y, tiles)
                except Exception as e:     # e.g. a tile over the shared-memory limit
                    print(f"| {type_name} | {label}, tiles {tiles} | failed: {e} | |")
                    continue
                name = label if tiles is None else f"{label}, tiles {tuple(tiles)}"
                print(f"| {type_name} | {name} | {us:.0f} | "
                      f"{2.0 * M * TOKENS * K / us / 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()
