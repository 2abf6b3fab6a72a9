"""Core kernels (issue 4) on the GPU: achieved bandwidth as a fraction of the measured copy
bandwidth at hidden 576/2048/4096/8192 and batch 1 / 512, microseconds per kernel at batch 1,
and sampling latency at real vocabulary sizes.

Input: none (needs a GPU; `--quick` runs fewer shapes). Output: a markdown table on stdout.
Method: each case rotates over enough buffer sets to exceed 200 MB (> the 50 MB L2), so the
batch-512 figures are HBM figures; R launches are captured in a CUDA graph and the replay is
timed with events, so the time per kernel excludes Python launch overhead (reported apart as
"host us": one plain launch, back to back, which bounds a non-graph decode loop). The "pdl"
columns time the same launches captured with `pk.capture_graph(stream, pdl=True)`
(programmatic dependent launch: each kernel launches while its predecessor drains).
Bytes counted: every input read once and every output written once. "copy f32" is a plain
read-and-write kernel (convert to the same dtype): the ceiling for a kernel moving 2 arrays.

Steady-state streaming: rmsnorm, softmax, layernorm and copy at 4096 x 8192 and 8192 x 4096
f32 (the issue's numba anchor shape, 128 MB per array: one buffer set, never in L2).

    python3 benchmarks/core_kernels.py [--quick] [--no-sampling] [--configs SWEEP.json]
                                       [--kernels NAME,NAME,...]

`--configs` first applies the settings saved by `core_sweep.py --save` (instead of the
modules' defaults); `--kernels` times only the named rows of the main table.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
import stdlib_kernels as sk  # noqa: E402

ROTATE_BYTES = 200 << 20
LAUNCHES = 200
HIDDEN = (576, 2048, 4096, 8192)
BATCHES = (1, 512)


def copy_bandwidth() -> float:
    """bytes/s of a device-to-device memcpy of 1 GiB (read + write counted)."""
    n = 1 << 28
    a, b = pk.empty(n, np.float32), pk.empty(n, np.float32)
    memory = pk.current_device().memory
    memory.copy(b.ptr, a.ptr, a.nbytes)
    start, end = pk.Event(), pk.Event()
    start.record()
    for _ in range(10):
        memory.copy(b.ptr, a.ptr, a.nbytes)
    end.record()
    end.synchronize()
    return 2 * a.nbytes * 10 / (start.elapsed_ms(end) * 1e-3)


def memcpy_seconds(nbytes: int) -> float:
    """Seconds per device-to-device memcpy moving `nbytes` (half read, half written), 100
    back to back over rotated buffers (> L2), timed with events."""
    half = nbytes // 2
    sets = max(2, ROTATE_BYTES // nbytes)
    bufs = [(pk.empty(half, np.uint8), pk.empty(half, np.uint8)) for _ in range(sets)]
    memory = pk.current_device().memory
    for a, b in bufs:
        memory.copy(b.ptr, a.ptr, half)
    start, end = pk.Event(), pk.Event()
    start.record()
    for i in range(100):
        a, b = bufs[i % sets]
        memory.copy(b.ptr, a.ptr, half)
    end.record()
    end.synchronize()
    return start.elapsed_ms(end) * 1e-3 / 100


def time_graph(calls, pdl: bool = False) -> float:
    """Seconds per call: LAUNCHES calls (cycling over `calls`) captured and replayed."""
    def record():
        for i in range(LAUNCHES):
            calls[i % len(calls)]()
    return replay_seconds(record, 5, pdl) / LAUNCHES


def time_host(call) -> float:
    for _ in range(20):
        call()
    pk.synchronize()
    t = time.perf_counter()
    for _ in range(200):
        call()
    pk.synchronize()
    return (time.perf_counter() - t) / 200


def cases(batch: int, hidden: int, rng):
    """(name, make(set) -> call, bytes moved per call) per kernel."""
    shape = (batch, hidden)
    host = rng.standard_normal(shape).astype(np.float32)   # one host array, fresh device copies
    f32 = lambda: pk.to_device(host)  # noqa: E731
    w = pk.to_device(rng.standard_normal(hidden).astype(np.float32))
    row = batch * hidden * 4

    def rms():
        x, o = f32(), f32()
        return lambda: sk.rmsnorm(x, w, 1e-6, out=o)

    def rms_res():
        x, r, o = f32(), f32(), f32()
        return lambda: sk.rmsnorm(x, w, 1e-6, residual=r, out=o, sum_out=r)

    def soft():
        x, o = f32(), f32()
        return lambda: sk.softmax(x, 0.125, out=o)

    def swiglu():
        g, u, o = f32(), f32(), f32()
        return lambda: sk.silu_mul(g, u, out=o)

    def add():
        a, b, o = f32(), f32(), f32()
        return lambda: sk.add(a, b, out=o)

    def to_f16():
        a, o = f32(), pk.empty(shape, np.float16)
        return lambda: sk.convert(a, np.float16, out=o)

    def layer():
        x, o = f32(), f32()
        return lambda: sk.layernorm(x, w, w, 1e-5, out=o)

    def copy():
        a, o = f32(), f32()
        return lambda: sk.convert(a, np.float32, out=o)

    return [("rmsnorm", rms, 2 * row + hidden * 4),
            ("rmsnorm+residual", rms_res, 4 * row + hidden * 4),
            ("layernorm", layer, 2 * row + 2 * hidden * 4),
            ("softmax", soft, 2 * row), ("silu_mul", swiglu, 3 * row),
            ("add", add, 3 * row), ("convert f32->f16", to_f16, row + row // 2),
            ("copy f32", copy, 2 * row)]


SAMPLERS = [("argmax", dict(temperature=0.0)), ("sample t=0.8", dict(temperature=0.8)),
            ("sample k40 p0.95 minp0.05", dict(temperature=0.8, top_k=40, top_p=0.95,
                                                min_p=0.05)),
            ("sample k40", dict(temperature=0.8, top_k=40)),
            ("sample minp0.05", dict(temperature=0.8, min_p=0.05)),
            ("sample p0.95 alone (exact fallback)", dict(temperature=0.8, top_p=0.95))]


def check_samplers(host, logits, u, tok) -> None:
    """Sanity on the device before timing: greedy and top_k=1 equal numpy's argmax, and a
    filtered draw lands in the top 40."""
    best = int(np.argmax(host))
    got = [int(sk.argmax(logits).numpy()[0]), int(sk.sample(logits, u, top_k=1).numpy()[0])]
    top40 = set(np.argsort(-host)[:40].tolist())
    drawn = int(sk.sample(logits, u, temperature=0.8, top_k=40, top_p=0.95,
                          min_p=0.05).numpy()[0])
    if got != [best, best] or drawn not in top40:
        sys.exit(f"core_kernels: sampler mismatch at vocab {host.size}: {got} vs {best}, "
                 f"draw {drawn}")


def sampling_rows(rng):
    rows = []
    for vocab in (32000, 151936, 262144):
        host = (rng.standard_normal(vocab) * 3).astype(np.float32)
        logits = pk.to_device(host)
        u, tok = pk.to_device(np.array([0.37], np.float32)), pk.empty(1, np.int32)
        check_samplers(host, logits, u, tok)
        for label, kw in SAMPLERS:
            call = lambda kw=kw: sk.sample(logits, u, out=tok, **kw)  # noqa: E731
            rows.append((label, vocab, time_graph([call]) * 1e6, time_host(call) * 1e6))
    return rows


ANCHOR_SHAPES = ((4096, 8192), (8192, 4096))
ANCHOR_KERNELS = ("rmsnorm", "softmax", "layernorm", "copy f32")


def time_case(batch: int, hidden: int, name: str, rng) -> tuple[float, float, int]:
    """(plain graph seconds, pdl graph seconds, bytes) of kernel `name` at batch x hidden."""
    _, make, nbytes = {c[0]: c for c in cases(batch, hidden, rng)}[name]
    calls = [make() for _ in range(max(1, min(64, ROTATE_BYTES // nbytes)))]
    return time_graph(calls), time_graph(calls, pdl=True), nbytes


def anchor_table(rng, copy_bw: float) -> None:
    """Large shapes, where a kernel's fixed start/drain cost is amortized over many waves."""
    print("\n| kernel | rows x hidden | us/kernel (graph) | % of copy | us (pdl graph) "
          "| % of copy (pdl) |\n|---|---|---|---|---|---|")
    for rows, hidden in ANCHOR_SHAPES:
        for name in ANCHOR_KERNELS:
            plain, pdl, nbytes = time_case(rows, hidden, name, rng)
            print(f"| {name} | {rows} x {hidden} | {plain * 1e6:.2f} | "
                  f"{100 * nbytes / plain / copy_bw:.0f}% | {pdl * 1e6:.2f} | "
                  f"{100 * nbytes / pdl / copy_bw:.0f}% |", flush=True)


