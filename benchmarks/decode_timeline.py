"""Where the time of one decode-attention launch goes, measured inside the kernel (issue 6: the
8B shape at 4096 keys takes ~10 us for 16.8 MB that a bare read streams in 5.4 us).

A copy of the tensor-core split kernel (stdlib_kernels/attention/decode_mma.decode_mma, f16
cache, built from the same functions) reads the SM's cycle counter (%clock64) at its phase
boundaries and the global timer (%globaltimer, ns, comparable across SMs) at entry and exit;
lane 0 of every warp stores them. A stamp takes the value it follows as an operand, so it waits
for that value (the length, the first tile's bytes, the accumulators) and nothing more. The
same is done for a bare read of the same bytes (benchmarks/read_floor.py's kernel: entry, first
bytes, last bytes, exit). Launches as in benchmarks/attention_splits.py: a plain CUDA graph of
launches that each read their own cache copy out of >= 256 MB (L2 cannot hold them), the
combine kernel after every split kernel; the stamps of the last replay are analysed.

Per launch (median over the graph's launches), us from the launch's first block entry:
blocks entered (median / last), length known, first tile in, last tile scored (median / last
warp), merge done (last warp), exit (last block), and the gap to the next launch's first entry
(the combine kernel and the launch latencies in between).

    python3 benchmarks/decode_timeline.py [--lens 128,4096,32768]
    python3 benchmarks/decode_timeline.py --strip [--lens 4096,32768]   (the split kernel alone
        with parts taken out: decode_stamped's STRIP; timing only)

The stamps are inline PTX reads of the clocks, which ptxas does not move loads across: Q's
loads go out only after the length's stamp here, ~0.7 us later first tiles than the shipped
kernel, where ptxas overlaps the two.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pykernel as pk  # noqa: E402
from pykernel import Const, Ptr, f32, i32, i64, u16, u32  # noqa: E402
from benchmarks._timing import replay_seconds  # noqa: E402
from benchmarks.attention_splits import caches  # noqa: E402
from stdlib_kernels.attention.decode import (LOG2E, DecodeWorkspace, combine_spec,  # noqa: E402
                                             combine_warps, KeyRange, launch_decode)
from stdlib_kernels.attention.decode_plan import config_splits, mma_config  # noqa: E402
from stdlib_kernels.attention.decode_combine import combine_splits  # noqa: E402
from stdlib_kernels.attention.decode_kernels import block_work  # noqa: E402
from stdlib_kernels.attention.decode_mma import (accumulate_tile, clear_state, load_q,  # noqa: E402
                                                 load_tile, merge_warps, online_softmax,
                                                 score_tile)

STAMPS = 8        # per warp: gt entry, clk entry, clk length, clk first tile, clk loop end,
                  # clk merged, gt exit, clk exit


@pk.func
def clock_after(dep: u32) -> i64:
    return pk.asm("mov.u64 $0, %clock64; // $1", "=l,r", i64, dep)


@pk.func
def gtimer_after(dep: u32) -> i64:
    return pk.asm("mov.u64 $0, %globaltimer; // $1", "=l,r", i64, dep)


@pk.func
def store_stamps(stamps, at: i64, st):
    if pk.lane_id() == 0:
        for i in pk.static_range(STAMPS):
            stamps[at + i] = st[i]


@pk.func
def load_tile_contig(kp, vp, kb, vb, slot: i32, key0: i32, last_key: i32, NP: Const[int]):
    """The same tile's bytes (keys key0 .. key0 + 15) as load_tile, but lane l's word group
    (j, p) is the 16 bytes at ((j * NP + p) * 32 + l) * 16 of the tile: every load instruction
    of the warp reads 512 contiguous bytes (4 whole 128-byte lines, where load_tile's reads 8
    halves of lines). Wrong numbers (the fragments no longer hold the right rows); timing only:
    what a tile-interleaved cache layout would gain."""
    lane = pk.lane_id()
    for j in pk.static_range(2):
        for p in pk.static_range(NP):
            at = ((slot * 2 + j) * NP + p) * 4
            src = i64(min(key0, last_key - 15)) * i64(NP * 16) + i64(((j * NP + p) * 32 + lane)
                                                                      * 4)
            kw = pk.load_vec(kp, src, 4)
            vw = pk.load_vec(vp, src, 4)
            for w in pk.static_range(4):
                kb[at + w] = kw[w]
                vb[at + w] = vw[w]


@pk.func
def accumulate_tile_raw_v(vb, s, m, den, oacc, slot: i32, NP: Const[int]):
    """accumulate_tile (f16) with V's raw words as the mma A operand instead of their
    movmatrix transposes: wrong numbers; timing only (what the 32 MOVM per tile cost)."""
    b0, b1 = online_softmax(s, m, den, oacc, NP)
    for p in pk.static_range(NP):
        for wp in pk.static_range(2):
            i = (p * 2 + wp) * 4
            lo = ((slot * 2) * NP + p) * 4 + 2 * wp
            hi = ((slot * 2 + 1) * NP + p) * 4 + 2 * wp
            d0, d1, d2, d3 = pk.mma_m16n8k16_f16(vb[lo], vb[lo + 1], vb[hi], vb[hi + 1], b0, b1,
                                                 oacc[i], oacc[i + 1], oacc[i + 2],
                                                 oacc[i + 3])
            oacc[i] = d0
            oacc[i + 1] = d1
            oacc[i + 2] = d2
            oacc[i + 3] = d3


@pk.kernel
def decode_stamped(q: Ptr[f32], k_cache: Ptr[u32, "ro"], v_cache: Ptr[u32, "ro"],
                   k_scale: Ptr[u16, "ro"], lens: Ptr[i32, "ro"], max_len: i32, n_head: i32,
                   n_kv_head: i32, q_scale: f32, out: Ptr[f32], part_o: Ptr[f32],
                   part_ml: Ptr[f32], xq: Ptr[u32], stamps: Ptr[i64], slot: i32,
                   D: Const[int], GB: Const[int], NWARPS: Const[int], P: Const[int],
                   CONTIG: Const[int], ROT: Const[int], STRIP: Const[int]):
    """decode_mma's body (f16, no PDL, no fused / cluster merge) with stamps. STRIP (timing
    only, wrong numbers): 1 = each tile's words are only XORed together (the loads are waited
    for as the scoring would, no math), then the merge as usual; 2 = that and no merge either
    (one store per warp): what the stream costs without the work around it; 3 = the math but
    V's words enter the mma untransposed (no movmatrix); 4 = the scores (Q K^T) only, V's words
    XORed; 5 = the whole math for ring slot 0's tiles, slot 1's XORed."""
    st = pk.local_array(i64, STAMPS)
    st[0] = gtimer_after(u32(0))
    st[1] = clock_after(u32(0))
    NP = D // 32
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    g = lane // 4
    t = lane % 4
    z, split, kvh, h0, k0, k1, kv_len = block_work(lens, 1, 1, 0, 0, n_head, n_kv_head, GB)
    st[2] = clock_after(u32(kv_len))
    first_elem = i64(kvh) * i64(max_len) * i64(D)
    kp = k_cache + first_elem // 2
    vp = v_cache + first_elem // 2
    ksp = k_scale + first_elem // 32
    last_key = max(0, k1 - 1)
    kb = pk.local_array(u32, P * 2 * NP * 4)
    vb = pk.local_array(u32, P * 2 * NP * 4)
    ksc = pk.local_array(u16, P * 2 * NP)
    stride = NWARPS * 16
    first = k0 + warp * 16
    rot0 = ((pk.block_idx.x * 5 + pk.block_idx.y * 3) % 16) * 16 if ROT else 0
    first_r = first
    if first < k1:
        first_r = k0 + (first - k0 + rot0) % max(1, k1 - k0)
    if CONTIG:
        load_tile_contig(kp, vp, kb, vb, 0, first_r, last_key, NP)
    else:
        load_tile(kp, vp, ksp, ksp, kb, vb, ksc, ksc, 0, first_r, last_key, g, t, D, NP, 0)
    qb = pk.local_array(u32, NP * 4)
    dq = pk.local_array(f32, NP * 2)
    load_q(q, qb, dq, q_scale, (z * n_head + h0 + g) * D, g < GB, t, NP, 0)
    oacc = pk.local_array(f32, NP * 8)
    m = pk.local_array(f32, 2)
    den = pk.local_array(f32, 2)
    clear_state(oacc, m, den, NP)
    s = pk.local_array(f32, 4)
    sink = u32(0)
    st[3] = st[2]
    # ROT: each block starts its range at a different 16-key tile (and wraps around), so the
    # blocks' concurrent reads are not all the same offset into their 64 KB chunks
    rot = ((split * 5 + kvh * 3) % 16) * 16 if ROT else 0
    span = max(1, k1 - k0)
    base = first
    while base < k1:
        for p in pk.static_range(P):
            ahead = base + (p + P - 1) * stride
            if ahead < k1:
                ahead = k0 + (ahead - k0 + rot) % span
            if CONTIG:
                load_tile_contig(kp, vp, kb, vb, (p + P - 1) % P, ahead, last_key, NP)
            else:
                load_tile(kp, vp, ksp, ksp, kb, vb, ksc, ksc, (p + P - 1) % P, ahead,
                          last_key, g, t, D, NP, 0)
            if p == 0:
                if base == first:
                    st[3] = clock_after(kb[0] ^ vb[0])
            key0 = base + p * stride
            if key0 < k1:
                key0 = k0 + (key0 - k0 + rot) % span
                if STRIP == 3:
                    score_tile(kb, ksc, qb, dq, p, key0, k1, g, 0.0, s, NP, 0)
                    accumulate_tile_raw_v(vb, s, m, den, oacc, p, NP)
                elif STRIP == 4 or (STRIP == 5 and p == 0):
                    score_tile(kb, ksc, qb, dq, p, key0, k1, g, 0.0, s, NP, 0)
                    if STRIP == 5:
                        accumulate_tile(vb, ksc, s, m, den, oacc, p, NP, 0)
                    else:
                        m[0] = max(m[0], s[0] + s[1] + s[2] + s[3])
                        for w in pk.static_range(2 * NP * 4):
                            sink = sink ^ vb[p * 2 * NP * 4 + w]
                elif STRIP:
                    for w in pk.static_range(2 * NP * 4):
                        sink = sink ^ kb[p * 2 * NP * 4 + w] ^ vb[p * 2 * NP * 4 + w]
                else:
                    score_tile(kb, ksc, qb, dq, p, key0, k1, g, 0.0, s, NP, 0)
                    accumulate_tile(vb, ksc, s, m, den, oacc, p, NP, 0)
        base += P * stride
    oacc[0] += f32(sink & u32(1))
    st[4] = clock_after(pk.bitcast(oacc[0] + m[0] + den[0], u32))
    if STRIP == 2:
        out[pk.block_idx.x * NWARPS + warp] = oacc[0]
    else:
        merge_warps(oacc, m, den, warp, g, t, z, h0, split, n_head, 0, out, part_o, part_ml,
                    xq, out, D, GB, NWARPS, NP, 0, 0, 0)
    st[5] = clock_after(u32(0))
    st[6] = gtimer_after(u32(0))
    st[7] = clock_after(u32(0))
    blk = pk.block_idx.y * pk.grid_dim.x + pk.block_idx.x
    warps = pk.grid_dim.x * pk.grid_dim.y * NWARPS
    store_stamps(stamps, (i64(slot) * i64(warps) + i64(blk * NWARPS + warp)) * STAMPS, st)


@pk.kernel
def read_stamped(x: Ptr[f32, "ro"], out: Ptr[f32], n_vec: i32, stamps: Ptr[i64], slot: i32,
                 UNROLL: Const[int], CHUNK: Const[int]):
    """benchmarks/read_floor.read_sum (plain mode) with the same stamps: 2 = first loads in,
    3 = 4 = last loads in. CHUNK: each block reads its own contiguous 1 / grid of the buffer
    (as a decode split block reads its keys) instead of a grid-stride sweep."""
    st = pk.local_array(i64, STAMPS)
    st[0] = gtimer_after(u32(0))
    st[1] = clock_after(u32(0))
    st[2] = st[1]
    stride = pk.grid_dim.x * pk.block_dim.x
    base = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if CHUNK:
        per_block = (n_vec + pk.grid_dim.x - 1) // pk.grid_dim.x
        stride = pk.block_dim.x
        base = pk.block_idx.x * per_block + pk.thread_idx.x
        n_vec = min(n_vec, (pk.block_idx.x + 1) * per_block)
    vals = pk.local_array(f32, UNROLL * 4)
    acc = f32(0.0)
    begin = base
    while base < n_vec:
        for u in pk.static_range(UNROLL):
            v = min(base + u * stride, n_vec - 1)
            a, b, c, d = pk.load_vec(x, v * 4, 4)
            vals[u * 4] = a
            vals[u * 4 + 1] = b
            vals[u * 4 + 2] = c
            vals[u * 4 + 3] = d
        if base == begin:
            st[2] = clock_after(pk.bitcast(vals[0], u32))
        for u in pk.static_range(UNROLL):
            if base + u * stride < n_vec:
                acc += (vals[u * 4] + vals[u * 4 + 1]) + (vals[u * 4 + 2] + vals[u * 4 + 3])
        base += UNROLL * stride
    st[3] = st[2]
    st[4] = clock_after(pk.bitcast(acc, u32))
    for r in pk.static_range(5):
        acc += pk.shfl_xor(acc, 16 >> r)
    if pk.lane_id() == 0:
        out[(pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x) // 32] = acc
    st[5] = clock_after(u32(0))
    st[6] = gtimer_after(u32(0))
    st[7] = clock_after(u32(0))
    warps = pk.grid_dim.x * pk.block_dim.x // 32
    store_stamps(stamps, (i64(slot) * i64(warps) + i64(
        (pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x) // 32)) * STAMPS, st)


PHASES = ("length known", "first tile in", "last tile scored", "merged / stored", "exit")


def analyse(stamps: np.ndarray, launches: int) -> dict:
    """stamps (launches, warps, STAMPS) -> per-phase us from each launch's first entry
    (median over launches of the median / last warp), and the gap between launches."""
    st = stamps.reshape(launches, -1, STAMPS).astype(np.float64)
    gt_entry, clk0, gt_exit, clk_exit = st[..., 0], st[..., 1], st[..., 6], st[..., 7]
    # cycles -> ns from each warp's own entry / exit pair (both timers read back to back)
    ns_per_clk = np.median((gt_exit - gt_entry) / np.maximum(clk_exit - clk0, 1))
    start = gt_entry.min(axis=1, keepdims=True)
    rel = {"entered": (gt_entry - start) / 1e3}
    for i, name in enumerate(PHASES[:4]):
        rel[name] = (gt_entry - start + (st[..., 2 + i] - clk0) * ns_per_clk) / 1e3
    rel["exit"] = (gt_exit - start) / 1e3
    res = {k: (float(np.median(np.median(v, axis=1))), float(np.median(v.max(axis=1))))
           for k, v in rel.items()}
    gaps = start[1:, 0] - gt_exit[:-1].max(axis=1)
    res["gap to next launch"] = (float(np.median(gaps)) / 1e3, float(gaps.max()) / 1e3)
    res["ns per clock"] = (float(ns_per_clk), float(ns_per_clk))
    return res


def decode_timeline(kv_len: int, combine: bool = True, contig: bool = False,
                    rot: bool = False, strip: int = 0) -> tuple[dict, float, float]:
    n_head, n_kv, head_dim = 32, 8, 128
    config = mma_config(n_head // n_kv, head_dim)
    assert config.stages == 2, "decode_stamped's prologue loads one ring slot"
    splits = config_splits(config, n_head, n_kv, kv_len)
    copies = caches(n_kv, kv_len, head_dim)
    q = pk.to_device(np.random.default_rng(1).standard_normal((1, n_head, head_dim))
                     .astype(np.float32))
    lens = pk.to_device(np.full(1, kv_len - 1, np.int32))        # block_work adds 1
    out = pk.empty((1, n_head, head_dim), np.float32)
    ws = DecodeWorkspace.allocate(1, n_head, head_dim, splits)
    launches = max(len(copies), 20)
    warps = splits * n_kv * config.warps
    stamps = pk.zeros((launches * warps * STAMPS,), np.int64)
    cw = combine_warps(splits)

    def record():
        for i in range(launches):
            k, v = copies[i % len(copies)]
            decode_stamped[(splits, n_kv, 1), 32 * config.warps](
                q, k.view(np.uint32), v.view(np.uint32), k.view(np.uint16), lens, kv_len,
                n_head, n_kv, head_dim ** -0.5 * LOG2E, out, ws.part_o, ws.part_ml,
                out.reshape(-1).view(np.uint32), stamps, i, D=head_dim,
                GB=config.heads_per_block, NWARPS=config.warps, P=config.stages,
                CONTIG=int(contig), ROT=int(rot), STRIP=strip)
            if combine:
                combine_splits[(n_head,), 32 * cw](ws.part_o, ws.part_ml, out,
                                                   out.reshape(-1).view(np.uint32), splits,
                                                   sinks=out.reshape(-1), n_head=n_head,
                                                   **combine_spec(head_dim, cw))
    stamped_us = replay_seconds(record) * 1e6 / launches
    res = analyse(stamps.numpy(), launches)
    lens1 = pk.to_device(np.full(1, kv_len, np.int32))

    def shipped():
        for i in range(launches):
            k, v = copies[i % len(copies)]
            launch_decode(q, k, v, KeyRange(lens1), out, head_dim ** -0.5, workspace=ws,
                          config=config)
    return res, stamped_us, replay_seconds(shipped) * 1e6 / launches


def read_timeline(nbytes: int, threads: int = 256, per_sm: int = 8, unroll: int = 4,
                  blocks: int = 0) -> tuple[dict, float]:
    """blocks > 0: that many blocks, each reading its own contiguous chunk (CHUNK)."""
    copies = max(2, -(-(256 << 20) // nbytes))
    bufs = [pk.full((nbytes // 4,), 1.0, np.float32) for _ in range(copies)]
    grid = blocks or per_sm * int(pk.current_device().core.properties.multiprocessor_count)
    out = pk.empty((grid * threads // 32,), np.float32)
    launches = max(copies, 20)
    stamps = pk.zeros((launches * grid * threads // 32 * STAMPS,), np.int64)

    def record():
        for i in range(launches):
            read_stamped[grid, threads](bufs[i % copies], out, nbytes // 16, stamps, i, unroll,
                                        int(blocks > 0))
    us = replay_seconds(record) * 1e6 / launches
    return analyse(stamps.numpy(), launches), us


def rows(label: str, res: dict) -> list[str]:
    return [f"| {label} | {k} | {v[0]:.2f} | {v[1]:.2f} |" for k, v in res.items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lens", default="128,4096,32768")
    ap.add_argument("--strip", action="store_true", help="only the split kernel alone with "
                    "STRIP 0 / 1 / 2 and the bare reads, at --lens")
    args = ap.parse_args()
    lines = ["| kernel | point | median | last / max |", "|---|---|---|---|"]
    if args.strip:
        for kv_len in (int(x) for x in args.lens.split(",")):
            for strip in (0, 1, 3, 4, 5, 0, 1, 3, 4, 5):
                res, stamped, _ = decode_timeline(kv_len, combine=False, strip=strip)
                print(f"decode {kv_len} keys, split kernel alone, STRIP {strip}: "
                      f"{stamped:.2f} us", flush=True)
                lines += rows(f"split alone, STRIP {strip}, {kv_len}", res)
            nbytes = 2 * 8 * kv_len * 128 * 2
            for blocks in (128, 0):
                unroll = min(32, nbytes // (128 * 256 * 16)) if blocks else 8
                res, us = read_timeline(nbytes, 256, 4, unroll, blocks)
                print(f"bare read of {nbytes / 1e6:.1f} MB, {blocks or '4 x SMs'} blocks, "
                      f"{unroll} loads: {us:.2f} us", flush=True)
                lines += rows(f"read {nbytes / 1e6:.1f} MB, {blocks} chunks", res)
        print("\n".join(lines))
        return
    for kv_len in (int(x) for x in args.lens.split(",")):
        res, stamped, shipped = decode_timeline(kv_len)
        print(f"decode {kv_len} keys: stamped split + combine {stamped:.2f} us per launch, "
              f"shipped launch_decode {shipped:.2f} us", flush=True)
        lines += rows(f"decode {kv_len}", res)
        res, stamped, _ = decode_timeline(kv_len, combine=False)
        print(f"decode {kv_len} keys, split kernel alone: {stamped:.2f} us", flush=True)
        lines += rows(f"split alone {kv_len}", res)
        if kv_len >= 1024:
            res, stamped, _ = decode_timeline(kv_len, combine=False, contig=True)
            print(f"decode {kv_len} keys, split kernel alone, contiguous tile loads: "
                  f"{stamped:.2f} us", flush=True)
            lines += rows(f"split alone, contiguous loads {kv_len}", res)
            res, stamped, _ = decode_timeline(kv_len, combine=False, rot=True)
            print(f"decode {kv_len} keys, split kernel alone, rotated start: "
                  f"{stamped:.2f} us", flush=True)
            lines += rows(f"split alone, rotated start {kv_len}", res)
        nbytes = 2 * 8 * kv_len * 128 * 2
        if kv_len >= 1024:
            res, us = read_timeline(nbytes)
            print(f"bare read of {nbytes / 1e6:.1f} MB: {us:.2f} us", flush=True)
            lines += rows(f"read {nbytes / 1e6:.1f} MB", res)
            for blocks in (128, 256):      # the decode's blocks, one contiguous chunk each
                unroll = min(32, nbytes // (blocks * 256 * 16))
                res, us = read_timeline(nbytes, 256, 0, unroll, blocks)
                print(f"bare read of {nbytes / 1e6:.1f} MB, {blocks} blocks of 256 threads, a "
                      f"chunk each, {unroll} loads in flight: {us:.2f} us", flush=True)
                lines += rows(f"read {nbytes / 1e6:.1f} MB, {blocks} chunks", res)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
