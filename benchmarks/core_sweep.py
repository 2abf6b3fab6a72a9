"""Geometry sweep for the core kernels at batch 512 (GPU): the settings that choose the defaults,
timed the same way as benchmarks/core_kernels.py (CUDA graph of 200 launches over rotated
buffers larger than L2; plain graph, no PDL).

Input: none (needs a GPU). Output: markdown tables on stdout and, last, the fastest setting per
(kernel, hidden) as Python literals.
Register-row kernels (rmsnorm, rmsnorm+residual, layernorm, softmax), `_rows.RowConfig`, one
row per block (several rows per block measured slower on the H200: RESULTS.md): at 2048 and
4096, stage A tries 2 / 4 / 8 units per thread, stage B adds to stage A's fastest one-wave
launch bounds ("b"), the weight loaded with x ("w", norms only), or both; at 8192 every
combination of 2 / 4 / 8 / 16 units with those flags. Conversion f32 -> f16: 8-element units
(1 / 2 / 4 per thread) against the 4-element binary kernel (elementwise.CONVERT8_UNITS = 0).
`--save PATH` writes the fastest settings as JSON, which `core_kernels.py --configs PATH`
applies.
`--reductions` instead times, at 512 x 2048/4096/8192 and 4096 x 8192, 8192 x 4096, each
default setting with one-pass vs two-reduction softmax/layernorm ("1p"/"2p"), with and without
launch bounds, and with and without `launch_dependents` at entry ("t", only where the grid is
one wave), in a plain and a PDL graph; rmsnorm with and without "t".

    python3 benchmarks/core_sweep.py [--save PATH | --reductions]
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import core_kernels as ck  # noqa: E402

import pykernel as pk  # noqa: E402
from stdlib_kernels import elementwise, norm, row_softmax  # noqa: E402
from stdlib_kernels._rows import RowConfig, config_for, row_geometry  # noqa: E402

ROW_TABLES = {"rmsnorm": (norm, "RMSNORM"), "rmsnorm+residual": (norm, "RMSNORM_RESIDUAL"),
              "layernorm": (norm, "LAYERNORM"), "softmax": (row_softmax, "SOFTMAX")}
HIDDEN = (2048, 4096, 8192)
ALL_N = 1 << 30


def label(c: RowConfig) -> str:
    return f"u{c.chunks} r{c.rows_per_block}" + ("b" if c.bounded else "") + \
        ("w" if c.weight_early else "") + (" 1p" if c.one_pass else " 2p") + \
        (" t" if c.trigger else "")


def calls_for(name: str, hidden: int, rng, rows: int = 512):
    _, make, nbytes = {c[0]: c for c in ck.cases(rows, hidden, rng)}[name]
    return [make() for _ in range(max(1, min(64, ck.ROTATE_BYTES // nbytes)))], nbytes


def time_config(module, attr: str, config: RowConfig, calls, pdl: bool = False) -> float:
    """Seconds per kernel with `config` for every row length (inf: it did not launch)."""
    saved = getattr(module, attr)
    setattr(module, attr, ((ALL_N, config),))
    try:
        return ck.time_graph(calls, pdl=pdl)
    except pk.LaunchError as err:   # e.g. a block larger than its registers allow
        print(f"<!-- {config}: {err} -->")
        return float("inf")
    finally:
        setattr(module, attr, saved)


def flag_variants(config: RowConfig, weight: bool) -> list[RowConfig]:
    flags = [(True, False)] + ([(False, True), (True, True)] if weight else [])
    return [config._replace(bounded=b, weight_early=w) for b, w in flags]


def sweep_row_kernel(name: str, hidden: int, rng, copy_bw: float) -> RowConfig:
    module, attr = ROW_TABLES[name]
    calls, nbytes = calls_for(name, hidden, rng)
    weight = module is norm
    if hidden >= 8192:
        configs = [v for u in (2, 4, 8, 16) for v in [RowConfig(u)] + flag_variants(
            RowConfig(u), weight)]
        times = {c: time_config(module, attr, c, calls) for c in configs}
    else:
        times = {RowConfig(u): time_config(module, attr, RowConfig(u), calls)
                 for u in (2, 4, 8)}
        best = min(times, key=times.get)
        times.update({c: time_config(module, attr, c, calls)
                      for c in flag_variants(best, weight)})
    best = min(times, key=times.get)
    cells = " ".join(f"{label(c)} {t * 1e6:.2f};" for c, t in times.items())
    pct = 100 * nbytes / times[best] / copy_bw
    print(f"| {name} | {hidden} | {cells} | **{label(best)}** {times[best] * 1e6:.2f} us, "
          f"{pct:.0f}% |", flush=True)
    return best


def sweep_convert(hidden: int, rng, copy_bw: float) -> int:
    """Times each CONVERT8_UNITS setting; returns the fastest."""
    calls, nbytes = calls_for("convert f32->f16", hidden, rng)
    saved = elementwise.CONVERT8_UNITS
    times = {}
    for units in (0, 1, 2, 4):
        elementwise.CONVERT8_UNITS = units
        times[units] = ck.time_graph(calls)
    elementwise.CONVERT8_UNITS = saved
    cells = [f"{t * 1e6:.2f} us, {100 * nbytes / t / copy_bw:.0f}%" for t in times.values()]
    print(f"| convert f32->f16 | {hidden} | " + " | ".join(cells) + " |", flush=True)
    return min(times, key=times.get)


def weight_cost(hidden: int, config: RowConfig, rng, copy_bw: float) -> None:
    """rmsnorm with and without its weight (same config): what reading the weight (from L2,
    once per row) costs."""
    import stdlib_kernels as sk
    host = rng.standard_normal((512, hidden)).astype(np.float32)
    w = pk.to_device(rng.standard_normal(hidden).astype(np.float32))
    nbytes = 2 * host.nbytes
    sets = [(pk.to_device(host), pk.to_device(host))
            for _ in range(max(1, min(64, ck.ROTATE_BYTES // nbytes)))]
    cells = []
    for weight in (w, None):
        calls = [lambda x=x, o=o, weight=weight: sk.rmsnorm(x, weight, 1e-6, out=o)
                 for x, o in sets]
        t = time_config(norm, "RMSNORM", config, calls)
        cells.append(f"{t * 1e6:.2f} us, {100 * nbytes / t / copy_bw:.0f}%")
    print(f"| {hidden} | {label(config)} | " + " | ".join(cells) + " |", flush=True)


REDUCTION_SHAPES = ((512, 2048), (512, 4096), (512, 8192), (4096, 8192), (8192, 4096))


def reduction_variants(base: RowConfig, rows: int, hidden: int, passes: bool):
    """`base` with one/two reductions (when `passes`), launch bounds off/on and the entry
    trigger off/on, one config per distinct (reductions, bounds, effective trigger)."""
    seen, variants = set(), []
    for one_pass in (False, True) if passes else (base.one_pass,):
        for bounded in dict.fromkeys((base.bounded, True)):
            for trigger in (False, True):
                config = base._replace(one_pass=one_pass, bounded=bounded, trigger=trigger)
                geo = row_geometry(rows, hidden, config)
                key = (one_pass, geo.bounds, geo.trigger)
                if key not in seen:
                    seen.add(key)
                    variants.append(config._replace(trigger=geo.trigger))
    return variants


def sweep_reductions(rng, copy_bw: float) -> None:
    print("| kernel | rows x hidden | setting | us (graph) | % of copy | us (pdl graph) | "
          "% of copy (pdl) |\n|---|---|---|---|---|---|---|")
    for name in ("softmax", "layernorm", "rmsnorm"):
        module, attr = ROW_TABLES[name]
        for rows, hidden in REDUCTION_SHAPES:
            calls, nbytes = calls_for(name, hidden, rng, rows)
            base = config_for(getattr(module, attr), hidden)
            for config in reduction_variants(base, rows, hidden, name != "rmsnorm"):
                plain = time_config(module, attr, config, calls)
                pdl = time_config(module, attr, config, calls, pdl=True)
                print(f"| {name} | {rows} x {hidden} | {label(config)} | {plain * 1e6:.2f} | "
                      f"{100 * nbytes / plain / copy_bw:.0f}% | {pdl * 1e6:.2f} | "
                      f"{100 * nbytes / pdl / copy_bw:.0f}% |", flush=True)
            del calls


def main() -> None:
    pk.set_device("cuda")
    rng = np.random.default_rng(0)
    copy_bw = ck.copy_bandwidth()
    print(f"device: {pk.current_device()}; copy {copy_bw / 1e12:.2f} TB/s\n")
    if "--reductions" in sys.argv:
        sweep_reductions(rng, copy_bw)
        return
    print("| kernel | hidden | us per setting (u units/thread, r rows/block, b bounds, w weight "
          "early) | fastest |\n|---|---|---|---|")
    best = {(name, h): sweep_row_kernel(name, h, rng, copy_bw)
            for name in ROW_TABLES for h in HIDDEN}
    print("\n| kernel | hidden | 4-element units (binary_rows) | 8-element x1 | x2 | x4 |\n"
          "|---|---|---|---|---|---|")
    convert = {h: sweep_convert(h, rng, copy_bw) for h in HIDDEN}
    print("\n| hidden | setting | rmsnorm | rmsnorm, no weight |\n|---|---|---|---|")
    for h in HIDDEN:
        weight_cost(h, best["rmsnorm", h], rng, copy_bw)
    print("\nfastest:")
    for key, config in best.items():
        print(f"{key!r}: {config!r}")
    print(f"convert: {convert}")
    if "--save" in sys.argv:
        rows = {name: {h: list(best[name, h]) for h in HIDDEN} for name in ROW_TABLES}
        with open(sys.argv[sys.argv.index("--save") + 1], "w") as f:
            json.dump({"rows": rows, "convert8_units": convert}, f, indent=1)


def apply_saved(path: str) -> None:
    """Set the module defaults to the settings a `--save` run found fastest: each hidden size
    up to and including it (the largest also above)."""
    with open(path) as f:
        saved = json.load(f)
    for name, per_hidden in saved["rows"].items():
        module, attr = ROW_TABLES[name]
        sizes = sorted(per_hidden, key=int)
        table = [(int(h), RowConfig(*per_hidden[h])) for h in sizes]
        table[-1] = (ALL_N, table[-1][1])
        setattr(module, attr, tuple(table))
    units = saved["convert8_units"]
    elementwise.CONVERT8_UNITS = units[max(units, key=int)]


if __name__ == "__main__":
    main()
