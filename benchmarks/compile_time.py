"""Compile-time benchmark: cold compile (Python source -> PTX, empty cache) of an RMSNorm with
shared memory and shuffles, and a warm load of the disk-cached PTX in a new process.
Usage: python benchmarks/compile_time.py"""
import os
import statistics
import subprocess
import sys
import tempfile

KERNEL = '''
import pykernel as pk
from pykernel import Const, Ptr, f32, i32

@pk.kernel
def rmsnorm(x: Ptr[f32, "ro"], w: Ptr[f32, "ro"], out: Ptr[f32], n: i32, eps: f32,
            BLOCK: Const[int]):
    partial = pk.shared_array(f32, 32)
    t = pk.thread_idx.x
    row = pk.block_idx.x
    acc = f32(0.0)
    for i in range(t, n, BLOCK):
        v = x[row * n + i]
        acc += v * v
    for k in pk.static_range(5):
        acc += pk.shfl_xor(acc, 16 >> k)
    if pk.lane_id() == 0:
        partial[t // 32] = acc
    pk.syncthreads()
    total = f32(0.0)
    for k in range(BLOCK // 32):
        total += partial[k]
    scale = pk.rsqrt(total / f32(n) + eps)
    for i in range(t, n, BLOCK):
        out[row * n + i] = x[row * n + i] * scale * w[i]
'''

MEASURE = '''
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, {dir!r})
import kmod
t1 = time.perf_counter()
c = kmod.rmsnorm.compile("sm_90", BLOCK=256)
t2 = time.perf_counter()
print(f"{{(t2 - t1) * 1e3:.3f}} {{(t1 - t0) * 1e3:.1f}}")
'''


def run(tmp, cache):
    env = dict(os.environ, PYKERNEL_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", MEASURE.format(dir=tmp)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main(repeats=5):
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "kmod.py"), "w") as f:
            f.write(KERNEL)
        cold, warm, imports = [], [], []
        for r in range(repeats):
            cache = os.path.join(tmp, f"cache{r}")
            ms, imp = run(tmp, cache)          # empty cache: parse + lower + LLVM + PTX
            cold.append(ms)
            imports.append(imp)
            warm.append(run(tmp, cache)[0])    # new process, PTX from the disk cache
    print(f"import pykernel + kernel module: median {statistics.median(imports):.0f} ms")
    print(f"cold compile to PTX (sm_90):     median {statistics.median(cold):.1f} ms "
          f"(min {min(cold):.1f})")
    print(f"warm disk-cache load, new proc:  median {statistics.median(warm):.2f} ms "
          f"(min {min(warm):.2f})")


if __name__ == "__main__":
    main()
