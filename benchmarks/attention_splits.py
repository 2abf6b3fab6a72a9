"""Decode attention at the runner's model shapes against the number of splits: which split
count is fastest at which context length (the runner's decode graph picks its splits once per
graph, so this decides how many graphs it keeps and when it switches).

Shapes: SmolLM2-135M (9 q / 3 KV heads, head_dim 64), Qwen2-1.5B (12 / 2, 128), 8B class
(32 / 8, 128); f16 cache, the runner's kernel configuration (`default_config`). Timing as
benchmarks/attention.py: CUDA events around graph replays, each launch reading its own cache
copy out of >= 256 MB; "PDL" = captured with programmatic dependent launch and `early_kv`, as
the runner's decode graph launches it. us per decode (split kernel + combine).

    python3 benchmarks/attention_splits.py [--lens 256,600,1024,2048,4096] [--out FILE]
    python3 benchmarks/attention_splits.py --batched    (1-8 sequences x 4096 keys, one launch)
    python3 benchmarks/attention_splits.py --cluster    (8B shape: the split + combine default
        against one launch whose splits merge in a thread-block cluster, 8 and 16 splits)
    python3 benchmarks/attention_splits.py --cluster-sweep   (8B shape, 4096 / 32768 keys:
        cluster merges with fewer heads per block or warps per block, CLUSTER_SWEEP)
    python3 benchmarks/attention_splits.py --bulk   (8B shape: decode_bulk, K/V by bulk copies
        into shared memory, in BULK_SWEEP's shapes against the default)
    python3 benchmarks/attention_splits.py --hot   (8B shape: the default reading one cache,
        L2-resident up to ~4096 keys, as llama.cpp's test-backend-ops perf times FLASH_ATTN_EXT)
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from stdlib_kernels.attention.decode import (DecodeWorkspace, KeyRange,  # noqa: E402
                                             launch_decode, launch_split_kernel)
from stdlib_kernels.attention.decode_plan import (bulk_config, config_splits,  # noqa: E402
                                                  default_config, mma_config)

SHAPES = {"smollm2-135m": (9, 3, 64), "qwen2-1.5b": (12, 2, 128), "llama-8b": (32, 8, 128)}
SPLITS = (1, 2, 4, 8, 16, 32, 64)


def caches(*shape: int) -> list:
    """(K, V) f16 caches of `shape`, copied until the copies hold >= 256 MB (L2 cannot)."""
    rng = np.random.default_rng(0)
    first = [pk.to_device(rng.standard_normal(shape).astype(np.float16)) for _ in range(2)]
    nbytes = 2 * first[0].nbytes
    copies = max(2, -(-(256 << 20) // nbytes))
    out = [tuple(first)]
    for _ in range(copies - 1):
        out.append(tuple(pk.empty(c.shape, c.dtype).copy_from(c) for c in first))
    return out


def decode_us(shape, kv_len: int, splits: int, pdl: bool, cache_copies, n_seq: int = 1,
              cluster: bool = False, config=None, fused: bool = False,
              split_only: bool = False) -> float:
    """us per decode launch of n_seq sequences of kv_len keys (caches from `caches`);
    cluster: the splits merge in a thread-block cluster (one launch); fused: the last split
    block combines (one launch); config: the kernel's (default_config when None);
    split_only: the split kernel alone, without the combine launch."""
    n_head, n_kv, head_dim = shape
    config = config or default_config(n_head // n_kv, head_dim, dtype=np.float16)
    q = pk.to_device(np.random.default_rng(1).standard_normal((n_seq, n_head, head_dim))
                     .astype(np.float32))
    lens = pk.to_device(np.full(n_seq, kv_len, np.int32))
    out = pk.empty((n_seq, n_head, head_dim), np.float32)
    ws = DecodeWorkspace.allocate(n_seq, n_head, head_dim, splits, cluster=cluster,
                                  fused=fused) if splits > 1 else None
    launches = max(len(cache_copies), 20)
    launch = launch_split_kernel if split_only else launch_decode

    def record():
        for i in range(launches):
            k, v = cache_copies[i % len(cache_copies)]
            launch(q, k, v, KeyRange(lens), out, head_dim ** -0.5, workspace=ws, config=config,
                   early_kv=pdl)
    return replay_seconds(record, pdl=pdl) * 1e6 / launches


def table(lens) -> list[str]:
    rows = ["| model shape | kv_len | runner's splits (n_ctx = kv_len) | " +
            " | ".join(f"{s} splits plain / PDL" for s in SPLITS) + " |",
            "|---" * (3 + len(SPLITS)) + "|"]
    for name, shape in SHAPES.items():
        n_head, n_kv, head_dim = shape
        config = default_config(n_head // n_kv, head_dim, dtype=np.float16)
        for kv_len in lens:
            copies = caches(n_kv, kv_len, head_dim)
            cells = []
            for splits in SPLITS:
                plain = decode_us(shape, kv_len, splits, False, copies)
                pdl = decode_us(shape, kv_len, splits, True, copies)
                cells.append(f"{plain:.2f} / {pdl:.2f}")
            planned = config_splits(config, n_head, n_kv, kv_len)
            rows.append(f"| {name} | {kv_len} | {planned} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    return rows


def batched_us(n_seq: int, kv_len: int, pdl: bool) -> tuple[float, int]:
    """8B-class decode of n_seq sequences of kv_len keys each in one launch (the batched
    decode: caches (n_seq, 8, kv_len, 128) f16), splits planned per launch (the single-sequence
    plan divided by n_seq); us per launch and K/V bytes read."""
    shape = SHAPES["llama-8b"]
    n_head, n_kv, head_dim = shape
    config = default_config(n_head // n_kv, head_dim, dtype=np.float16)
    splits = max(1, config_splits(config, n_head, n_kv, kv_len) // n_seq)
    copies = caches(n_seq, n_kv, kv_len, head_dim)
    return decode_us(shape, kv_len, splits, pdl, copies, n_seq), 2 * copies[0][0].nbytes


def batched_table(kv_len: int = 4096) -> list[str]:
    from benchmarks.attention import copy_bandwidth
    copy = copy_bandwidth()
    rows = [f"torch copy bandwidth {copy / 1e12:.2f} TB/s", "",
            "| sequences x keys | K/V MB | plain us | PDL us | % of copy (plain / PDL) |",
            "|---|---|---|---|---|"]
    for n_seq in (1, 2, 4, 8):
        plain, nbytes = batched_us(n_seq, kv_len, False)
        pdl, _ = batched_us(n_seq, kv_len, True)
        pct = [100 * nbytes / (us * 1e-6) / copy for us in (plain, pdl)]
        rows.append(f"| {n_seq} x {kv_len} | {nbytes / 1e6:.1f} | {plain:.2f} | {pdl:.2f} | "
                    f"{pct[0]:.0f}% / {pct[1]:.0f}% |")
        print(rows[-1], flush=True)
    return rows


def eight_b_setup() -> tuple:
    """(copy bandwidth in B/s, the 8B shape, its default decode configuration)."""
    from benchmarks.attention import copy_bandwidth
    shape = SHAPES["llama-8b"]
    return (copy_bandwidth(), shape,
            default_config(shape[0] // shape[1], shape[2], dtype=np.float16))


def cluster_table(lens=(128, 1024, 4096, 32768)) -> list[str]:
    copy, shape, config = eight_b_setup()
    n_head, n_kv, head_dim = shape
    rows = [f"torch copy bandwidth {copy / 1e12:.2f} TB/s", "",
            "| kv_len | K/V MB | default: splits, us plain / PDL | cluster 8: us plain / PDL | "
            "cluster 16: us plain / PDL | best % of copy (plain / PDL) |", "|---" * 6 + "|"]
    for kv_len in lens:
        copies = caches(n_kv, kv_len, head_dim)
        nbytes = 2 * copies[0][0].nbytes
        planned = config_splits(config, n_head, n_kv, kv_len)
        cells = [(decode_us(shape, kv_len, planned, False, copies),
                  decode_us(shape, kv_len, planned, True, copies))]
        for splits in (8, 16):
            try:
                cells.append((decode_us(shape, kv_len, splits, False, copies, cluster=True),
                              decode_us(shape, kv_len, splits, True, copies, cluster=True)))
            except pk.LaunchError as exc:      # e.g. 16-block clusters of this kernel
                print(f"cluster {splits} at {kv_len}: {exc}", flush=True)
                cells.append((float("inf"), float("inf")))
        best = [min(c[k] for c in cells) for k in (0, 1)]
        pct = [100 * nbytes / (us * 1e-6) / copy for us in best]
        rows.append(f"| {kv_len} | {nbytes / 1e6:.1f} | {planned}: {cells[0][0]:.2f} / "
                    f"{cells[0][1]:.2f} | {cells[1][0]:.2f} / {cells[1][1]:.2f} | "
                    f"{cells[2][0]:.2f} / {cells[2][1]:.2f} | {pct[0]:.0f}% / {pct[1]:.0f}% |")
        print(rows[-1], flush=True)
    return rows


# (heads per block, warps, ring stages, blocks per cluster): cluster merges that keep more
# multiprocessors busy than the 8-split default cluster (fewer heads per block: more blocks;
# 4 warps: two blocks per multiprocessor, so 16-block clusters fit in 8 of them)
CLUSTER_SWEEP = [(4, 8, 2, 8), (2, 8, 2, 8), (2, 4, 2, 8), (1, 4, 2, 8), (4, 4, 2, 8),
                 (4, 4, 2, 16), (2, 4, 2, 16), (2, 4, 1, 16), (1, 4, 1, 16)]


def cluster_sweep_table(lens=(4096, 32768)) -> list[str]:
    """The cluster merge in CLUSTER_SWEEP's shapes against the default, 8B shape."""
    copy, shape, default = eight_b_setup()
    n_head, n_kv, head_dim = shape
    rows = [f"torch copy bandwidth {copy / 1e12:.2f} TB/s", "",
            "| kv_len | kernel | blocks | us plain / PDL | % of copy (plain / PDL) |",
            "|---" * 5 + "|"]
    for kv_len in lens:
        copies = caches(n_kv, kv_len, head_dim)
        nbytes = 2 * copies[0][0].nbytes
        planned = config_splits(default, n_head, n_kv, kv_len)
        runs = [(f"default, {planned} splits + combine", default, planned, False)]
        for gb, warps, stages, splits in CLUSTER_SWEEP:
            config = mma_config(n_head // n_kv, head_dim, warps=warps, stages=stages)
            config = dataclasses.replace(config, heads_per_block=gb)
            runs.append((f"cluster {splits}: {gb} heads, {warps} warps, ring {stages}", config,
                         splits, True))
        for label, config, splits, cluster in runs:
            blocks = splits * n_head // config.heads_per_block
            try:
                us = [decode_us(shape, kv_len, splits, pdl, copies, cluster=cluster,
                                config=config) for pdl in (False, True)]
            except pk.LaunchError as exc:
                print(f"{label} at {kv_len}: {exc}", flush=True)
                continue
            pct = [100 * nbytes / (t * 1e-6) / copy for t in us]
            rows.append(f"| {kv_len} | {label} | {blocks} | {us[0]:.2f} / {us[1]:.2f} | "
                        f"{pct[0]:.0f}% / {pct[1]:.0f}% |")
            print(rows[-1], flush=True)
    return rows


# (ring stages per warp, blocks per SM the splits are planned for, fused combine): decode_bulk
BULK_SWEEP = [(2, 2, False), (2, 2, True), (2, 1, False), (2, 3, False), (1, 2, False),
              (4, 1, False)]


def variant_table(runs, lens) -> list[str]:
    """8B shape, each (label, config, fused) of `runs` at each kv_len: us per decode (split +
    combine, or fused) in plain / PDL graphs, and the split kernel alone."""
    copy, shape, _ = eight_b_setup()
    n_head, n_kv, head_dim = shape
    rows = [f"torch copy bandwidth {copy / 1e12:.2f} TB/s", "",
            "| kv_len | kernel | splits | us plain / PDL | % of copy (plain / PDL) | "
            "split kernel alone, us plain / PDL |", "|---" * 6 + "|"]
    for kv_len in lens:
        copies = caches(n_kv, kv_len, head_dim)
        nbytes = 2 * copies[0][0].nbytes
        for label, config, fused in runs:
            splits = config_splits(config, n_head, n_kv, kv_len)
            us = [decode_us(shape, kv_len, splits, pdl, copies, config=config, fused=fused)
                  for pdl in (False, True)]
            pct = [100 * nbytes / (t * 1e-6) / copy for t in us]
            alone = "" if fused else " / ".join(
                f"{t:.2f}" for t in (decode_us(shape, kv_len, splits, pdl, copies,
                                               config=config, split_only=True)
                                     for pdl in (False, True)))
            rows.append(f"| {kv_len} | {label} | {splits} | {us[0]:.2f} / {us[1]:.2f} | "
                        f"{pct[0]:.0f}% / {pct[1]:.0f}% | {alone} |")
            print(rows[-1], flush=True)
    return rows


def bulk_table(lens=(128, 1024, 4096, 32768)) -> list[str]:
    """decode_bulk (K/V by bulk copies into shared memory, small blocks, every stage requested
    before the PDL wait) in BULK_SWEEP's shapes against the default, 8B shape."""
    _, shape, default = eight_b_setup()
    group, head_dim = shape[0] // shape[1], shape[2]
    runs = [("default (decode_mma) + combine", default, False)]
    for stages, per_sm, fused in BULK_SWEEP:
        config = bulk_config(group, head_dim, stages=stages, blocks_per_sm=per_sm)
        runs.append((f"bulk: ring {stages}, {per_sm} blocks / SM, "
                     f"{'fused' if fused else '+ combine'}", config, fused))
    return variant_table(runs, lens)


def hot_table(lens=(128, 1024, 4096, 32768)) -> list[str]:
    """8B shape, the default decode with every launch reading ONE cache (L2-resident up to
    ~4096 keys), as llama.cpp's test-backend-ops times its FLASH_ATTN_EXT (the op repeated on
    the same tensors): the like-for-like figure for that comparison, not a bandwidth one."""
    _, shape, config = eight_b_setup()
    n_head, n_kv, head_dim = shape
    rows = ["| kv_len | K/V MB | us plain / PDL, one cache (L2-hot) | rotated caches (HBM) |",
            "|---|---|---|---|"]
    for kv_len in lens:
        copies = caches(n_kv, kv_len, head_dim)
        splits = config_splits(config, n_head, n_kv, kv_len)
        hot = [decode_us(shape, kv_len, splits, pdl, copies[:1]) for pdl in (False, True)]
        cold = [decode_us(shape, kv_len, splits, pdl, copies) for pdl in (False, True)]
        rows.append(f"| {kv_len} | {2 * copies[0][0].nbytes / 1e6:.1f} | {hot[0]:.2f} / "
                    f"{hot[1]:.2f} | {cold[0]:.2f} / {cold[1]:.2f} |")
        print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lens", default="256,600,1024,2048,4096")
    parser.add_argument("--batched", action="store_true",
                        help="instead: 1-8 sequences of 4096 keys in one launch (8B shape)")
    parser.add_argument("--cluster", action="store_true",
                        help="instead: the cluster merge against the default (8B shape)")
    parser.add_argument("--cluster-sweep", action="store_true",
                        help="instead: cluster merges of fewer heads per block / warps")
    parser.add_argument("--bulk", action="store_true",
                        help="instead: decode_bulk's shapes against the default (8B shape)")
    parser.add_argument("--hot", action="store_true",
                        help="instead: the default on one L2-resident cache, as llama.cpp's "
                             "test-backend-ops times attention, and on rotated caches")
    parser.add_argument("--out")
    args = parser.parse_args()
    pk.set_device("cuda")
    if args.hot:
        rows = hot_table()
    elif args.bulk:
        rows = bulk_table()
    elif args.cluster_sweep:
        rows = cluster_sweep_table()
    elif args.cluster:
        rows = cluster_table()
    else:
        rows = batched_table() if args.batched else table([int(x) for x in
                                                           args.lens.split(",")])
    text = "\n".join([f"device: {pk.current_device().name}", ""] + rows)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
