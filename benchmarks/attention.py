"""Attention kernels on the GPU (issue 6): decode at 8B-class shapes (32 q heads, 8 KV heads,
head_dim 128) and causal prefill, timed with CUDA events around replays of a captured CUDA graph
(so Python launch cost is not measured).

Decode: kv_len 128, 1024, 4096, 32768, f16, f32 and Q8_0 caches. Each captured launch reads its own
copy of the cache, rotating over copies worth >= 256 MB so the 50-60 MB L2 cannot hold them:
the figure is HBM bandwidth. Bytes counted: K and V rows read (2 * n_kv * kv_len * row bytes;
a Q8_0 row is D quants + D / 16 bytes of scales);
the fraction is against the device-to-device copy bandwidth measured here with torch (reads +
writes), the issue's yardstick (~3.0 TB/s on the H100); a torch read-only reduction's bandwidth
is printed too. Reported per length: the default (default_config, config_splits, DEFAULT_FUSED: what
the runner launches) and the best of a sweep over SWEEP configurations (warps, keys per row
group U, register-ring stages P, max lanes per key row; `mma` = the tensor-core kernel) x split
counts filling 0.5..2 x the configuration's blocks per multiprocessor x {two launches (split
kernel + combine kernel), one launch (the last split block of each head group combines)};
every sweep point is printed.
Prefill: 512 and 4096 tokens at start 0, f16 cache, tensor-core path (and the SIMT path at 512);
FLOPs = 4 * D * n_head * (visible query-key pairs), reported against the device's bf16 matrix
rate measured here (torch.matmul of 8192 x 8192 bf16 matrices, f32 accumulation).

    python3 benchmarks/attention.py [--precompile] [--decode-only] [--ptxas DIR] [--out FILE]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import subprocess
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from benchmarks._report import print_report  # noqa: E402
from stdlib_kernels.attention.decode import (DEFAULT_FUSED, DecodeWorkspace,  # noqa: E402
                                             combine_spec, decode_spec, combine_warps,
                                             decode_kernel, KeyRange, launch_decode,
                                             launch_split_kernel)
from stdlib_kernels.attention.decode_plan import (DecodeConfig, config_splits,  # noqa: E402
                                                  default_config, gpu_config, mma_config,
                                                  multiprocessors)
from stdlib_kernels.attention.decode_combine import MAX_SPLITS, combine_splits  # noqa: E402
from stdlib_kernels.attention.decode_kernels import decode_partial  # noqa: E402
from stdlib_kernels.attention.decode_mma import decode_mma  # noqa: E402
from stdlib_kernels.attention.kv_q8 import Q8Cache, quantize_kv  # noqa: E402
from stdlib_kernels.attention.prefill import (MMA_STAGES, MMA_WARPS,  # noqa: E402
                                              default_block_keys, launch_prefill)
from stdlib_kernels.attention.prefill_flash import prefill_flash  # noqa: E402

N_HEAD, N_KV, HEAD_DIM = 32, 8, 128
# (heads per block, warps, keys per row group U, max lanes per row, ring stages P)
# mma_config(group, head_dim, warps, ring stages, blocks per SM): the tensor-core kernel
SWEEP = {"float16": [mma_config(4, 128, 8, 2, 1), mma_config(4, 128, 8, 1, 1),
                     mma_config(4, 128, 4, 1, 4), mma_config(4, 128, 4, 2, 2),
                     mma_config(4, 128, 16, 1, 1),
                     DecodeConfig(4, 4, 1, 32, 2), DecodeConfig(2, 4, 2, 32, 2)],
         "q8_0": [mma_config(4, 128, 8, 2, 1), mma_config(4, 128, 8, 1, 1),
                  mma_config(4, 128, 4, 1, 4)],
         "float32": [DecodeConfig(4, 4, 2, 32, 2), DecodeConfig(4, 8, 1, 32, 4),
                     DecodeConfig(4, 4, 1, 32, 2), DecodeConfig(2, 4, 1, 32, 2),
                     DecodeConfig(2, 4, 2, 32, 2)]}
SWEEP_OCCUPANCY = (0.5, 1, 1.5, 2)    # x the configuration's blocks_per_sm


def _compile_one(job):
    kernel_name, arch, spec = job
    kernel = {"decode_partial": decode_partial, "decode_mma": decode_mma,
              "combine_splits": combine_splits, "prefill_flash": prefill_flash}[kernel_name]
    kernel.compile(arch, **spec)
    return kernel_name


def _launch_specs(config: DecodeConfig, head_dim: int, dtype, fused: bool) -> list[dict]:
    """decode_spec of `config` as launched on the GPU: plain graphs, PDL graphs, PDL graphs
    with early_kv (flags as launch_split_kernel sets them for a one-wave grid)."""
    return [decode_spec(head_dim, dtype, config, fused)] + \
        [decode_spec(head_dim, dtype, config, fused, config.early_trigger, early)
         for early in (False, True)]


def precompile(arch: str, decode_only: bool = False) -> None:
    """Fill the disk cache in parallel with every specialization the GPU tests and this
    benchmark use (compiling one at a time costs minutes of device time)."""
    jobs = []
    for d in (64, 80, 96, 128, 256):
        for dtype in (np.float16, np.float32):
            for group in (1, 3, 4, 8):
                configs = [gpu_config(group, d, dtype)]
                if dtype == np.float16 and d % 32 == 0:
                    configs.append(mma_config(group, d))
                for config in configs:
                    for fused in (True, False):
                        jobs += [(decode_kernel(config).name, arch, spec)
                                 for spec in _launch_specs(config, d, dtype, fused)]
        for warps in (4, 8, 16):
            jobs += [("combine_splits", arch, combine_spec(d, warps, t)) for t in (False, True)]
        if not decode_only:
            jobs.append(("prefill_flash", arch, _prefill_spec(d, default_block_keys(d))))
    for dtype in (np.float16, np.float32, Q8):
        for config in SWEEP[_name(dtype)]:
            for fused in (True, False):
                jobs.append((decode_kernel(config).name, arch,
                             decode_spec(HEAD_DIM, dtype, config, fused)))
    if not decode_only:
        jobs += [("prefill_flash", arch, _prefill_spec(HEAD_DIM, bn, w, st, mt))
                 for _, bn, w, st, mt in PREFILL_PATHS]
    start = time.perf_counter()
    workers = max(1, (os.cpu_count() or 2) - 1)
    spawn = multiprocessing.get_context("spawn")        # children never inherit a CUDA context
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn) as pool:
        list(pool.map(_compile_one, jobs))
    print(f"precompiled {len(jobs)} specializations in {time.perf_counter() - start:.1f} s")


def ptxas_report(arch: str, folder: str) -> None:
    """Registers and spills of the benchmarked kernels (ptxas -v), for tuning."""
    os.makedirs(folder, exist_ok=True)
    kernels = {f"decode_{_name(t)}_{'mma_' if c.mma else ''}{c.heads_per_block}h"
               f"{c.warps}w_U{c.unroll}_P{c.stages}":
               (decode_kernel(c), decode_spec(HEAD_DIM, t, c)) for t in (np.float16, np.float32, Q8)
               for c in SWEEP[_name(t)]}
    kernels.update({f"prefill_bn{bn}_{w}w_s{st}_mt{mt}": (prefill_flash,
                                                           _prefill_spec(HEAD_DIM, bn, w, st, mt))
                    for _, bn, w, st, mt in PREFILL_PATHS})
    for name, (kernel, spec) in kernels.items():
        path = os.path.join(folder, name + ".ptx")
        with open(path, "w") as f:
            f.write(kernel.compile(arch, **spec).ptx)
        result = subprocess.run(["ptxas", f"-arch={arch}", "-v", path, "-o", "/dev/null"],
                                capture_output=True, text=True)
        print(name, (result.stdout + result.stderr).strip().replace("\n", " | "))


def copy_bandwidth() -> float:
    import torch
    x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 20 / (time.perf_counter() - start)


def read_bandwidth() -> float:
    import torch
    x = torch.ones(1 << 28, dtype=torch.float32, device="cuda")
    for _ in range(3):
        x.sum()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        x.sum()
    torch.cuda.synchronize()
    return 4 * x.numel() * 20 / (time.perf_counter() - start)


def same_size_read_us(nbytes: int) -> float:
    """The floor for a kernel that only reads `nbytes`: torch's sum over a buffer of that size,
    captured in a CUDA graph (rotating over copies worth >= 256 MB), us per sum. At a few MB the
    launch, the first loads' latency and the tail are a large part of any kernel's time."""
    import torch
    n = nbytes // 4
    copies = max(2, -(-(256 << 20) // nbytes))
    xs = [torch.ones(n, dtype=torch.float32, device="cuda") for _ in range(copies)]
    out = torch.empty((), dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for x in xs:
            torch.sum(x, dim=0, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for x in xs:
            torch.sum(x, dim=0, out=out)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (3 * copies)


def time_graph(capture_fn, launches: int, replays: int = 5, pdl: bool = False) -> float:
    """Microseconds per launch: capture `launches` launches once, replay, time with events."""
    return replay_seconds(lambda: capture_fn(None), replays, pdl) * 1e6 / launches


_CACHES = {}


def decode_caches(kv_len: int, dtype) -> list:
    """Copies of a random (K, V) cache worth >= 256 MB together (so L2 cannot hold them)."""
    key = (kv_len, _name(dtype))
    if key not in _CACHES:
        _CACHES.clear()
        rng = np.random.default_rng(0)
        shape = (N_KV, kv_len, HEAD_DIM)
        if dtype == Q8:
            first = tuple(quantize_kv(rng.standard_normal(shape, np.float32)) for _ in range(2))
        else:
            first = tuple(pk.to_device(rng.standard_normal(shape, np.float32).astype(dtype))
                          for _ in range(2))
        copies = max(2, -(-(256 << 20) // cache_bytes(kv_len, dtype)))
        caches = [first] + [tuple(_copy(c) for c in first) for _ in range(copies - 1)]
        _CACHES[key] = caches
    return _CACHES[key]


def _copy(cache):
    if isinstance(cache, Q8Cache):
        return Q8Cache(_copy(cache.quants), _copy(cache.scales))
    return pk.empty(cache.shape, cache.dtype).copy_from(cache)


def bench_decode(kv_len: int, dtype, config: DecodeConfig, splits: int,
                 fused: bool = False, pdl: bool = False, split_only: bool = False,
                 early_kv: bool = False) -> float:
    """fused=True: the one-launch variant (the last split block combines); pdl=True: the
    graph launches with programmatic dependent launch, as the runner's decode graph does;
    split_only: the split kernel without the combine kernel (breakdown); early_kv: the
    launch_decode promise (true here: nothing in the chain writes caches or lengths)."""
    caches = decode_caches(kv_len, dtype)
    rng = np.random.default_rng(1)
    q = pk.to_device(rng.standard_normal((1, N_HEAD, HEAD_DIM)).astype(np.float32))
    lens = pk.to_device(np.array([kv_len], np.int32))
    out = pk.empty((1, N_HEAD, HEAD_DIM), np.float32)
    ws = None
    if splits > 1:
        ws = DecodeWorkspace.allocate(1, N_HEAD, HEAD_DIM, splits, fused=fused)
    launches = max(len(caches), 20)
    launch = launch_split_kernel if split_only else launch_decode
    launch(q, *caches[0], KeyRange(lens), out, HEAD_DIM ** -0.5, workspace=ws, config=config)

    def capture(stream):
        for i in range(launches):
            k, v = caches[i % len(caches)]
            launch(q, k, v, KeyRange(lens), out, HEAD_DIM ** -0.5, workspace=ws, config=config,
                   stream=stream, early_kv=early_kv)
    return time_graph(capture, launches, pdl=pdl)


def bench_combine(splits: int, pdl: bool) -> float:
    """The combine kernel alone (partials of `splits` splits, L2-resident), us per launch."""
    part_o = pk.zeros((1, N_HEAD, splits, HEAD_DIM), np.float32)
    part_ml = pk.zeros((1, N_HEAD, splits, 2), np.float32)
    out = pk.empty((1, N_HEAD, HEAD_DIM), np.float32)
    warps = combine_warps(splits)

    def capture(stream):
        for _ in range(20):
            combine_splits[(N_HEAD,), 32 * warps, stream](part_o, part_ml, out,
                                                          out.view(np.uint32), splits,
                                                          sinks=out.reshape(-1), n_head=N_HEAD,
                                                          **combine_spec(HEAD_DIM, warps))
    return time_graph(capture, 20, pdl=pdl)


Q8 = "q8_0"


def _name(dtype) -> str:
    return dtype if dtype == Q8 else np.dtype(dtype).name


def cache_bytes(kv_len: int, dtype) -> int:
    """K + V bytes a decode reads: rows of D elements (Q8_0: D int8 + D / 32 f16 scales)."""
    row = HEAD_DIM + HEAD_DIM // 16 if dtype == Q8 else HEAD_DIM * np.dtype(dtype).itemsize
    return 2 * N_KV * kv_len * row


def _row(dtype, kv_len, label, us, copy_bw) -> str:
    nbytes = cache_bytes(kv_len, dtype)
    bw = nbytes / us / 1e6
    return (f"| {_name(dtype)} | {kv_len} | {label} | {us:.2f} | {bw:.2f} | "
            f"{100 * bw / copy_bw * 1e12:.0f}% |")


def sweep_splits(config: DecodeConfig, blocks: int, sms: int) -> list[int]:
    """Split counts whose blocks fill SWEEP_OCCUPANCY x the configuration's blocks per SM."""
    per_sm = {max(1, round(config.blocks_per_sm * f)) for f in SWEEP_OCCUPANCY}
    return sorted({min(MAX_SPLITS, max(1, n * sms // blocks)) for n in per_sm})


def _label(config: DecodeConfig, splits: int, fused: bool) -> str:
    launches = "one launch" if fused else "two launches"
    if config.mma:
        return (f"{launches} (mma, {config.heads_per_block}h, {config.warps}w, "
                f"P{config.stages}, {splits} splits)")
    return (f"{launches} ({config.heads_per_block}h, {config.warps}w, U{config.unroll}, "
            f"P{config.stages}, {config.lanes}L, {splits} splits)")


def _flags(config: DecodeConfig) -> str:
    return " [early trigger]" if config.early_trigger else ""


def decode_table(copy_bw: float, sweep: bool = True) -> list[str]:
    """Per (cache, kv_len): the default (default_config + config_splits, as the runner launches it,
    in a plain graph and in a PDL graph), the previous default when it differs,
    and the best point of SWEEP x split counts x {one, two launches} (labels: heads per block,
    warps, keys per row group U, ring stages P, max lanes per row, splits)."""
    rows = ["| cache | kv_len | variant | us | TB/s | % of copy |", "|---" * 6 + "|"]
    sms = multiprocessors()
    for dtype in (np.float16, np.float32, Q8):
        default = default_config(N_HEAD // N_KV, HEAD_DIM, dtype=dtype)
        for kv_len in (128, 1024, 4096, 32768):
            nbytes = cache_bytes(kv_len, dtype)
            rows.append(_row(dtype, kv_len, "reference: torch sum of the same bytes (graph)",
                             same_size_read_us(nbytes), copy_bw))
            print(rows[-1], flush=True)
            splits = config_splits(default, N_HEAD, N_KV, kv_len)
            fused = DEFAULT_FUSED
            for name, pdl, early in (("default", False, False), ("default, PDL graph", True, False),
                                     ("default, PDL graph, early_kv", True, True)):
                us = bench_decode(kv_len, dtype, default, splits, fused, pdl, early_kv=early)
                label = f"{name} {_label(default, splits, fused)}{_flags(default)}"
                rows.append(_row(dtype, kv_len, label, us, copy_bw))
                print(rows[-1], flush=True)
            if not sweep:
                continue
            best = None
            for config in SWEEP[_name(dtype)]:
                config_blocks = N_KV * (N_HEAD // N_KV // config.heads_per_block)
                for n in sweep_splits(config, config_blocks, sms):
                    for fused in (False, True):
                        if n == 1 and fused:
                            continue
                        us = bench_decode(kv_len, dtype, config, n, fused)
                        label = _label(config, n, fused)
                        print(f"  sweep {_name(dtype)} {kv_len} {label}: {us:.2f} us",
                              flush=True)
                        best = min(best or (us, label), (us, label))
            rows.append(_row(dtype, kv_len, "best " + best[1], best[0], copy_bw))
            print(rows[-1], flush=True)
    return rows


def bench_prefill(tokens: int, path: str, block_keys=None, warps: int = MMA_WARPS,
                  start: int = 0, stages: int = MMA_STAGES, m_tiles: int = 1) -> float:
    """us per causal prefill of `tokens` queries at positions start .. (the cache holds start
    earlier positions)."""
    rng = np.random.default_rng(0)
    kv = start + tokens
    q = pk.to_device(rng.standard_normal((tokens, N_HEAD, HEAD_DIM)).astype(np.float32))
    k = pk.to_device(rng.standard_normal((N_KV, kv, HEAD_DIM)).astype(np.float16))
    v = pk.to_device(rng.standard_normal((N_KV, kv, HEAD_DIM)).astype(np.float16))
    out = pk.empty((tokens, N_HEAD, HEAD_DIM), np.float32)
    launches = 10
    kw = dict(path=path, block_keys=block_keys, warps=warps, stages=stages, m_tiles=m_tiles)

    def capture(stream):
        for _ in range(launches):
            launch_prefill(q, k, v, out, start, HEAD_DIM ** -0.5, stream=stream, **kw)
    launch_prefill(q, k, v, out, start, HEAD_DIM ** -0.5, **kw)   # allocations outside
    return time_graph(capture, launches, replays=3)


def matrix_tflops() -> float:
    """Dense bf16 matmul rate of this device (torch/cuBLAS, 8192^3, best of 3 timings of 10)."""
    import torch
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            a @ b
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3 / 10)
    return 2 * 8192 ** 3 / best / 1e12


PREFILL_SHAPES = ((512, 0), (4096, 0), (512, 4096))     # (tokens, start)
PREFILL_PATHS = (("mma", 64, 4, 3, 1), ("mma", 32, 4, 3, 1), ("mma", 64, 4, 2, 1),
                 ("mma", 64, 4, 4, 1), ("mma", 64, 8, 3, 1), ("mma", 32, 8, 3, 1),
                 ("mma", 16, 4, 3, 2))   # (path, tile keys, warps, stages, m-tiles per warp)


def _prefill_spec(head_dim, bn, warps=MMA_WARPS, stages=MMA_STAGES, m_tiles=1) -> dict:
    return dict(D=head_dim, BN=bn, NWARPS=warps, STAGES=stages, MT=m_tiles, VARLEN=False,
                SINK=False)


def prefill_table() -> list[str]:
    peak = matrix_tflops()
    rows = [f"measured bf16 matrix rate: {peak:.0f} TFLOP/s", "",
            f"| tokens | start | path | ms | TFLOP/s | % of {peak:.0f} |",
            "|---|---|---|---|---|---|"]
    configs = [(t, s, *p) for t, s in PREFILL_SHAPES for p in PREFILL_PATHS]
    configs.append((512, 0, "simt", None, MMA_WARPS, MMA_STAGES, 1))
    for tokens, start, path, bn, warps, stages, mt in configs:
        label = f"{path}{f' BN={bn} {warps}w S{stages} MT{mt}' if bn else ''}"
        try:
            us = bench_prefill(tokens, path, bn, warps, start, stages, mt)
        except Exception as exc:  # report and go on: one failure must not lose the table
            rows.append(f"| {tokens} | {start} | {label} | failed: {exc} | | |")
            continue
        flops = 4 * HEAD_DIM * N_HEAD * tokens * (start + (tokens + 1) / 2)
        tflops = flops / us / 1e6
        rows.append(f"| {tokens} | {start} | {label} | {us / 1e3:.3f} | {tflops:.1f} | "
                    f"{100 * tflops / peak:.1f}% |")
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precompile", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--arch", default="sm_90", help="for --precompile / --ptxas")
    parser.add_argument("--ptxas", metavar="FOLDER", help="write PTX there, print ptxas -v")
    parser.add_argument("--decode-only", action="store_true", help="skip the prefill table")
    parser.add_argument("--no-sweep", action="store_true", help="decode: defaults only")
    parser.add_argument("--prefill-only", action="store_true", help="skip the decode table")
    args = parser.parse_args()
    if args.precompile or args.ptxas:
        if args.precompile:
            precompile(args.arch, args.decode_only)
        if args.ptxas:
            ptxas_report(args.arch, args.ptxas)
        return
    pk.set_device("cuda")
    device = pk.current_device()
    copy_bw = copy_bandwidth()
    lines = [f"device: {device.name} ({device.arch}), torch copy bandwidth "
             f"{copy_bw / 1e12:.2f} TB/s (read + write), read-only (sum) "
             f"{read_bandwidth() / 1e12:.2f} TB/s", ""]
    if not args.prefill_only:
        lines += decode_table(copy_bw, not args.no_sweep)
    if not args.decode_only:
        lines += [""] + prefill_table()
    print_report(lines, args.out)


if __name__ == "__main__":
    main()
