"""The dequant_f16 pass alone (quant.dequant_f16.dequantize_f16_into: GGUF weights -> an f16
scratch matrix, the first half of the prompt route on Hopper) per format and shape, against a
device-to-device copy of the same number of bytes measured in the same run (issue 43).
Needs a CUDA GPU.

    python3 benchmarks/dequant_f16.py [--types Q4_K,Q6_K,Q5_K,Q4_0,Q4_1,Q8_0,MXFP4]
                                      [--shapes 4096x4096,4096x14336,14336x4096] [--launches 10]

Per type and N x K weights: microseconds per pass, GB/s of bytes moved (quant bytes read + f16
bytes written), and that time as a fraction of the copy's: a 16-byte-vector copy kernel reading
half the moved bytes and writing the other half (the same traffic, no decoding). Each figure is
the median of 5 timings of a CUDA graph of --launches back-to-back launches. Checked first:
the pass's values equal device.dequantize's f16 (up to the sign of zero; a count of differing
values is printed, 0 expected). 4096x14336 and 14336x4096 move the same bytes: a gap between
them is a row-length effect; one between 4096x4096 and the others, a per-launch cost or a tail.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk
from benchmarks._timing import captured, seconds_per_replay
from benchmarks.quant_gemm import SCALE_BYTES, random_raw
from pykernel import Ptr, i32, u32
from stdlib_kernels.quant import device
from stdlib_kernels.quant.dequant_f16 import dequantize_f16_into
from stdlib_kernels.quant.formats import get_format
from stdlib_kernels.quant.gemv import weight_words

TYPES = "Q4_K,Q6_K,Q5_K,Q4_0,Q4_1,Q8_0,MXFP4"
SHAPES = "4096x4096,4096x14336,14336x4096"       # N x K: q/o, down, gate/up
THREADS = 256


@pk.kernel
def copy_words(src: Ptr[u32, "ro"], dst: Ptr[u32], quads: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < quads:
        pk.store_vec(dst, 4 * i, pk.load_vec(src, 4 * i, 4))


def median_seconds(record, launches: int) -> float:
    """Median over 5 timings of one replay of a graph holding `launches` launches of record."""
    stream = pk.Stream()
    record()
    pk.synchronize()
    graph = captured(lambda: [record() for _ in range(launches)], stream)
    return statistics.median(seconds_per_replay(graph, stream, 3) for _ in range(5)) / launches


def weights(type_name: str, n: int, k: int, rng):
    if type_name in SCALE_BYTES:
        return random_raw(type_name, n, k, rng)
    fmt = get_format(type_name)          # MXFP4: any e8m0 byte is a finite power of two
    return pk.to_device(np.frombuffer(rng.bytes(n * k // fmt.block_elems * fmt.block_bytes),
                                      np.uint8).reshape(n, -1).copy())


def bench(type_name: str, n: int, k: int, launches: int, rng) -> None:
    raw = weights(type_name, n, k, rng)
    words = weight_words(raw, type_name, k)[0]
    out = pk.empty((n * k,), np.float16)
    dequantize_f16_into(words, type_name, out, n, k)
    want = device.dequantize(raw, type_name, k, dtype=np.float16).numpy().reshape(-1)
    differ = int(np.count_nonzero((out.numpy() + np.float16(0)).view(np.uint16)
                                  != (want + np.float16(0)).view(np.uint16)))
    t_pass = median_seconds(lambda: dequantize_f16_into(words, type_name, out, n, k), launches)

    moved = raw.nbytes + 2 * n * k
    quads = moved // 2 // 16
    src, dst = pk.empty((4 * quads,), np.uint32), pk.empty((4 * quads,), np.uint32)
    grid = (quads + THREADS - 1) // THREADS
    t_copy = median_seconds(lambda: copy_words[grid, THREADS](src, dst, quads), launches)
    print(f"{type_name:5s} {n}x{k:<6d} pass {t_pass * 1e6:6.1f} us {moved / t_pass / 1e9:6.0f} "
          f"GB/s | copy of the same bytes {t_copy * 1e6:6.1f} us {moved / t_copy / 1e9:6.0f} "
          f"GB/s | pass / copy time {t_pass / t_copy:4.2f} | {differ} values differ",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated NxK")
    ap.add_argument("--launches", type=int, default=10, help="launches per timed graph")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (use "
                    "small --shapes; its times say nothing)")
    args = ap.parse_args()
    pk.set_device(args.device)
    rng = np.random.default_rng(0)
    print(f"device: {pk.current_device()}")
    for type_name in args.types.split(","):
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            bench(type_name, n, k, args.launches, rng)


if __name__ == "__main__":
    main()