def main() -> None:
    if not pk.gpu_available():
        sys.exit("core_kernels: no usable CUDA GPU")
    pk.set_device("cuda")
    if "--configs" in sys.argv:
        from core_sweep import apply_saved
        apply_saved(sys.argv[sys.argv.index("--configs") + 1])
    rng = np.random.default_rng(0)
    copy_bw = copy_bandwidth()
    dev = pk.current_device()
    print(f"device: {dev}; memcpy D2D bandwidth {copy_bw / 1e12:.2f} TB/s")
    for h in HIDDEN[1:]:   # the same bytes as a 2-array kernel at batch 512 (not in a graph)
        nbytes = 2 * 512 * h * 4
        t = memcpy_seconds(nbytes)
        print(f"memcpy moving {nbytes >> 20} MB (512 x {h} f32 read + written): "
              f"{t * 1e6:.2f} us, {100 * nbytes / t / copy_bw:.0f}% of copy")
    print()
    print("| kernel | hidden | batch | us/kernel (graph) | host us/launch | GB/s | % of copy "
          "| us (pdl graph) | % of copy (pdl) |")
    print("|---|---|---|---|---|---|---|---|---|")
    hidden = HIDDEN[:2] if "--quick" in sys.argv else HIDDEN
    names = [c[0] for c in cases(1, 64, rng)]
    if "--kernels" in sys.argv:
        names = sys.argv[sys.argv.index("--kernels") + 1].split(",")
    for name in names:
        for h in hidden:
            for batch in BATCHES:
                _, make, nbytes = {c[0]: c for c in cases(batch, h, rng)}[name]
                sets = max(1, min(64, ROTATE_BYTES // nbytes))
                calls = [make() for _ in range(sets)]
                seconds, pdl = time_graph(calls), time_graph(calls, pdl=True)
                host = time_host(calls[0]) * 1e6 if batch == 1 else float("nan")
                bw = nbytes / seconds
                print(f"| {name} | {h} | {batch} | {seconds * 1e6:.2f} | {host:.1f} | "
                      f"{bw / 1e9:.0f} | {100 * bw / copy_bw:.0f}% | {pdl * 1e6:.2f} | "
                      f"{100 * nbytes / pdl / copy_bw:.0f}% |", flush=True)
    anchor_table(rng, copy_bw)
    if "--no-sampling" in sys.argv:
        return
    print("\n| sampler | vocab | us/kernel (graph) | host us/launch |\n|---|---|---|---|")
    for label, vocab, g, hst in sampling_rows(rng):
        print(f"| {label} | {vocab} | {g:.1f} | {hst:.1f} |", flush=True)


if __name__ == "__main__":
    main()
