"""Where the int8 prefill GEMM's time goes (Q6_K, the type whose GEMM trails llama.cpp's most,
RESULTS.md "The prefill GEMMs kernel by kernel"): the shipped super-block kernel (gemm_q8_k.py)
timed with parts of its K-step body taken out. Timing only: the stripped variants compute
wrong results.

The body here is gemm_q8_k.compute_stage's Q6_K path. Earlier variants are recorded in
RESULTS.md with the trees they ran on: the 32-value formats' rows and the scale-products
variants (4ca09d4's tree, before those formats lost their scale pass), aligned A fragments
and the halves' scales in integers (b02ed7c's, before the scale pass moved Q6_K's quants to
aligned words).

Variants (bits of STRIP):
  0  the body unchanged (times as the library's kernel)
  1  per-block scales off: acc += float(p + q) (one I2FP + FADD instead of fold2's 2 I2FP +
     FMUL + 2 FFMA)
  2  no scale math at all: the two halves' products summed into an int32 tile over the K
     step, converted once per step
The variant replaces gemm_q8_k.compute_stage (looked up by name when the kernel compiles), so
each variant is compiled into the same kernel and launched through gemm_q8k_into, tiles and
split-K as shipped. CUDA-graph replays timed with CUDA events, weights on one buffer (as
quant_gemm.py and llama.cpp's test-backend-ops).

    python3 benchmarks/gemm_strip.py [--types Q6_K] [--strips 0,1,2] [--tiles ...]
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
from stdlib_kernels.quant import gemm_q8_k  # noqa: E402
from stdlib_kernels.quant.gemm_q8_k import Q8KTiles, fold2, mma_halves  # noqa: E402
from stdlib_kernels.quant.gemm_q8_k_parts import B_STRIDE, a_fragment  # noqa: E402
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into  # noqa: E402

SHAPE = (4096, 512, 14336)      # llama-8B's down projection: m rows x n tokens x k


@pk.func
def strip_body(FMT: Const[int], GPU: Const[int], STRIP: Const[int], sm: Ptr[u32],
               smf: Ptr[f32], base: i32, sbase: i32, acc, rbase: i32, cbase: i32, g: i32,
               tg: i32, MI: Const[int], NI: Const[int], BM: Const[int], AS: Const[int]):
    """gemm_q8_k.compute_stage for Q6_K, with STRIP."""
    bbase = base + BM * AS
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
            a0, a2 = a_fragment(FMT, sm, base + r * AS, kb, tg)
            a1, a3 = a_fragment(FMT, sm, base + (r + 8) * AS, kb, tg)
            u0, v0 = pk.load_vec(smf, sbase + 16 * r + 2 * kb, 2)
            u8, v8 = pk.load_vec(smf, sbase + 16 * (r + 8) + 2 * kb, 2)
            for ni in pk.static_range(NI):
                i = 4 * (NI * mi + ni)
                p0, p1, p2, p3, q0, q1, q2, q3 = mma_halves(GPU, a0, a1, a2, a3, bq[2 * ni],
                                                            bq[2 * ni + 1])
                if STRIP & 2 != 0:
                    iacc[i] += p0 + q0
                    iacc[i + 1] += p1 + q1
                    iacc[i + 2] += p2 + q2
                    iacc[i + 3] += p3 + q3
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


def variant(strip: int):
    """A compute_stage with gemm_q8_k's signature that runs strip_body with STRIP = strip."""
    @pk.func
    def compute_stage(FMT: Const[int], GPU: Const[int], sm: Ptr[u32], smf: Ptr[f32],
                      base: i32, sbase: i32, acc, rbase: i32, cbase: i32, g: i32, tg: i32,
                      MI: Const[int], NI: Const[int], BM: Const[int], AS: Const[int]):
        strip_body(FMT, GPU, STRIP_VALUE, sm, smf, base, sbase, acc, rbase, cbase, g, tg,
                   MI, NI, BM, AS)
    STRIP_VALUE = strip   # noqa: F841  (a closure constant, compiled in)
    return compute_stage


def time_variant(type_name: str, strip: int | None, w, xq, y, tiles=None) -> float:
    M, TOKENS, K = SHAPE
    shipped = gemm_q8_k.compute_stage
    if strip is not None:
        gemm_q8_k.compute_stage = variant(strip)
    L._COMPILED.clear()           # launch's in-process cache is keyed by the kernel alone
    try:
        def record():
            for _ in range(3):
                gemm_q8_k.gemm_q8k_into(w, type_name, xq, y, M, K, TOKENS, tiles=tiles)
        return replay_seconds(record, 5) * 1e6 / 3
    finally:
        gemm_q8_k.compute_stage = shipped
        L._COMPILED.clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q6_K")
    ap.add_argument("--strips", default="0,1,2")
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
