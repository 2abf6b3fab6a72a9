"""Where a cold first call's host time goes: the stdlib RMSNorm 8192 x 4096 f32 (what
benchmarks/dsl_peers.py times as "first call") on a mocked sm_90 CUDA device, so it runs
without a GPU; the driver's part (module load, PTX JIT, launch, synchronize) is not in it.

Input: none. Each run is a fresh process with an empty pykernel cache (imports of pykernel
and stdlib_kernels done before the clock starts, as in dsl_peers). Output: a markdown table
of CPU milliseconds per stage (best of RUNS processes: CPU time, not wall time, so other
processes on a shared host disturb it less), and how many kernel variants the call compiled.

    python3 benchmarks/first_call_stages.py [--runs 5]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ["imports at first compile (llvmlite.binding, compiler, NVPTX init)",
          "cache key", "parse (source -> ast)", "lower (ast -> llvmlite IR)", "str(module)",
          "parse_assembly + verify", "emit (LLVM NVPTX codegen)", "cache store",
          "whole first call (pykernel and stdlib_kernels already imported)"]


def one_run() -> dict:
    """The measurement, in this (fresh) process."""
    sys.path.insert(0, ROOT)
    import numpy as np

    import pykernel as pk
    from pykernel.runtime import cuda as cuda_runtime
    from pykernel.runtime.arrays import Array
    from stdlib_kernels.norm import rmsnorm
    from tests.runtime.fakes import mock_cuda_device
    device = mock_cuda_device("sm_90")
    device.memory.upload = lambda dst, host: None      # the absent-weight stand-in's upload
    cuda_runtime._launch_kernel = lambda *args: (0,)
    pk.set_device(device)
    rows, cols = 8192, 4096
    x, w = (Array(None, device.memory.alloc(4 * n)[1], shape, np.dtype(np.float32), device)
            for n, shape in ((rows * cols, (rows, cols)), (cols, (cols,))))
    times, compiled = collections.defaultdict(float), []
    start = time.process_time()
    _instrument(times, compiled)     # imports the compiler: timed as the first stage
    times[STAGES[0]] = time.process_time() - start
    start = time.process_time()
    rmsnorm(x, w)
    times[STAGES[-1]] = time.process_time() - start + times[STAGES[0]]
    return {"ms": {k: v * 1e3 for k, v in times.items()}, "compiled": compiled,
            "loaded": len(device._kernels)}


def _instrument(times, compiled):
    import llvmlite.binding  # noqa: F401  (what a first compile imports)
    import llvmlite.ir.module as ir_module

    from pykernel import cache, compiler
    from pykernel.targets import nvptx
    nvptx._init_nvptx()

    def timed(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                times[label] += time.process_time() - start
        setattr(owner, name, wrapper)
    for owner, name, label in ((cache, "kernel_key", STAGES[1]), (compiler, "parse", STAGES[2]),
                               (compiler, "lower", STAGES[3]),
                               (ir_module.Module, "__repr__", STAGES[4]),
                               (compiler, "verify", STAGES[5]),
                               (nvptx.NVPTXTarget, "emit", STAGES[6]),
                               (cache, "store", STAGES[7])):
        timed(owner, name, label)
    compile_kernel = compiler.compile_kernel

    def recording(kernel, arch, spec, options, *args, **kwargs):
        compiled.append(f"{kernel.name} (pdl={options.pdl})")
        return compile_kernel(kernel, arch, spec, options, *args, **kwargs)
    compiler.compile_kernel = recording


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_run()))
        return
    best, last = {}, None
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="first_call_") as cache:
            env = dict(os.environ, PYKERNEL_CACHE_DIR=cache)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one"],
                                  env=env, capture_output=True, text=True, cwd=ROOT,
                                  check=False)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            sys.exit(f"first_call_stages: a run failed:\n{done.stderr[-2000:]}")
        last = json.loads(lines[0][len("RESULT "):])
        for stage, ms in last["ms"].items():
            best[stage] = min(best.get(stage, ms), ms)
    print(f"| stage (CPU ms, best of {args.runs} fresh processes) | ms |\n|---|---|")
    for stage in STAGES:
        print(f"| {stage} | {best.get(stage, 0.0):.1f} |")
    print(f"\ncompiled: {', '.join(last['compiled'])}; kernels loaded: {last['loaded']}")


if __name__ == "__main__":
    main()
