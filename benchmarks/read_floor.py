"""The floor for decode attention's bytes (issue 6): how long a well-written read-only pykernel
kernel takes to stream the same number of bytes from HBM in the same harness (CUDA events
around CUDA-graph replays, each launch reading its own buffer out of copies worth >= 256 MB, so
L2 cannot hold them), in a plain graph and in a PDL graph (a chain of such launches).

Kernel: one wave of blocks (blocks_per_sm x SMs), each thread UNROLL 16-byte loads in flight
per step of a grid-stride loop, a sum reduced per warp and written out (one f32 per warp).
Modes in the PDL graph: 0 = the compiler's defaults (wait at entry, trigger after the body);
1 = trigger at entry, then wait; 2 = trigger at entry, every load before the wait, the wait
only before the store (legal here: no kernel writes the buffers; it is the most a PDL chain
can overlap, the decode kernel cannot read its cache before its wait in general).
Also: an empty kernel of the same geometry (launch cost alone, plain / PDL chain).

--decode: the breakdown of decode attention at those shapes (32 q heads, 8 KV heads, D 128):
the split kernel alone, the combine kernel alone, and candidate variants (early trigger of the
split and combine kernels, K/V loads before the wait under launch_decode's early_kv promise;
configurations x one / two launches), at kv_len 4096 and 32768, f16 and f32 caches.

    python3 benchmarks/read_floor.py [--sizes 16777216,33554432] [--decode] [--lens 4096,32768]
        [--precompile] [--out FILE]        (--sizes "": no floor table)
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import multiprocessing
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from pykernel import Const, Ptr, f32, i32  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from benchmarks._report import print_report  # noqa: E402

# (threads per block, blocks per SM, 16-byte loads in flight per thread)
GEOMETRIES = [(256, 8, 4), (256, 8, 2), (512, 4, 4), (1024, 2, 4), (256, 4, 8), (128, 16, 2)]
SIZES = (16_777_216, 33_554_432)    # K + V bytes of decode at 4096 keys: f16, f32


@pk.kernel
def read_sum(x: Ptr[f32, "ro"], out: Ptr[f32], n_vec: i32, UNROLL: Const[int],
             MODE: Const[int], FETCH: Const[int]):
    if MODE >= 1:
        pk.launch_dependents()
    if MODE == 1:
        pk.grid_dependency_wait()
    stride = pk.grid_dim.x * pk.block_dim.x
    vals = pk.local_array(f32, UNROLL * 4)
    acc = f32(0.0)
    base = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    while base < n_vec:
        for u in pk.static_range(UNROLL):       # all loads first (clamped, never branched)
            v = min(base + u * stride, n_vec - 1)
            a, b, c, d = pk.load_vec(x, v * 4, 4, l2_fetch=FETCH)
            vals[u * 4] = a
            vals[u * 4 + 1] = b
            vals[u * 4 + 2] = c
            vals[u * 4 + 3] = d
        for u in pk.static_range(UNROLL):
            if base + u * stride < n_vec:
                acc += (vals[u * 4] + vals[u * 4 + 1]) + (vals[u * 4 + 2] + vals[u * 4 + 3])
        base += UNROLL * stride
    for r in pk.static_range(5):
        acc += pk.shfl_xor(acc, 16 >> r)
    if MODE == 2:
        pk.grid_dependency_wait()
    if pk.lane_id() == 0:
        out[(pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x) // 32] = acc


@pk.kernel
def empty_kernel(out: Ptr[f32]):
    if pk.thread_idx.x == 0 and pk.block_idx.x == 0:
        out[0] = 1.0


def multiprocessors() -> int:
    return int(pk.current_device().core.properties.multiprocessor_count)


def buffers(nbytes: int) -> list:
    """Copies of an nbytes buffer worth >= 256 MB together."""
    copies = max(2, -(-(256 << 20) // nbytes))
    return [pk.full((nbytes // 4,), 1.0, np.float32) for _ in range(copies)]


def read_us(bufs, geometry, mode: int, pdl: bool, fetch: int = 0) -> float:
    threads, per_sm, unroll = geometry
    grid = per_sm * multiprocessors()
    out = pk.empty((grid * threads // 32,), np.float32)
    n_vec = bufs[0].shape[0] // 4
    launches = max(len(bufs), 20)

    def record():
        for i in range(launches):
            read_sum[grid, threads](bufs[i % len(bufs)], out, n_vec, unroll, mode, fetch)
    return replay_seconds(record, 5, pdl) * 1e6 / launches


def empty_us(geometry, pdl: bool) -> float:
    threads, per_sm, _ = geometry
    out = pk.empty((1,), np.float32)
    grid = per_sm * multiprocessors()

    def record():
        for _ in range(20):
            empty_kernel[grid, threads](out)
    return replay_seconds(record, 5, pdl) * 1e6 / 20


def floor_table(sizes=SIZES, copy_bw: float | None = None) -> list[str]:
    """Markdown rows: per size and geometry, us per launch plain / PDL modes 0, 1, 2."""
    rows = ["| bytes | threads x blocks/SM x loads | plain us | PDL us (mode 0 / 1 / 2) | "
            "best TB/s | % of copy |", "|---" * 6 + "|"]
    for nbytes in sizes:
        bufs = buffers(nbytes)
        for geometry in GEOMETRIES:
            plain = read_us(bufs, geometry, 0, False)
            pdl = [read_us(bufs, geometry, mode, True) for mode in (0, 1, 2)]
            best = min([plain] + pdl)
            tbs = nbytes / best / 1e6
            pct = f"{100 * tbs * 1e12 / copy_bw:.0f}%" if copy_bw else ""
            rows.append(f"| {nbytes / 1e6:.1f} MB | {geometry[0]} x {geometry[1]} x "
                        f"{geometry[2]} | {plain:.2f} | {pdl[0]:.2f} / {pdl[1]:.2f} / "
                        f"{pdl[2]:.2f} | {tbs:.2f} | {pct} |")
            print(rows[-1], flush=True)
        del bufs
    for geometry in ((256, 8, 0), (256, 1, 0)):
        rows.append(f"| empty kernel | {geometry[0]} x {geometry[1]} | "
                    f"{empty_us(geometry, False):.2f} | {empty_us(geometry, True):.2f} | | |")
        print(rows[-1], flush=True)
    return rows


# (label, early_trigger, early_kv, plain graph?, PDL graph?); early_kv is the caller's promise
# (launch_decode's docstring), true in this chain: no kernel writes the caches or lengths
VARIANTS = [("base", False, False, True, True),
            ("trigger", True, False, False, True),
            ("early K/V", False, True, False, True),
            ("trigger + early K/V", True, True, False, True)]


def candidate_configs(dtype):
    """The split-kernel shapes compared (decode.mma_config / DecodeConfig)."""
    from stdlib_kernels.attention.decode_plan import DecodeConfig, gpu_config, mma_config
    if np.dtype(dtype) == np.float16:
        return [mma_config(4, 128, 8, 2, 1), mma_config(4, 128, 8, 1, 1),
                mma_config(4, 128, 8, 1, 2), mma_config(4, 128, 4, 1, 4),
                mma_config(4, 128, 4, 2, 2)]
    return [gpu_config(4, 128, np.float32), DecodeConfig(4, 8, 1, 32, 4, blocks_per_sm=2),
            DecodeConfig(4, 4, 2, 32, 3)]


def decode_breakdown(copy_bw: float, lens=(4096, 32768)) -> list[str]:
    """Markdown rows: split kernel alone, combine alone, then every candidate."""
    from benchmarks.attention import (N_HEAD, N_KV, _label, bench_combine, bench_decode,
                                      cache_bytes)
    from stdlib_kernels.attention.decode_plan import config_splits
    rows = ["| cache | kv_len | variant | plain us | PDL us | % of copy (best) |",
            "|---" * 6 + "|"]

    def add(dtype, kv_len, label, plain, pdl):
        best = min(x for x in (plain, pdl) if x is not None)
        pct = 100 * cache_bytes(kv_len, dtype) / best / 1e6 * 1e12 / copy_bw
        cells = ["" if x is None else f"{x:.2f}" for x in (plain, pdl)]
        rows.append(f"| {np.dtype(dtype).name} | {kv_len} | {label} | {cells[0]} | "
                    f"{cells[1]} | {pct:.0f}% |")
        print(rows[-1], flush=True)

    for dtype in (np.float16, np.float32):
        for kv_len in lens:
            default = candidate_configs(dtype)[0]
            splits = config_splits(default, N_HEAD, N_KV, kv_len)
            add(dtype, kv_len, f"split kernel alone, {_label(default, splits, False)}",
                bench_decode(kv_len, dtype, default, splits, split_only=True),
                bench_decode(kv_len, dtype, default, splits, pdl=True, split_only=True))
            rows.append(f"| | | combine kernel alone ({splits} splits) | "
                        f"{bench_combine(splits, False):.2f} | {bench_combine(splits, True):.2f}"
                        f" | |")
            print(rows[-1], flush=True)
            for config in candidate_configs(dtype):
                n = config_splits(config, N_HEAD, N_KV, kv_len)
                for fused in (False, True):
                    for name, trigger, early, plain, pdl in VARIANTS:
                        c = dataclasses.replace(config, early_trigger=trigger)
                        add(dtype, kv_len, f"{name}: {_label(config, n, fused)}",
                            bench_decode(kv_len, dtype, c, n, fused) if plain else None,
                            bench_decode(kv_len, dtype, c, n, fused, pdl=True, early_kv=early)
                            if pdl else None)
    return rows


def precompile(arch: str = "sm_90") -> None:
    """Every specialization the breakdown launches, in parallel (device time is scarce)."""
    from benchmarks.attention import HEAD_DIM, _compile_one
    from stdlib_kernels.attention.decode import combine_spec, decode_kernel, decode_spec
    jobs = [("combine_splits", arch, combine_spec(HEAD_DIM, w, t)) for w in (4, 8, 16)
            for t in (False, True)]
    for dtype in (np.float16, np.float32):
        for config in candidate_configs(dtype):
            for fused in (False, True):
                for _, trigger, early, _, _ in VARIANTS:
                    jobs.append((decode_kernel(config).name, arch,
                                 decode_spec(HEAD_DIM, dtype, config, fused, trigger, early)))
    start = time.perf_counter()
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max(1, (os.cpu_count() or 2) - 1),
                                                mp_context=spawn) as pool:
        list(pool.map(_compile_one, jobs))
    print(f"precompiled {len(jobs)} specializations in {time.perf_counter() - start:.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--decode", action="store_true", help="the decode breakdown too")
    parser.add_argument("--lens", default="4096,32768", help="decode breakdown: kv_len list")
    parser.add_argument("--precompile", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.precompile:
        precompile()
        return
    pk.set_device("cuda")
    from benchmarks.attention import copy_bandwidth
    copy_bw = copy_bandwidth()
    lines = [f"device: {pk.current_device().name}, torch copy bandwidth "
             f"{copy_bw / 1e12:.2f} TB/s (read + write)", ""]
    if args.sizes:
        lines += floor_table([int(s) for s in args.sizes.split(",")], copy_bw)
    if args.decode:
        lines += [""] + decode_breakdown(copy_bw, [int(n) for n in args.lens.split(",")])
    print_report(lines, args.out)


if __name__ == "__main__":
    main()
