"""Cold start of the runner: where the first run on a fresh machine spends its time.

Input: a GGUF file. Output: (1) wall time of `pykernel run PROMPT --model FILE -n N` in a
new process with empty caches (pykernel's PTX cache and the driver's JIT cache), then again
with both warm; (2) an in-process probe of a cold run: kernels compiled in this process
(Python -> PTX; precompile's workers compile the rest), loaded, and launched the first
time (where the driver's PTX JIT runs under its default lazy module loading), total and
slowest, and those specializations as JSON (`--specs`), so the compile can be
profiled on a machine without a GPU.

    python3 benchmarks/cold_start.py MODEL.gguf [-n 16] [--specs specs.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "Once upon a time,"


# the runs start in REPO: `python -m` and `python -c` put the working directory first on
# sys.path, so from elsewhere they would import that directory's pykernel (an A/B of two trees
# would time one of them twice)
def fresh_env(root: str) -> dict:
    return dict(os.environ, PYKERNEL_CACHE_DIR=os.path.join(root, "ptx"),
                CUDA_CACHE_PATH=os.path.join(root, "nv"), PYTHONPATH=os.pathsep.join(
                    [REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def cli_walls(model: str, n: int) -> tuple[float, float]:
    """Seconds of `pykernel run` with empty caches, then with the caches it left."""
    with tempfile.TemporaryDirectory() as root:
        env, walls = fresh_env(root), []
        for _ in range(2):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pykernel", "run", PROMPT, "--model", model,
                            "-n", str(n), "--temp", "0"], env=env, check=True,
                           capture_output=True, cwd=REPO)
            walls.append(time.perf_counter() - start)
        return walls[0], walls[1]


PROBE = r'''
import json, sys, time
import pykernel.compiler as compiler
from pykernel.runtime import cuda
compiles, loads, firsts = [], [], {}
original_compile, original_load = compiler.compile_kernel, cuda.CudaDevice.load
original_launch = cuda.CudaDevice.launch

def timed_compile(kernel, arch, spec, options, *args, **kwargs):
    start = time.perf_counter()
    out = original_compile(kernel, arch, spec, options, *args, **kwargs)
    compiles.append(dict(kernel=kernel.name, module=kernel.fn.__module__, arch=arch,
                         spec={k: getattr(v, "name", v) for k, v in spec.items()},
                         seconds=time.perf_counter() - start))
    return out

def timed_load(self, compiled):
    start = time.perf_counter()
    out = original_load(self, compiled)
    loads.append(dict(kernel=compiled.name, seconds=time.perf_counter() - start))
    return out

def timed_launch(self, compiled, *args, **kwargs):
    # with lazy module loading (the driver's default) the PTX JIT runs in a kernel's first
    # launch, not in its load
    first = compiled.cache_key not in firsts
    start = time.perf_counter()
    out = original_launch(self, compiled, *args, **kwargs)
    if first:
        firsts[compiled.cache_key] = dict(kernel=compiled.name,
                                          seconds=time.perf_counter() - start)
    return out

import pykernel
precompiles, original_precompile = [], pykernel.precompile

def timed_precompile(*args, **kwargs):
    start = time.perf_counter()
    stats = original_precompile(*args, **kwargs)
    precompiles.append(dict(stats, wall_s=time.perf_counter() - start))
    return stats

compiler.compile_kernel, cuda.CudaDevice.load = timed_compile, timed_load
cuda.CudaDevice.launch, pykernel.precompile = timed_launch, timed_precompile
start = time.perf_counter()
import llm
model = llm.load(sys.argv[1], device="cuda")
loaded = time.perf_counter()
text = "".join(model.generate(sys.argv[2], max_tokens=int(sys.argv[3]), temperature=0))
done = time.perf_counter()
print(json.dumps(dict(load_s=loaded - start, generate_s=done - loaded, compiles=compiles,
                      loads=loads, first_launches=list(firsts.values()),
                      precompiles=precompiles)))
'''


def probe(model: str, n: int) -> dict:
    with tempfile.TemporaryDirectory() as root:
        out = subprocess.run([sys.executable, "-c", PROBE, model, PROMPT, str(n)],
                             env=fresh_env(root), check=True, capture_output=True, text=True,
                             cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("-n", type=int, default=16)
    parser.add_argument("--specs", help="write the compiled specializations here (JSON)")
    args = parser.parse_args()
    cold, warm = cli_walls(args.model, args.n)
    print(f"pykernel run -n {args.n}: cold {cold:.2f} s, warm {warm:.2f} s")
    result = probe(args.model, args.n)
    compiles, loads, firsts = result["compiles"], result["loads"], result["first_launches"]
    print(f"probe (cold): model load {result['load_s']:.2f} s, generate {result['generate_s']:.2f}"
          f" s; {len(compiles)} compiles {sum(c['seconds'] for c in compiles):.2f} s, "
          f"{len(loads)} driver loads {sum(x['seconds'] for x in loads):.2f} s, first launches "
          f"(with lazy loading the driver's JIT) {sum(x['seconds'] for x in firsts):.2f} s")
    for stats in result["precompiles"]:
        print(f"  precompile: {stats}")
    for x in sorted(firsts, key=lambda x: -x["seconds"])[:5]:
        print(f"  first launch {x['kernel']:<23} {x['seconds']:.2f} s")
    for c in sorted(compiles, key=lambda c: -c["seconds"])[:8]:
        print(f"  compile {c['kernel']:<28} {c['seconds']:.2f} s")
    for x in sorted(loads, key=lambda x: -x["seconds"])[:5]:
        print(f"  load    {x['kernel']:<28} {x['seconds']:.2f} s")
    if args.specs:
        with open(args.specs, "w") as f:
            json.dump(compiles, f, indent=1)


if __name__ == "__main__":
    main()
