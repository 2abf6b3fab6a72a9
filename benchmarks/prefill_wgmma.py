"""Prefill attention on wgmma (stdlib_kernels.attention.prefill_wgmma, FlashAttention-3's
structure) against today's tensor-core prefill (prefill_flash on mma.sync, the runner's default)
at llama-8B's shapes: 32 query heads, 8 KV heads, head_dim 128, f16 cache, 512 queries after
0, 4096 and 16384 cached positions. Timed with CUDA events around replays of a captured graph of
10 launches (benchmarks/_timing.py: no Python launch cost). FLOPs = 4 * D * n_head * (visible
query-key pairs), as benchmarks/attention.py counts them. Before timing, each wgmma tiling's
output is checked against the mma path's (max |difference| printed: both round Q, K, V, P to
f16, so ~1e-3 of max |V| is expected; a wrong kernel shows as O(1)).

    python3 benchmarks/prefill_wgmma.py [--tokens 512] [--depths 0,4096,16384]
                                        [--tilings 128x2,64x3,64x4] [--peak] [--out FILE]

--tilings: the wgmma kernel's block_keys x stages to time (the first is its default);
--peak: also measure torch's bf16 matmul rate (benchmarks/attention.py matrix_tflops) and
print each rate as a share of it.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from benchmarks._report import print_report  # noqa: E402
from stdlib_kernels.attention.prefill import launch_prefill  # noqa: E402
from stdlib_kernels.attention.prefill_wgmma import default_tiling  # noqa: E402

N_HEAD, N_KV, HEAD_DIM = 32, 8, 128
LAUNCHES = 10


def problem(tokens: int, start: int, seed: int = 0):
    """q (tokens, 32, 128) f32, K / V caches (8, start + tokens, 128) f16, out."""
    rng = np.random.default_rng(seed)
    kv = start + tokens
    q = pk.to_device(rng.standard_normal((tokens, N_HEAD, HEAD_DIM)).astype(np.float32))
    k = pk.to_device(rng.standard_normal((N_KV, kv, HEAD_DIM)).astype(np.float16))
    v = pk.to_device(rng.standard_normal((N_KV, kv, HEAD_DIM)).astype(np.float16))
    return q, k, v, pk.empty((tokens, N_HEAD, HEAD_DIM), np.float32)


def ms_per_launch(q, k, v, out, start: int, **kw) -> float:
    def record():
        for _ in range(LAUNCHES):
            launch_prefill(q, k, v, out, start, HEAD_DIM ** -0.5, **kw)
    return replay_seconds(record, replays=3) * 1e3 / LAUNCHES


def wgmma_difference(q, k, v, start: int, wgmma_kw: dict) -> float:
    """max |wgmma - mma| over the outputs of one launch each."""
    outs = []
    for path_kw in (dict(path="mma"), wgmma_kw):
        out = pk.full(tuple(q.shape), np.nan, np.float32)
        launch_prefill(q, k, v, out, start, HEAD_DIM ** -0.5, **path_kw)
        outs.append(out.numpy())
    return float(np.abs(outs[0] - outs[1]).max())


def table(tokens: int, depths, tilings, peak: float | None) -> list[str]:
    share = f" % of {peak:.0f} |" if peak else ""
    rows = [f"| tokens | depth | kernel | ms | TFLOP/s |{share} max abs diff vs mma |",
            "|---|---|---|---|---|" + ("---|" if peak else "") + "---|"]
    for start in depths:
        q, k, v, out = problem(tokens, start)
        flops = 4 * HEAD_DIM * N_HEAD * tokens * (start + (tokens + 1) / 2)
        runs = [("mma (today)", dict(path="mma"))]
        runs += [(f"wgmma BN={bn} S{stages}", dict(path="wgmma", block_keys=bn, stages=stages))
                 for bn, stages in tilings]
        for label, kw in runs:
            try:
                diff = "" if kw["path"] == "mma" else f"{wgmma_difference(q, k, v, start, kw):.2e}"
                ms = ms_per_launch(q, k, v, out, start, **kw)
            except Exception as exc:  # report and go on: one failure must not lose the table
                rows.append(f"| {tokens} | {start} | {label} | failed: {exc} | |")
                print(rows[-1], flush=True)
                continue
            tflops = flops / ms / 1e9
            pct = f" {100 * tflops / peak:.1f}% |" if peak else ""
            rows.append(f"| {tokens} | {start} | {label} | {ms:.3f} | {tflops:.1f} |{pct} "
                        f"{diff} |")
            print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--depths", default="0,4096,16384")
    parser.add_argument("--tilings", default=None,
                        help="block_keys x stages, comma-separated (default: the kernel's "
                        "default, 64x3, 64x4)")
    parser.add_argument("--peak", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    pk.set_device("cuda")
    device = pk.current_device()
    default = default_tiling(HEAD_DIM)
    tilings = [tuple(int(x) for x in t.split("x")) for t in args.tilings.split(",")] \
        if args.tilings else [default, (64, 3), (64, 4)]
    peak = None
    if args.peak:
        from benchmarks.attention import matrix_tflops
        peak = matrix_tflops()
    lines = [f"device: {device.name} ({device.arch}); {N_HEAD} q heads, {N_KV} KV heads, "
             f"head_dim {HEAD_DIM}, f16 cache", ""]
    lines += table(args.tokens, [int(d) for d in args.depths.split(",")], tilings, peak)
    print_report(lines, args.out)


if __name__ == "__main__":
    main()
