"""Quantized matmul on the GPU: decode GEMV (m=4096, k=14336 and larger) and prefill GEMM (n=512).

Input: none (needs a CUDA GPU). Output: a markdown table per part on stdout, and the raw numbers
as JSON at $OUT/quant_matmul.json when $OUT is set.

Timing: launches are captured into a CUDA graph (so host launch cost is not measured) and the
replays are timed with CUDA events. Weight buffers are rotated so the bytes read per pass exceed
the 50 MB L2 several times: every GEMV streams its weights from HBM. Weights are random bytes in
the right layout (speed does not depend on the values). Copy bandwidth = 2 x bytes / time of a
16-byte-vector copy kernel over 1 GiB.

    python3 benchmarks/quant_matmul.py [--budget SECONDS]   (GEMV sweep; stops early to fit)
    python3 benchmarks/quant_matmul.py --defaults           (GEMV: shipped defaults + before)
    python3 benchmarks/quant_matmul.py --gemm-only          (prefill GEMM: int8 vs f16 only)
    python3 benchmarks/quant_matmul.py --q1-0-bmma          (Q1_0: binary tensor cores vs DP4A;
                                                             benchmarks/q1_0_bmma.py [--tries])
    python3 benchmarks/quant_matmul.py --issue              (issue 5's GEMV targets: rotated
                                                             and one-buffer, plain and PDL)
    python3 benchmarks/quant_matmul.py --focus Q3_K,Q1_0    (GEMV: those types' FOCUS_TRIES and
                                                             shipped defaults, all 3 shapes)
    ... --with-gemm                                         (GEMV, then the GEMM comparison)

GEMV tables: every format at m=4096 k=14336 (the issue's shape, against llama.cpp's times) and
at shapes whose weights exceed the L2 (m=128256 or 57344, k=4096), as % of copy bandwidth.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from pykernel import Ptr, f32, i32  # noqa: E402
from stdlib_kernels.quant.formats import get_format  # noqa: E402
from stdlib_kernels.quant.gemm import gemm_into  # noqa: E402
from stdlib_kernels.quant.gemm_q8 import Q8GemmTiles, gemm_q8_into  # noqa: E402
from stdlib_kernels.quant.gemv import GemvConfig as G  # noqa: E402
from stdlib_kernels.quant.gemv import gemv_q8_into, sm_count  # noqa: E402

gemv_module = sys.modules["stdlib_kernels.quant.gemv"]   # (the package exports a function gemv)
from stdlib_kernels.quant.gemv import weight_words  # noqa: E402
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into  # noqa: E402
from stdlib_kernels.quant.rmsnorm_q8_1 import rmsnorm_q8_1_into  # noqa: E402
from stdlib_kernels.norm import rmsnorm  # noqa: E402

M, K, TOKENS = 4096, 14336, 512
LLAMA_CPP_H200_US = {"Q4_0": 14.5, "Q4_1": 11.7, "Q8_0": 22.9, "Q4_K": 15.7, "Q6_K": 24.1,
                     "Q1_0": 10.5}
L2_BYTES = 50 << 20


@pk.kernel
def copy_kernel(src: Ptr[f32, "ro"], dst: Ptr[f32], n4: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    stride = pk.grid_dim.x * pk.block_dim.x
    while i < n4:
        a, b, c, d = pk.load_vec(src, 4 * i, 4)
        pk.store_vec(dst, 4 * i, (a, b, c, d))
        i += stride


def round_cells(runs, copy: float) -> tuple[str, float]:
    """("us, us, ..." of the rounds, % of copy bandwidth of the best) from rounds of
    (seconds, bytes) timings (bench_gemv's) of one configuration."""
    best = min(seconds for seconds, _ in runs)
    return (", ".join(f"{seconds * 1e6:.2f}" for seconds, _ in runs),
            100 * runs[0][1] / best / copy)


def time_graph(launch_all, replays: int = 5) -> float:
    """Seconds per replay of a graph holding the launches made by launch_all(None)."""
    return replay_seconds(lambda: launch_all(None), replays)


def copy_bandwidth() -> float:
    n = 1 << 28  # 1 GiB of f32
    src, dst = pk.zeros(n, np.float32), pk.zeros(n, np.float32)

    def run(stream):
        for _ in range(5):
            copy_kernel[132 * 16, 256, stream](src, dst, n // 4)
    return 2 * src.nbytes * 5 / time_graph(run)


_WEIGHTS = {}


def default_for(type_name: str, k: int):
    """The shipped batch-1 default on the GPU for rows of k values."""
    table = gemv_module.TUNED_SHORT if k <= gemv_module.SHORT_ROW else gemv_module.TUNED_CONFIGS
    return table.get(type_name, gemv_module.DEFAULT_CONFIG)


def random_weights(type_name: str, rows: int, k: int, count: int, rng):
    """count device weight buffers (cached per type and shape); random bytes, finite values
    for F16."""
    fmt = get_format(type_name)
    per_row = k // fmt.block_elems * fmt.block_bytes
    out = _WEIGHTS.setdefault((type_name, rows, k), [])
    while len(out) < count:
        raw = np.frombuffer(rng.bytes(rows * per_row), np.uint8).reshape(rows, per_row)
        if type_name in ("F16", "BF16"):   # finite values: no NaN/inf slow paths
            raw = (raw & 0x3B).astype(np.uint8)
        out.append(weight_words(pk.to_device(raw), type_name, k)[0])
    return out[:count], rows * per_row


def bench_gemv(type_name: str, config, rng, batch: int = 1, with_quantize=False,
               shape=(M, K), rotate=True, pdl=False, prefetch=True):
    """Seconds per Q8_1 GEMV of an m x k matrix (plus the Q8_1 quantization of x when
    with_quantize, as llama.cpp's figures include it) and the weight bytes it streams.
    rotate=False reads one weight buffer every time (what llama.cpp's `test-backend-ops perf`
    does: a matrix smaller than the L2 is then partly served from it); pdl: the graph is
    captured with programmatic dependent launch (as the runner's decode graph is); prefetch=False
    drops the GEMV's L2 prefetch under PDL (gemv_kernels.prefetch_then_wait)."""
    m, k = shape
    fmt = get_format(type_name)
    nbytes = m * (k // fmt.block_elems * fmt.block_bytes)
    count = -(-4 * L2_BYTES // nbytes) if rotate else 1
    weights, _ = random_weights(type_name, m, k, count, rng)
    x = pk.to_device(rng.standard_normal((batch, k)).astype(np.float32))
    xq = pk.empty((batch, q8_1_bytes(k)), np.uint8)
    quantize_q8_1_into(x, xq)
    y = pk.empty((batch, m), np.float32)
    reps = max(4, 8 * len(weights))

    def run(stream):
        for r in range(reps):
            if with_quantize:
                quantize_q8_1_into(x, xq, stream=stream)
            gemv_q8_into(weights[r % len(weights)], type_name, xq, y, m, k, batch,
                         stream=stream, config=config)
    saved = gemv_module._under_pdl
    if not prefetch:
        gemv_module._under_pdl = lambda: False
    try:
        seconds = replay_seconds(lambda: run(None), 5, pdl=pdl) / reps
    finally:
        gemv_module._under_pdl = saved
    return seconds, nbytes


def bench_quantize(rng) -> float:
    x = pk.to_device(rng.standard_normal((1, K)).astype(np.float32))
    xq = pk.empty((1, q8_1_bytes(K)), np.uint8)

    def run(stream):
        for _ in range(50):
            quantize_q8_1_into(x, xq, stream=stream)
    return time_graph(run) / 50


def bench_gemm(type_name: str, rng, warps=None):
    weights, _ = random_weights(type_name, M, K, 1, rng)
    x = pk.to_device(rng.standard_normal((TOKENS, K)).astype(np.float32))
    y = pk.empty((TOKENS, M), np.float32)

    def run(stream):
        for _ in range(3):
            gemm_into(weights[0], type_name, x, y, M, K, TOKENS, stream=stream, warps=warps)
    seconds = time_graph(run, replays=3) / 3
    return seconds, 2.0 * M * K * TOKENS / seconds / 1e12


def bench_gemm_q8(type_name: str, rng, tiles, with_quantize=False):
    """Seconds per int8 GEMM (plus the Q8_1 quantization of the 512 x K activations when
    with_quantize: the whole prefill matmul) and its TFLOPS."""
    weights, _ = random_weights(type_name, M, K, 1, rng)
    x = pk.to_device(rng.standard_normal((TOKENS, K)).astype(np.float32))
    xq = pk.empty((TOKENS, q8_1_bytes(K)), np.uint8)
    quantize_q8_1_into(x, xq)
    y = pk.empty((TOKENS, M), np.float32)

    def run(stream):
        for _ in range(3):
            if with_quantize:
                quantize_q8_1_into(x, xq, stream=stream)
            gemm_q8_into(weights[0], type_name, xq, y, M, K, TOKENS, stream=stream, tiles=tiles)
    seconds = time_graph(run, replays=3) / 3
    return seconds, 2.0 * M * K * TOKENS / seconds / 1e12


Q8_TILES = (Q8GemmTiles(2, 4, 4, 2, 4), Q8GemmTiles(4, 4, 2, 4, 4), Q8GemmTiles(2, 4, 2, 4, 4))


def compare_gemm(rng, results):
    """int8 (several tiles) against f16 tensor-core GEMM per type, m=4096 n=512 k=14336."""
    print("\n| type | path | tiles | us | TFLOPS | + Q8_1 quantize us |  (llama.cpp q4_K: 348 us)")
    print("|---|---|---|---|---|---|")
    for type_name in ("Q4_K", "Q4_0", "Q8_0", "Q6_K"):
        sec, tflops = bench_gemm(type_name, rng, (2, 4))
        results["gemm"].append(dict(type=type_name, path="f16", us=sec * 1e6, TFLOPS=tflops))
        print(f"| {type_name} | f16 | (2, 4) | {sec * 1e6:.0f} | {tflops:.1f} | |", flush=True)
        for tiles in Q8_TILES:
            try:
                sec, tflops = bench_gemm_q8(type_name, rng, tiles)
                both, _ = bench_gemm_q8(type_name, rng, tiles, with_quantize=True)
            except Exception as e:   # e.g. a tile shape over the shared-memory limit
                print(f"| {type_name} | int8 | {tuple(tiles)} | failed: {e} |", flush=True)
                continue
            results["gemm"].append(dict(type=type_name, path="int8", tiles=tiles,
                                        us=sec * 1e6, TFLOPS=tflops, with_quantize_us=both * 1e6))
            print(f"| {type_name} | int8 | {tuple(tiles)} | {sec * 1e6:.0f} | {tflops:.1f} | "
                  f"{both * 1e6:.0f} |", flush=True)
        save(results)


def bench_rmsnorm_q8_1(rng, n: int = 4096):
    """Fused RMSNorm + Q8_1 quantize vs the two launches it replaces, one decode row."""
    x = pk.to_device(rng.standard_normal((1, n)).astype(np.float32))
    wt = pk.to_device(rng.standard_normal(n).astype(np.float32))
    normed = pk.empty((1, n), np.float32)
    xq = pk.empty((1, q8_1_bytes(n)), np.uint8)

    def fused(stream):
        for _ in range(50):
            rmsnorm_q8_1_into(x, wt, 1e-5, xq, stream=stream)

    def separate(stream):
        for _ in range(50):
            rmsnorm(x, wt, 1e-5, out=normed, stream=stream)
            quantize_q8_1_into(normed, xq, stream=stream)
    return time_graph(fused) / 50, time_graph(separate) / 50


# TUNED_CONFIGS before this round (x read from L1, one block per row group, Q6_K as u16 words)
BEFORE = {"Q4_0": G(4, 1, 2, 1, 1), "Q4_1": G(8, 8, 2, 1, 1), "Q8_0": G(4, 4, 2, 2, 1),
          "Q4_K": G(8, 2, 2, 1, 2), "Q6_K": G(8, 8, 2, 1, 1), "Q1_0": G(4, 4, 2, 1, 1),
          "Q2_K": G(4, 1, 2, 1, 1), "Q5_K": G(4, 2, 2, 1, 2), "Q5_0": G(4, 2, 2, 1, 1),
          "Q5_1": G(4, 2, 2, 1, 1), "Q3_K": G(4, 2, 2, 1, 1)}
TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q1_0", "Q5_0", "Q5_1", "Q5_K", "Q2_K", "Q3_K")
LONG, MID, BIG = (M, K), (57344, 4096), (128256, 4096)   # MID: 4 x ffn rows; BIG: llama-8B output
# kernel variants (gemv.VARIANTS) and the launch shapes tried with them at k = 14336: Q6_K
# "words" (u32 loads); Q2_K "wide" (128-value items, 16-byte activation loads); Q4_K "wide" (a
# 64-value chunk per item, 8-byte loads); Q4_0/Q8_0 "vec" (8-byte activation loads)
WIDE_TRIES = (G(4, 1, 1, 1, 1), G(4, 1, 2, 1, 1), G(4, 2, 2, 1, 1), G(4, 1, 4, 1, 1),
              G(8, 2, 2, 1, 1), G(4, 2, 1, 1, 1), G(4, 1, 2, 2, 1), G(4, 4, 1, 1, 1),
              G(8, 1, 2, 1, 1), G(4, 2, 4, 1, 1))
TRIES = {("Q6_K", "words"): (G(8, 8, 2, 1, 1), G(4, 4, 2, 1, 1), G(4, 2, 2, 1, 1),
                             G(4, 4, 1, 1, 1), G(4, 2, 4, 1, 1)),
         ("Q2_K", "wide"): WIDE_TRIES,
         ("Q4_K", "wide"): (G(8, 2, 2, 1, 1), G(8, 2, 2, 1, 2), G(4, 2, 2, 1, 1), G(4, 1, 2, 1, 1),
                            G(4, 2, 2, 1, 2), G(4, 4, 2, 1, 1), G(8, 4, 2, 1, 1), G(4, 2, 4, 1, 1),
                            G(4, 1, 2, 2, 1), G(8, 8, 2, 1, 1)),
         ("Q4_0", "vec"): (G(4, 1, 2, 1, 1), G(4, 2, 2, 1, 1), G(4, 1, 1, 1, 1), G(4, 1, 2, 2, 1),
                           G(8, 2, 2, 1, 1), G(4, 1, 4, 1, 1), G(4, 2, 4, 1, 1)),
         ("Q8_0", "vec"): (G(4, 4, 4, 1, 1), G(4, 4, 2, 2, 1), G(4, 2, 4, 1, 1), G(4, 4, 2, 1, 1),
                           G(8, 8, 2, 1, 1), G(4, 2, 2, 1, 1), G(8, 4, 4, 1, 1))}


# --focus: (type, kernel variant) -> launch shapes timed at every GEMV shape (bit-unpacking
# round: Q1_0 bit planes, Q3_K u32 words, both with 16-byte activation loads; "" = the base
# kernel, with the previous defaults)
FOCUS_TRIES = {("Q1_0", "rows"): (G(4, 1, 8, 1, 1), G(4, 1, 4, 1, 1), G(8, 1, 8, 1, 1),
                                  G(4, 1, 16, 1, 1), G(2, 1, 8, 1, 1), G(4, 2, 2, 1, 1)),
               ("Q1_0", ""): (G(4, 1, 2, 1, 1), G(4, 4, 2, 1, 1)),
               ("Q3_K", "wide"): (G(4, 1, 4, 1, 1), G(4, 1, 8, 1, 1), G(8, 1, 4, 1, 1),
                                  G(2, 1, 4, 1, 1), G(4, 2, 4, 1, 1), G(4, 1, 2, 1, 1)),
               ("Q3_K", ""): (G(4, 2, 4, 1, 1),),
               ("Q2_K", "wide"): (G(4, 1, 2, 1, 1), G(4, 2, 2, 1, 1), G(4, 1, 2, 2, 1),
                                  G(8, 1, 2, 1, 1))}


def focus(types, rng, deadline):
    """Time FOCUS_TRIES and the shipped defaults of `types` at the three GEMV shapes."""
    plan = [(t, c._replace(kernel=None), v) for (t, v), cs in FOCUS_TRIES.items()
            if t in types for c in cs]
    plan += [default_entry(t, k) for t in types for k in (4096, K)]
    plan = list(dict.fromkeys(plan))
    t0 = time.time()
    print(f"precompiled {precompile([(t, c, v, K, 1) for t, c, v in plan])} launches in "
          f"{time.time() - t0:.0f} s", flush=True)
    wait_for_flag(t0)
    results = {"copy_GBps": copy_bandwidth() / 1e9, "gemv": [], "gemm": []}
    print(f"copy bandwidth: {results['copy_GBps']:.0f} GB/s")
    for shape in (MID, BIG, LONG):
        sweep(rng, results["copy_GBps"], shape, plan, deadline, results)
    save(results)


# --issue at k = 4096: Q3_K's register kernel next to its default (the bulk-copy kernel)
Q3_K_SHORT_TRIES = (G(1, 1, 6, 1, 1),)


def issue_table(rng):
    """Issue 5's two GEMV targets with every timing mode: the six llama.cpp-measured types at
    4096 x 14336 with the Q8_1 quantization in the graph, weights rotated (HBM) and not (as
    llama.cpp's perf mode), plain and PDL graphs; the bit-unpacking types at the shapes larger
    than L2, plain and PDL, plus Q3_K launch shapes at 57344 x 4096."""
    copy = copy_bandwidth() / 1e9
    results = {"copy_GBps": copy, "issue": []}
    print(f"copy bandwidth: {copy:.0f} GB/s")
    print("\n4096 x 14336 GEMV + Q8_1 quantize (us): rotated plain / PDL / PDL without the L2 "
          "prefetch, one buffer plain / PDL")
    for type_name in LLAMA_CPP_H200_US:
        config = default_for(type_name, K)
        modes = ((True, False, True), (True, True, True), (True, True, False), (False, False, True),
                 (False, True, True))
        row = [bench_gemv(type_name, config, rng, with_quantize=True, rotate=r, pdl=p,
                          prefetch=f)[0] * 1e6 for r, p, f in modes]
        results["issue"].append(dict(type=type_name, shape=LONG, config=config, us=row))
        print(f"  {type_name} {tuple(config)}: " + " / ".join(f"{u:.1f}" for u in row) +
              f"  (llama.cpp {LLAMA_CPP_H200_US[type_name]})", flush=True)
    print("\nlarger than L2, GEMV alone, % of copy: plain / PDL / PDL without the L2 prefetch"
          " (config None = gemv_q8_into's default: Q3_K's bulk-copy kernel; Q1_0 here is the"
          " DP4A kernel of Q8_1 activations, its binary tensor-core path: q1_0_bmma.py)")
    plan = [(t, None, s) for t in ("Q3_K", "Q2_K", "Q1_0", "Q4_K") for s in (MID, BIG)]
    plan += [("Q3_K", c, s) for c in Q3_K_SHORT_TRIES for s in (MID, BIG)]
    for type_name, config, shape in plan:
        row = [bench_gemv(type_name, config, rng, shape=shape, pdl=p, prefetch=f)
               for p, f in ((False, True), (True, True), (True, False))]
        pct = [100 * nbytes / sec / 1e9 / copy for sec, nbytes in row]
        results["issue"].append(dict(type=type_name, shape=shape, config=config,
                                     us=[sec * 1e6 for sec, _ in row], pct=pct))
        label = "default" if config is None else tuple(config)
        print(f"  {type_name} {shape[0]}x{shape[1]} {label}: " +
              " / ".join(f"{sec * 1e6:.1f}" for sec, _ in row) + " us, " +
              " / ".join(f"{p:.0f}" for p in pct) + "%", flush=True)
    save(results)


def wait_for_flag(t0: float):
    if "--wait-for" in sys.argv:   # a file another job (e.g. the GPU tests) creates when done
        flag = sys.argv[sys.argv.index("--wait-for") + 1]
        while not os.path.exists(flag) and time.time() < t0 + 120:
            time.sleep(0.5)
        print(f"timing starts {time.time() - t0:.0f} s after the precompile began", flush=True)


def variant_of(type_name: str) -> str:
    return gemv_module.VARIANT.get(type_name, "")


def default_entry(type_name: str, k: int):
    """(type, shipped config, its kernel variant) for rows of k values."""
    config = default_for(type_name, k)
    return type_name, config, variant_of(type_name) if config.kernel is None else config.kernel


def before_of(type_name: str):
    return (type_name, BEFORE[type_name], "")


def variant_tries():
    return [(t, c, v) for (t, v), cs in TRIES.items() for c in cs]


def short_candidates(type_name: str) -> list:
    """Launch shapes for k = 4096 rows (a quarter of the items of k = 14336: fewer warps/row)."""
    v = BEFORE[type_name].widen
    return list(dict.fromkeys([BEFORE[type_name], G(4, 1, 1, 1, v), G(4, 1, 2, 1, v),
                               G(4, 2, 2, 1, v), G(4, 2, 1, 1, v), G(4, 4, 2, 1, v),
                               G(4, 2, 4, 1, v), G(4, 1, 2, 2, v), G(4, 2, 2, 2, v),
                               G(8, 4, 2, 1, v)]))


def plan_long():
    """(type, config, kernel variant) at 4096 x 14336: before, shipped default, the variants."""
    out = [before_of(t) for t in TYPES] + [default_entry(t, K) for t in TYPES]
    return list(dict.fromkeys(out + variant_tries()))


def plan_mid():
    """k = 4096: the short-row shapes with each type's default kernel, and the before rows."""
    out = [before_of(t) for t in TYPES] + [default_entry(t, 4096)
                                           for t in TYPES]
    out += [(t, c, variant_of(t)) for t in TYPES for c in short_candidates(t)]
    return list(dict.fromkeys(out + [("Q6_K", c, "words") for c in TRIES[("Q6_K", "words")]]))


def plan_defaults(k: int):
    return [before_of(t) for t in TYPES] + [default_entry(t, k)
                                            for t in TYPES]


def bench_variant(type_name, config, variant, rng, shape, **kw):
    """bench_gemv with the type's kernel variant (gemv.VARIANT) set to `variant`."""
    saved = dict(gemv_module.VARIANT)
    if type_name in saved:
        gemv_module.VARIANT[type_name] = variant
    try:
        return bench_gemv(type_name, config, rng, shape=shape, **kw)
    finally:
        gemv_module.VARIANT.update(saved)


def warm_jobs(jobs):
    """Worker: launch each (type, config, kernel variant, k, batch) once on a 4-row matrix
    (compiles the same specialization as the full shape, filling the disk PTX cache and the
    driver's JIT cache)."""
    pk.set_device("cuda")
    rng = np.random.default_rng(1)
    for type_name, config, variant, k, batch in jobs:
        fmt = get_format(type_name)
        raw = np.frombuffer(rng.bytes(4 * (k // fmt.block_elems * fmt.block_bytes)), np.uint8)
        w = weight_words(pk.to_device(raw.reshape(4, -1)), type_name, k)[0]
        xq = pk.zeros((batch, q8_1_bytes(k)), np.uint8)
        if type_name in gemv_module.VARIANT:
            gemv_module.VARIANT[type_name] = variant
        gemv_q8_into(w, type_name, xq, pk.empty((batch, 4), np.float32), 4, k, batch,
                     config=config)
    pk.synchronize()
    return len(jobs)


def precompile(jobs, workers: int = 12):
    """Compile every specialization the timing loop will launch in parallel processes first."""
    import multiprocessing as mp
    chunks = [jobs[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        return sum(pool.map(warm_jobs, [c for c in chunks if c]))


def gemv_row(results, copy, type_name, shape, config, variant, sec, nbytes):
    gbps = nbytes / sec / 1e9
    tag = ("before " if (type_name, config, variant) == before_of(type_name) else "") + \
        ("default" if (type_name, config, variant) == default_entry(type_name, shape[1]) else "")
    results["gemv"].append(dict(type=type_name, m=shape[0], k=shape[1], config=config,
                                variant=variant, us=sec * 1e6, GBps=gbps, tag=tag))
    print(f"| {type_name} | {shape[0]}x{shape[1]} | {tuple(config)} | {variant} | {tag} | "
          f"{sec * 1e6:.1f} | {gbps:.0f} | {100 * gbps / copy:.0f} |", flush=True)


def sweep(rng, copy, shape, plan, deadline, results):
    """Time each (type, config, kernel variant) of plan at shape; returns {type: [(seconds,
    config, variant)]} sorted, the fastest first."""
    print("\n| type | m x k | config (warps, split, rows, unroll, widen, stage_x, per_sm) | "
          "Q6_K kernel | tag | us | GB/s | % copy |\n|---|---|---|---|---|---|---|---|")
    timed = {}
    for type_name, config, variant in plan:
        if time.time() > deadline:
            break
        sec, nbytes = bench_variant(type_name, config, variant, rng, shape)
        gemv_row(results, copy, type_name, shape, config, variant, sec, nbytes)
        timed.setdefault(type_name, []).append((sec, config, variant))
    _WEIGHTS.clear()
    save(results)
    return {t: sorted(v) for t, v in timed.items()}


def main():
    budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 1e9
    deadline = time.time() + budget
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    if "--gemm-only" in sys.argv:
        results = {"gemm": []}
        compare_gemm(rng, results)
        return
    if "--q1-0-bmma" in sys.argv:   # Q1_0 on binary tensor cores vs DP4A (q1_0_bmma.py)
        from benchmarks.q1_0_bmma import main as q1_0_bmma
        q1_0_bmma()
        return
    if "--issue" in sys.argv:
        issue_table(rng)
        return
    if "--focus" in sys.argv:
        focus(sys.argv[sys.argv.index("--focus") + 1].split(","), rng, deadline)
        return
    only_defaults = "--defaults" in sys.argv
    long_plan = plan_defaults(K) if only_defaults else plan_long()
    mid_plan = plan_defaults(4096) if only_defaults else plan_mid()
    jobs = [(t, c, v, K, 1) for t, c, v in long_plan] + \
        [(t, c, v, 4096, 1) for t, c, v in mid_plan] + \
        [("Q4_K", gemv_module.gemv_config("Q4_K", b)._replace(kernel=v), v, K, b)
         for b in (2, 4, 8) for v in ("wide", "")]
    t0 = time.time()
    print(f"precompiled {precompile(jobs)} launches in {time.time() - t0:.0f} s", flush=True)
    wait_for_flag(t0)
    results = {"copy_GBps": copy_bandwidth() / 1e9, "gemv": [], "gemm": []}
    copy = results["copy_GBps"]
    print(f"copy bandwidth: {copy:.0f} GB/s (2 x bytes / time, 1 GiB); SMs: "
          f"{sm_count('cuda', 0)}")
    results["q8_1_quantize_us"] = bench_quantize(rng) * 1e6
    print(f"quantize_q8_1 of {K} values: {results['q8_1_quantize_us']:.2f} us")
    sweep(rng, copy, LONG, long_plan, deadline - 80, results)
    mid = sweep(rng, copy, MID, mid_plan, deadline - 45, results)
    results["best_mid"] = {t: v[0] for t, v in mid.items()}
    print("\nbest at k=4096:", {t: (round(v[0][0] * 1e6, 1), tuple(v[0][1]), v[0][2])
                                for t, v in mid.items()}, flush=True)
    big = [(t, c, var) for t, v in mid.items() for _, c, var in v[:2]]
    big += [before_of(t) for t in TYPES] + [default_entry(t, 4096)
                                            for t in TYPES]
    sweep(rng, copy, BIG, list(dict.fromkeys(big)), deadline - 20, results)
    print("\nbatched Q4_K GEMV (gemv.BATCH_CONFIGS), 4096 x 14336, chunk and 16-value items:")
    for batch, variant in ((2, "wide"), (2, ""), (4, "wide"), (4, ""), (8, "wide"), (8, "")):
        if time.time() < deadline - 15:
            config = gemv_module.gemv_config("Q4_K", batch)._replace(kernel=variant)
            sec, nbytes = bench_variant("Q4_K", config, variant, rng, LONG, batch=batch)
            results["gemv"].append(dict(type="Q4_K", batch=batch, config=config,
                                        variant=variant, us=sec * 1e6))
            print(f"  batch {batch} {tuple(config)} {variant!r}: {sec * 1e6:.1f} us", flush=True)
    print("\n4096 x 14336, shipped default, + the Q8_1 quantization in the same graph:")
    for type_name in TYPES:
        if time.time() > deadline:
            break
        config = default_for(type_name, K)
        alone, _ = bench_gemv(type_name, config, rng, shape=LONG)
        both, _ = bench_gemv(type_name, config, rng, shape=LONG, with_quantize=True)
        results[f"default_{type_name}"] = dict(config=config, us=alone * 1e6,
                                               with_quantize_us=both * 1e6)
        print(f"  {type_name} {tuple(config)}: {alone * 1e6:.1f} us, with quantize "
              f"{both * 1e6:.1f} us (llama.cpp {LLAMA_CPP_H200_US.get(type_name, '-')})",
              flush=True)
    save(results)
    if "--with-gemm" in sys.argv:
        fused, separate = bench_rmsnorm_q8_1(rng)
        print(f"rmsnorm + quantize_q8_1 (n=4096): fused {fused * 1e6:.2f} us, "
              f"two launches {separate * 1e6:.2f} us")
        compare_gemm(rng, results)


def save(results):
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "quant_matmul.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
