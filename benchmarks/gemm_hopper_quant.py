"""The quantized wgmma GEMM (stdlib_kernels.gemm_hopper_quant: GGUF weights dequantized to f16
in shared memory) on llama-8B's projections at 512 tokens, beside today's int8 prefill GEMM,
gemm_hopper on pre-dequantized f16 weights, and the dequant-to-f16 route (quant.dequant_f16
into a scratch buffer, then gemm_hopper: quant.matmul.matmul_dequant_f16_into) (issue 43).
Needs a CUDA GPU with sm_90a.

    python3 benchmarks/gemm_hopper_quant.py [--types Q8_0,Q4_K,Q6_K] [--tokens 512]
                                            [--shapes 4096x4096,14336x4096,4096x14336,1024x4096]
                                            [--configs auto,128x4,128x3/raw3 | all]

Per shape (N x K weights, M = tokens) and type, TFLOPS-equivalent (2 M N K / seconds) of
  int8 GEMM   gemm_q8_into on Q8_1 activations (what quant.matmul_into launches for prefill,
              without its quantize_q8_1; "int8 route" adds it: the launches matmul_into makes)
  wgmma-q     gemm_hopper_quant on f16 activations, per config (auto = choose_quant_config)
  f16 wgmma   gemm_hopper on the weights dequantized to f16 beforehand (its choose_config):
              the ceiling of the dequantizing kernel (the same consumers without the dequant)
  dequant + f16 wgmma   the dequant_f16 pass alone (GB/s of raw bytes read + f16 written),
              its sum with f16 wgmma and the f32 -> f16 cast, and the route's launches as one
              graph (matmul_dequant_f16_into on f32 activations), against the int8 route
and the f32 -> f16 cast of the activations (elementwise.convert), which a runner path on
wgmma-q would launch where the int8 route launches quantize_q8_1; the last line per shape
compares the best wgmma-q config plus that cast with the int8 route.
Every launch is replayed from a CUDA graph and timed with CUDA events. Checked first: every
wgmma-q config against f16 wgmma (relative Frobenius difference: the same f16 operands, so
~1e-7 or 0), and the int8 GEMM against f16 wgmma (its Q8_1 activations: ~1e-2). Weights are
random quants with f16 scales drawn from N(0, 0.01).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk
from benchmarks._timing import replay_seconds
from benchmarks.quant_gemm import random_raw
from stdlib_kernels import gemm_hopper as G
from stdlib_kernels import gemm_hopper_quant as Q
from stdlib_kernels.elementwise import convert
from stdlib_kernels.quant import device
from stdlib_kernels.quant.dequant_f16 import dequantize_f16_into
from stdlib_kernels.quant.gemm_q8 import gemm_q8_into
from stdlib_kernels.quant.gemv import weight_words
from stdlib_kernels.quant.matmul import matmul_dequant_f16_into, matmul_into
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into

SHAPES = "4096x4096,14336x4096,4096x14336,1024x4096"      # N x K: q/o, gate/up, down, k/v
ALL_CONFIGS = ("auto,128x4,128x3/tma2,128x3/raw3,128x4/pp,256x3,64x4,128x3/m256,64x4/m256,"
               "128x2/m256/tma2")


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def bench_shape(type_name, M, N, K, configs, rng):
    flops = 2.0 * M * N * K
    raw = random_raw(type_name, N, K, rng)
    x = rng.standard_normal((M, K)).astype(np.float32)
    a16, x32 = pk.to_device(x.astype(np.float16)), pk.to_device(x)
    w16 = device.dequantize(raw, type_name, K, dtype=np.float16)
    y = pk.empty((M, N), np.float32)
    line = f"{type_name} {N}x{K} M={M}"

    G.gemm_hopper(a16, w16, out=y)
    want = y.numpy()
    secs = secs_f16 = replay_seconds(lambda: G.gemm_hopper(a16, w16, out=y))
    print(f"{line}  f16 wgmma (pre-dequantized, {G.choose_config(M, N)}) "
          f"{flops / secs / 1e12:7.1f} TFLOPS ({secs * 1e6:.0f} us)", flush=True)

    words = weight_words(raw, type_name, K)[0]
    xq = pk.empty((M, q8_1_bytes(K)), np.uint8)
    quantize_q8_1_into(x32, xq)
    gemm_q8_into(words, type_name, xq, y, N, K, M)
    print(f"{line}  int8 GEMM vs f16 wgmma: rel. difference {rel(y.numpy(), want):.1e}")
    secs = replay_seconds(lambda: gemm_q8_into(words, type_name, xq, y, N, K, M))
    print(f"{line}  int8 GEMM   {flops / secs / 1e12:7.1f} TFLOPS ({secs * 1e6:.0f} us)")
    t_int8 = replay_seconds(lambda: matmul_into(words, type_name, x32, y, N, K, M, xq=xq))
    print(f"{line}  int8 route  {flops / t_int8 / 1e12:7.1f} TFLOPS ({t_int8 * 1e6:.0f} us, "
          f"with quantize_q8_1)", flush=True)
    t_cast = replay_seconds(lambda: convert(x32, np.float16, out=a16))
    print(f"{line}  f32 -> f16 activations {t_cast * 1e6:.0f} us (the wgmma path's counterpart "
          f"of quantize_q8_1)")

    bench_dequant_route(line, flops, type_name, raw, words, x32, y, want, secs_f16, t_cast,
                        t_int8, (M, N, K))
    best = None
    for name in configs:
        config = None if name == "auto" else name
        shown = f"auto={Q.choose_quant_config(type_name)}" if config is None else name
        y.fill(np.nan)
        try:
            Q.gemm_hopper_quant(a16, raw, type_name, out=y, config=config)
        except ValueError as err:                    # the shared-memory budget rules it out
            print(f"{line}  wgmma-q {shown:<16s} skipped: {err}")
            continue
        diff = rel(y.numpy(), want)
        secs = replay_seconds(lambda config=config: Q.gemm_hopper_quant(a16, raw, type_name,
                                                                        out=y, config=config))
        print(f"{line}  wgmma-q {shown:<16s} {flops / secs / 1e12:7.1f} TFLOPS "
              f"({secs * 1e6:.0f} us; vs f16 wgmma {diff:.1e})", flush=True)
        best = min(best or (secs, shown), (secs, shown))
    if best:
        secs, shown = best
        print(f"{line}  best wgmma-q {shown}: {flops / secs / 1e12:.1f} TFLOPS, with the f16 "
              f"cast {t_int8 / (secs + t_cast):.2f}x the int8 route")


def bench_dequant_route(line, flops, type_name, raw, words, x32, y, want, t_gemm, t_cast,
                        t_int8, shape):
    """The dequant + f16 wgmma rows: the dequant pass (checked bit-equal to device.dequantize's
    f16 up to the sign of zero), the sum of the parts, and the route as one graph."""
    M, N, K = shape
    w16 = pk.empty((N * K,), np.float16)
    dequantize_f16_into(words, type_name, w16, N, K)
    ref16 = device.dequantize(raw, type_name, K, dtype=np.float16).numpy().reshape(-1)
    diff = int(np.count_nonzero((w16.numpy() + np.float16(0)).view(np.uint16)
                                != (ref16 + np.float16(0)).view(np.uint16)))
    t_deq = replay_seconds(lambda: dequantize_f16_into(words, type_name, w16, N, K))
    moved = raw.nbytes + 2 * N * K
    print(f"{line}  dequant_f16 pass {t_deq * 1e6:.0f} us ({moved / t_deq / 1e9:.0f} GB/s; "
          f"{diff} values differ from device.dequantize)")
    parts = t_deq + t_gemm + t_cast
    print(f"{line}  dequant + f16 wgmma: dequant {t_deq * 1e6:.0f} + GEMM {t_gemm * 1e6:.0f} + "
          f"cast {t_cast * 1e6:.0f} = {parts * 1e6:.0f} us ({t_int8 / parts:.2f}x the int8 "
          f"route's {t_int8 * 1e6:.0f} us)")
    xbuf = pk.empty((M * K // 2 + 8,), np.float32)       # the f16 activations' scratch

    def route():
        matmul_dequant_f16_into(words, type_name, x32, y, N, K, M, w16,
                                scratch=lambda shape: xbuf.view_as(shape, np.float32))
    y.fill(np.nan)
    route()
    err = rel(y.numpy(), want)
    t_route = replay_seconds(route)
    print(f"{line}  dequant route (one graph) {flops / t_route / 1e12:7.1f} TFLOPS "
          f"({t_route * 1e6:.0f} us, {t_int8 / t_route:.2f}x the int8 route; vs f16 wgmma "
          f"{err:.1e})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q8_0,Q4_K,Q6_K")     # Q4_K_M files: Q4_K and Q6_K
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated NxK")
    ap.add_argument("--configs", default="auto",
                    help="comma-separated QuantConfig strings: gemm_hopper's plus /rawR (raw "
                         "slab slots) and /m256 (256-row tiles); 'all': " + ALL_CONFIGS)
    args = ap.parse_args()
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    print(f"device: {pk.current_device()}")
    for type_name in args.types.split(","):
        for shape in args.shapes.split(","):
            N, K = (int(v) for v in shape.split("x"))
            configs = ALL_CONFIGS if args.configs == "all" else args.configs
            bench_shape(type_name, args.tokens, N, K, configs.split(","), rng)


if __name__ == "__main__":
    main()
