"""Does an L2 fetch-size hint (`pk.load_vec(..., l2_fetch=N)`, PTX `ld.global.nc.L2::256B`)
make a stream from HBM faster? read_floor.py's bare read at each hint, same harness as every
decode table (CUDA events around graph replays, each launch reading its own copy out of
>= 256 MB), plain graph / PDL graph. (The 2026-11-26 run also timed the tensor-core decode with
its K/V loads hinted, through a hook since removed: benchmarks/RESULTS.md.)

    python3 benchmarks/l2_fetch.py [--sizes 16777216,134217728]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FETCHES = (0, 64, 128, 256)
GEOMETRIES = ((256, 4, 8), (256, 8, 4), (256, 1, 8))   # threads x blocks/SM x loads


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16777216,134217728")
    args = parser.parse_args()
    import pykernel as pk
    from benchmarks.attention import copy_bandwidth
    from benchmarks.read_floor import buffers, read_us
    pk.set_device("cuda")
    print(f"device: {pk.current_device().name}, torch copy {copy_bandwidth() / 1e12:.2f} TB/s")
    print("| bytes | threads x blocks/SM x loads | " +
          " | ".join(f"l2_fetch {f}: us plain / PDL" for f in FETCHES) + " |")
    for nbytes in (int(x) for x in args.sizes.split(",") if x):
        bufs = buffers(nbytes)
        for geometry in GEOMETRIES:
            cells = [f"{read_us(bufs, geometry, 0, False, f):.2f} / "
                     f"{read_us(bufs, geometry, 0, True, f):.2f}" for f in FETCHES]
            print(f"| {nbytes / 1e6:.1f} MB | {' x '.join(map(str, geometry))} | " +
                  " | ".join(cells) + " |", flush=True)
        del bufs


if __name__ == "__main__":
    main()
