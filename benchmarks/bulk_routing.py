"""Decode speed of the runner under other bulk-copy GEMV routings (stdlib_kernels/quant/
gemv_bulk.py's defaults), one `pykernel bench` per routing in this process's children, rounds
alternating. Routings are comma lists of overrides:

    python3 benchmarks/bulk_routing.py FILE [FILE ...] --routings default q4k_all,q6k_all
        [--rounds 2] [--bench "-p 16 -n 128 -r 3"]

Overrides: default (none), q4k_all (Q4_K at every size in rows up to Q4K_MAX_N), q4k_split
(Q4_K rows over 8192 values too, split over 4 warps), q6k_all (Q6_K at every size), q5k_all,
q8_0_off (Q8_0 on its register kernel), q8_0_whole (Q8_0 long rows unsplit), q4_0_off (Q4_0
on its register kernel), q4_0_all (at every size, whole rows), q4_0_split (at every size,
rows over 8192 values split over 4 warps; Q4_0's default is that from 16 MB), q4_1_16mb (Q4_1
from 16 MB, long rows split), q4_1_all (at every size, split).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OVERRIDES = {
    "default": "",
    "q4k_all": "g.Q4K_MIN_BYTES = 0",
    "q4k_split": "g.Q4K_MIN_BYTES = 0; g.LONG_SPLIT['Q4_K'] = (4, 4)",
    "q6k_all": "g.Q6K_MIN_BYTES = 0",
    "q5k_all": "g.Q5K_MIN_BYTES = 0",
    "q8_0_off": "g.BULK_FROM_BYTES['Q8_0'] = None",
    "q8_0_whole": "g.LONG_SPLIT.pop('Q8_0', None)",
    "q4_0_off": "g.BULK_FROM_BYTES['Q4_0'] = None",
    "q4_0_all": "g.BULK_FROM_BYTES['Q4_0'] = 0; g.LONG_SPLIT.pop('Q4_0', None)",
    "q4_0_split": "g.BULK_FROM_BYTES['Q4_0'] = 0",
    "q4_1_16mb": "g.BULK_FROM_BYTES['Q4_1'] = 16 << 20",
    "q4_1_all": "g.BULK_FROM_BYTES['Q4_1'] = 0",
}


def run(path: str, routing: str, bench: str) -> str:
    prog = "; ".join(["import sys", "import stdlib_kernels.quant.gemv_bulk as g"] +
                     [OVERRIDES[name] for name in routing.split(",") if OVERRIDES[name]] +
                     ["from pykernel.cli import main", "sys.exit(main())"])
    done = subprocess.run([sys.executable, "-c", prog, "bench", path, *bench.split()],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench under {routing} failed:\n{done.stderr[-2000:]}")
    out = done.stdout
    return "\n".join(line for line in out.splitlines() if "| pp" in line or "| tg" in line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--routings", nargs="+", default=["default"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bench", default="-p 16 -n 128 -r 3")
    args = parser.parse_args()
    for name in (n for r in args.routings for n in r.split(",")):
        if name not in OVERRIDES:
            parser.error(f"unknown override {name!r}; known: {', '.join(OVERRIDES)}")
    for path in args.files:
        for rnd in range(args.rounds):
            for routing in args.routings:
                for line in run(path, routing, args.bench).splitlines():
                    print(f"round {rnd} | {routing} {line}", flush=True)


if __name__ == "__main__":
    main()
