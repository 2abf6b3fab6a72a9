"""TFLOPS of stdlib_kernels.gemm_hopper (TMA producer + wgmma consumers, sm_90a) beside
torch.matmul in the same process, on the same bf16 inputs: C (M x N, f32 or bf16) = A (M x K)
. B^T. The issue's target (issue 43): 4096^3 bf16 at >= 80% of torch's TFLOPS.

pykernel's GEMM is timed as CUDA-graph replays (benchmarks/_timing.py: no Python launch cost);
torch's as a warm loop of torch.matmul(a, b.T) between CUDA events (one kernel per call, ~0.2
ms each at 4096^3, so launch cost is hidden by the queue). Every config is checked against
torch's result first (relative Frobenius error printed).

    python3 benchmarks/gemm_hopper.py [--shape 4096,4096,4096] [--configs 256x4,256x3,128x4]
                                      [--out f32|bf16]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk
from benchmarks._timing import replay_seconds
from stdlib_kernels import gemm_hopper as G
from stdlib_kernels.elementwise import bf16_bits_reference


def torch_seconds(torch, a, b, out_dtype, iters=20):
    for _ in range(3):
        c = torch.matmul(a, b.T).to(out_dtype)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        c = torch.matmul(a, b.T)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / iters, c.to(out_dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096,4096,4096", help="M,N,K")
    ap.add_argument("--configs", default="auto,256x4,256x3,128x4,128x6",
                    help="BNxSTAGES list; auto = choose_config")
    ap.add_argument("--out", default="f32", choices=["f32", "bf16"])
    args = ap.parse_args()
    import torch
    pk.set_device("cuda")
    M, N, K = (int(x) for x in args.shape.split(","))
    rng = np.random.default_rng(0)
    a16 = bf16_bits_reference(rng.standard_normal((M, K)).astype(np.float32))
    b16 = bf16_bits_reference(rng.standard_normal((N, K)).astype(np.float32))
    ta = torch.from_numpy(a16.view(np.int16)).view(torch.bfloat16).cuda()
    tb = torch.from_numpy(b16.view(np.int16)).view(torch.bfloat16).cuda()
    out_dtype, storage = (pk.f32, np.float32) if args.out == "f32" else (pk.bf16, np.uint16)
    t_torch, ref = torch_seconds(torch, ta, tb, torch.float32)
    ref = ref.cpu().numpy()
    flops = 2.0 * M * N * K
    print(f"{M}x{N}x{K} bf16 -> {args.out} on {pk.current_device()}")
    print(f"torch.matmul          {flops / t_torch / 1e12:7.1f} TFLOPS  ({t_torch * 1e3:.3f} ms)")
    a, b = pk.to_device(a16), pk.to_device(b16)
    out = pk.empty((M, N), storage)
    for name in args.configs.split(","):
        config = None if name == "auto" else tuple(int(x) for x in name.split("x"))
        G.gemm_hopper(a, b, out=out, out_dtype=out_dtype, config=config)
        pk.synchronize()
        got = out.numpy()
        if storage is np.uint16:
            got = (got.astype(np.uint32) << 16).view(np.float32)
        rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        secs = replay_seconds(lambda cfg=config: G.gemm_hopper(a, b, out=out,
                                                               out_dtype=out_dtype, config=cfg))
        shown = name if config else f"auto={G.choose_config(M, N)}"
        print(f"gemm_hopper {shown:<12s} {flops / secs / 1e12:7.1f} TFLOPS  "
              f"({secs * 1e3:.3f} ms, {100 * t_torch / secs:5.1f}% of torch, "
              f"rel. error {rel:.1e})")


if __name__ == "__main__":
    main()
