"""pykernel beside its peers as a kernel writer meets them: numba-cuda, Triton and cuda.core
(NVRTC C++), each in its own process with empty caches (compile cache, driver JIT cache off).

Measures (issue 41), each peer where it can:
- first call: an RMSNorm 8192 x 4096 f32 from an empty cache (compile, load, launch, sync), ms;
  then the same in a second process with the cache now warm. Output buffers are allocated
  before the clock starts for every peer; pykernel's sources are byte-compiled first (as `pip
  install` does for an installed package and had done for the peers), so a checkout copied
  to the machine does not pay Python's .pyc compilation inside the first call;
- launch overhead of a 4-argument kernel (out = x + y, 128 elements), host us per launch, with
  the peer's own arrays, with a bound launch (pykernel), and with torch tensors;
- bandwidth of the scalar vector add (one element per thread) and of the 16-byte one (four per
  thread, vector loads) over 3 x 1 GiB buffers (3 GiB moved per launch, far over L2), GB/s;
  torch.add(x, y, out=) as the reference;
- RMSNorm 8192 x 4096 f32 bandwidth (read x, write out), GB/s.

A peer that is not installed, or a measure that fails, shows "-" (the reason goes to stderr).
Run on a GPU machine (under 5 minutes on an H200):

    python3 benchmarks/dsl_peers.py            # the markdown table
    python3 benchmarks/dsl_peers.py --small    # tiny sizes: a smoke test of every path
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = ("pykernel", "numba-cuda", "triton", "cuda.core")
ROWS = [("first_ms", "first call RMSNorm, empty caches (ms)"),
        ("warm_first_ms", "first call RMSNorm, warm cache, new process (ms)"),
        ("launch_own_us", "launch, 4-arg kernel, own arrays (us)"),
        ("launch_bound_us", "launch, bound (`k[g, b].bind(...).launch()`) (us)"),
        ("raw_floor_us", "raw cuLaunchKernel of that kernel, prebuilt `extra` (us)"),
        ("launch_torch_us", "launch with torch tensors (us)"),
        ("raw_floor_torch_us", "raw cuLaunchKernel again, torch's CUDA initialized (us)"),
        ("torch_add_us", "torch.add launch, same tensors (us)"),
        ("add_scalar_gbs", "scalar vector add, 3 x 1 GiB (GB/s)"),
        ("add_vec16_gbs", "16-byte vector add, 3 x 1 GiB (GB/s)"),
        ("torch_add_gbs", "torch.add, 3 x 1 GiB (GB/s)"),
        ("rmsnorm_gbs", "RMSNorm 8192x4096 f32 (GB/s)")]
PEER_TIMEOUT_S = 100


class Sizes:
    def __init__(self, small: bool):
        self.vec_n = (1 << 16) if small else (1 << 28)        # f32 elements per buffer
        self.rows, self.cols = (64, 4096) if small else (8192, 4096)
        self.batch, self.batches = (20, 3) if small else (200, 30)
        self.reps = 2 if small else 10


def launch_us(launch, sync, sizes) -> float:
    """Host us per launch: median over batches, each followed by an untimed sync."""
    for _ in range(20):
        launch()
    sync()
    samples = []
    for _ in range(sizes.batches):
        start = time.perf_counter()
        for _ in range(sizes.batch):
            launch()
        samples.append((time.perf_counter() - start) / sizes.batch * 1e6)
        sync()
    return statistics.median(samples)


def gbs(run, sync, nbytes: int, sizes) -> float:
    run()
    sync()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(sizes.reps):
            run()
        sync()
        best = min(best, (time.perf_counter() - start) / sizes.reps)
    return nbytes / best / 1e9


class Results(dict):
    def measure(self, key, fn, *args):
        """Record fn(*args) under key; a failure leaves the key out and says why."""
        try:
            self[key] = fn(*args)
        except Exception as exc:   # one measure failing must not lose the others
            print(f"[{key}] {type(exc).__name__}: {exc}", file=sys.stderr)


def _torch():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def torch_rows(res, torch, sizes, small_args):
    """torch.add's launch cost and bandwidth: the reference column's figures."""
    x, y, out = small_args
    sync = torch.cuda.synchronize
    res.measure("torch_add_us", launch_us, lambda: torch.add(x, y, out=out), sync, sizes)
    big = [torch.empty(sizes.vec_n, device="cuda") for _ in range(3)]
    res.measure("torch_add_gbs", gbs, lambda: torch.add(big[0], big[1], out=big[2]), sync,
                12 * sizes.vec_n, sizes)


# --- pykernel ---------------------------------------------------------------------------------
def raw_launch(device, name: str, args):
    """The bare driver call of loaded kernel `name` with `args` packed once into a buffer of
    its own (one buffer through `extra`, or kernelParams where the device uses those): the
    floor any Python launcher pays on this host, measured in the same process."""
    from cuda.bindings import driver as cu
    kernel = next(k for k in device._kernels.values() if k.name == name)
    kernel.pack(args)
    owner, params, extra = kernel.packer.snapshot()
    params, extra = (0, extra) if kernel.param_buffer else (params, 0)
    func, stream, launch = kernel.func, cu.CUstream(0), cu.cuLaunchKernel
    return lambda owner=owner: launch(func, 1, 1, 1, 128, 1, 1, 0, stream, params, extra)


def run_pykernel(sizes, first_only: bool) -> dict:
    sys.path.insert(0, os.path.dirname(HERE))
    import numpy as np

    import pykernel as pk
    from stdlib_kernels.norm import rmsnorm
    res = Results()
    rows, cols = sizes.rows, sizes.cols
    x = pk.to_device(np.random.default_rng(0).standard_normal((rows, cols), np.float32))
    w = pk.to_device(np.ones(cols, np.float32))
    out = pk.empty((rows, cols), np.float32)
    pk.synchronize()
    start = time.perf_counter()
    rmsnorm(x, w, out=out)
    pk.synchronize()
    res["warm_first_ms" if first_only else "first_ms"] = (time.perf_counter() - start) * 1e3
    if first_only:
        return res
    res.measure("rmsnorm_gbs", gbs, lambda: rmsnorm(x, w, out=out), pk.synchronize,
                8 * rows * cols, sizes)
    from benchmarks.dsl_peers_kernels import pk_add, pk_add_vec4
    small = [pk.zeros(128, np.float32) for _ in range(3)]
    launcher = pk_add[1, 128]
    res.measure("launch_own_us", launch_us, lambda: launcher(*small, 128), pk.synchronize,
                sizes)
    bound = launcher.bind(*small, 128)
    res.measure("launch_bound_us", launch_us, bound.launch, pk.synchronize, sizes)
    res.measure("raw_floor_us", lambda: launch_us(raw_launch(pk.get_device(), pk_add.name,
                                                             (*small, 128)),
                                                  pk.synchronize, sizes))
    n = sizes.vec_n
    big = [pk.empty(n, np.float32) for _ in range(3)]
    res.measure("add_scalar_gbs", gbs, lambda: pk_add[-(-n // 256), 256](*big, n),
                pk.synchronize, 12 * n, sizes)
    res.measure("add_vec16_gbs", gbs,
                lambda: pk_add_vec4[-(-n // 1024), 256](*big, n // 4), pk.synchronize,
                12 * n, sizes)
    big.clear()     # frees the 3 GiB before the next measure
    torch = _torch()
    if torch is not None:
        tensors = [torch.zeros(128, device="cuda") for _ in range(3)]
        res.measure("launch_torch_us", launch_us, lambda: launcher(*tensors, 128),
                    torch.cuda.synchronize, sizes)
        res.measure("raw_floor_torch_us", lambda: launch_us(
            raw_launch(pk.get_device(), pk_add.name, (*small, 128)), pk.synchronize, sizes))
        torch_rows(res, torch, sizes, tensors)
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--peer", choices=PEERS, help=argparse.SUPPRESS)
    parser.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="comma-separated subset of " + ", ".join(PEERS))
    args = parser.parse_args()
    sizes = Sizes(args.small)
    if args.peer:
        from benchmarks import dsl_peers_kernels as others
        run = {"pykernel": run_pykernel, "numba-cuda": others.run_numba,
               "triton": others.run_triton, "cuda.core": others.run_cuda_core}[args.peer]
        print("RESULT " + json.dumps(run(sizes, args.first_only)))
        return
    for package in ("pykernel", "stdlib_kernels", "benchmarks"):
        compileall.compile_dir(os.path.join(os.path.dirname(HERE), package), quiet=1)
    columns = {}
    for peer in args.peers.split(","):
        with tempfile.TemporaryDirectory(prefix="dsl_peers_") as cache:
            columns[peer] = _peer_process(peer, cache, args.small, False)
            columns[peer].update(_peer_process(peer, cache, args.small, True))
    print_table(columns)


def _peer_process(peer: str, cache: str, small: bool, first_only: bool) -> dict:
    """One peer in a fresh process whose caches live in `cache` (empty on the first call)."""
    env = dict(os.environ, PYKERNEL_CACHE_DIR=os.path.join(cache, "pykernel"),
               TRITON_CACHE_DIR=os.path.join(cache, "triton"),
               NUMBA_CACHE_DIR=os.path.join(cache, "numba"), CUDA_CACHE_DISABLE="1",
               PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, os.path.abspath(__file__), "--peer", peer] + \
        ["--small"] * small + ["--first-only"] * first_only
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=PEER_TIMEOUT_S, cwd=os.path.dirname(HERE))
    except subprocess.TimeoutExpired:
        print(f"{peer}: timed out after {PEER_TIMEOUT_S} s", file=sys.stderr)
        return {}
    sys.stderr.write("".join(f"{peer}: {line}\n" for line in done.stderr.splitlines()[-8:]))
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {}


def print_table(columns: dict):
    peers = list(columns)
    print("| measure | " + " | ".join(peers) + " |")
    print("|---|" + "---|" * len(peers))
    for key, label in ROWS:
        cells = [columns[p].get(key) for p in peers]
        if all(c is None for c in cells):
            continue
        text = ["-" if c is None else f"{c:.1f}" if c >= 10 else f"{c:.2f}" for c in cells]
        print(f"| {label} | " + " | ".join(text) + " |")


if __name__ == "__main__":
    main()
