"""Decode GEMV (1..8 tokens) of Q4_0, Q4_1, Q8_0, Q3_K, Q4_K, Q5_K and Q6_K weights from TMA
bulk copies (sm_90+; the CPU target too): each warp's rows arrive whole in shared memory by
one `cp.async.bulk` per row, issued before `griddepcontrol.wait`, then the DP4A math reads
them there, once per token (BATCH: a batched decode step, gemv_bulk_into(batch=)).

Input: w (and w2, the up rows of the gated modes) = gemv.weight_words(raw, type, n) as u32
words, rows of whole 16-byte multiples (Q3_K / Q6_K: n % 2048 == 0; the other types: any
n % 256 == 0);
xq the Q8_1 activations (batch, q8_1_bytes(n)); res (batch, rows) for the residual mode.
Output: y (batch, rows) = W x, + res, or act(W x) * (W2 x) (gemv_kernels' modes and epilogue).

Why: Q3_K and Q6_K blocks are only 2-byte aligned (110 and 210 bytes), so the register kernels
(gemv_kernels) read them as scattered 4-byte loads, and ptxas keeps only so many of those in
flight per warp (H200: Q3_K 78% of copy bandwidth at 57344 x 4096, Q6_K 91% at 128256 x 4096).
Here one instruction per row moves the bytes, the copy engine keeps a warp's rows in flight,
and the scattered reads hit shared memory (Q3_K 98%, Q6_K 110%). In the runner's decode graph,
where the kernel before a GEMV is short (a norm, RoPE, attention), the copies issued before the
PDL wait also overlap it: llama-8B's gate / up (Q4_K) and down / output (Q6_K) GEMVs gain
there although chains of identical Q4_K GEMVs favour the register kernel (benchmarks/
RESULTS.md, "Bulk-copy GEMVs in the runner").

Work split: a warp owns groups of R consecutive rows (with w2: their up rows in the same
stage); lane l takes items l, l + 32, ... (item = 128 values, half of a 256-value block or
run of blocks: dot_q8_k_wide's q3k_wide_* / q4k_half_dot / q5k_half_dot / q6k_wide_*, dot_q8's
q8_0_half_dot / q4_0_half_dot / q4_1_half_dot), its activations loaded once for all rows; the
lanes' sums meet by shuffles. One stage (S = 1): one group per warp, a block per WARPS
groups. S >= 2: one wave of blocks whose warps loop over the groups through a ring of S
stages, so a warp's next rows are in flight while it computes (measured no faster, kept as an
option). Which types and sizes take this kernel by default (`bulk_eligible`) was measured in
the runner's decode (benchmarks/bulk_routing.py), where copies issued before the PDL wait
overlap the kernel before.
Long rows (gemv_bulk_split; Q6_K, Q5_K, Q8_0 and Q4_0 rows over 8192 values by default): a row's
112 items are 3-4 per lane, and the matrix has too few rows (4096) to hide that latency behind
other warps' copies, so SPLIT warps each copy and sum a quarter of the row (about one item per
lane), their sums added in shared memory in a fixed order (H200, 4096 x 14336: 19.3 -> 15.8 us
in a PDL chain).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u32, u64

from .._device import init_warp_mbarriers, warp_sum
from .dot_q8 import act_copy, q4_0_half_dot, q4_1_half_dot, q8_0_half_dot
from .dot_q8_k_wide import (q3k_wide_sum, q3k_wide_values, q4k_half_dot, q5k_half_dot,
                            q6k_wide_sum, q6k_wide_values)
from .gemv_kernels import (MAX_BATCH, MODE_GEGLU, MODE_PLAIN, MODE_RESIDUAL, MODE_SWIGLU,
                           store_output)
from .formats import FORMATS, GEMV_BULK, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0, type_ids
from .gemv_q1_0 import L2_BYTES, bulk_available
from .q8_1 import q8_1_bytes

# BLOCK_BYTES: bytes per 256 values (Q8_0 / Q4_0 / Q4_1: 8 blocks of 34 / 18 / 20 B)
BULK_TYPES = type_ids(GEMV_BULK)   # type name -> ggml id (formats.py)
BLOCK_BYTES = {t: FORMATS[t].superblock_bytes for t in BULK_TYPES}
# row lengths whose rows are whole 16-byte multiples (bulk copies): 8 blocks of 110 / 210 B,
# any number of 144 / 176 / 272 B units
ROW_ALIGN = {"Q3_K": 2048, "Q4_K": 256, "Q5_K": 256, "Q6_K": 2048, "Q8_0": 256, "Q4_0": 256,
             "Q4_1": 256}
# gemv_bulk_split's chunk unit, in 256-value groups (BLOCK_BYTES): the fewest whose bytes are
# a 16-byte multiple (Q3_K / Q6_K: 8, even, so a chunk starts on an even block as their
# word-shifted reads assume; the others' groups are 16-byte multiples already)
UNIT_BLOCKS = {"Q3_K": 8, "Q4_K": 1, "Q5_K": 1, "Q6_K": 8, "Q8_0": 1, "Q4_0": 1, "Q4_1": 1}
MODES = {None: MODE_PLAIN, "residual": MODE_RESIDUAL, "swiglu": MODE_SWIGLU,
         "geglu": MODE_GEGLU}
# (warps per block, rows per warp, ring stages), fastest on the H200 (benchmarks/RESULTS.md,
# "Q3_K rows by bulk copies" and "Bulk-copy GEMVs in the runner")
TUNED = {"Q3_K": (4, 3, 1), "Q4_K": (4, 1, 1), "Q5_K": (4, 1, 1), "Q6_K": (4, 1, 1),
         "Q8_0": (4, 1, 1), "Q4_0": (4, 1, 1), "Q4_1": (4, 1, 1)}
SHARED_PER_SM = 228 << 10      # sm_90 / sm_100: shared memory per multiprocessor
SHARED_RESERVED = 1 << 10      # ... of which the driver reserves this much per block
MAX_SHARED_PER_BLOCK = 227 << 10   # sm_90 / sm_100 (and the CPU target): shared memory one
                                   # block may opt in to; a GPU's own limit: shared_limit()
# Q6_K: the smallest weights the bulk kernel takes by default (below, the register kernel)
Q6K_MIN_BYTES = 16 << 20
# Q4_K: the bulk kernel by default for weights from Q4K_MIN_BYTES in rows up to Q4K_MAX_N (the
# runner's decode on the H200: llama-8B's gate / up, 33 MB each, gain; its q + k + v and o,
# 14 and 9 MB, and qwen2-1.5B's 8 MB matrices do not; rows of 14336 lose)
Q4K_MIN_BYTES = 16 << 20
Q4K_MAX_N = 8192
# Q5_K: the bulk kernel by default for rows over LONG_ROW (split over warps) and for other
# weights over Q5K_MIN_BYTES (its register kernel, the base one, is slower than Q4_K's "wide"
# one). H100, PDL graphs: llama-8B's 14336 x 4096 20.1 -> 16.6 us, 6144 x 4096 10.2 -> 9.0,
# 4096 x 4096 (11.5 MB) 7.8 -> 7.3, 4096 x 14336 split over 4 warps 20.7 -> 17.1, qwen2-1.5B's
# 1536 x 8960 split 7.7 -> 6.8; but qwen2's 8960 x 1536 (9.5 MB) 7.1 -> 7.3 and its smaller
# ones lose too: the limit sits between (benchmarks/RESULTS.md "Q5_K rows by bulk copies")
Q5K_MIN_BYTES = 10 << 20
# Types that take the bulk kernel by default for weights over this many bytes (None: never),
# rows over LONG_ROW split per LONG_SPLIT. H100 decode, tg128:
# - Q8_0 at every size: llama-8B 242-244 -> 298 t/s, 304-305 with the split; qwen2-1.5B
#   749-766 -> 888-895, 894-899 split (with a 16 MB limit only 768-772: its matrices are
#   smaller); benchmarks/RESULTS.md "Q8_0 rows by bulk copies"
# - Q4_0 from 16 MB: llama-8B 438-439 -> 459; at every size 463 there, but qwen2-1.5B (matrices
#   of 2-8 MB) 1137-1149 -> 1065-1074 (from 16 MB: 1143-1150); RESULTS.md "Q4_0 rows by bulk
#   copies"
# - Q4_1 never (its register kernel reads at 103-109% of copy): llama-8B 420-421 on it, 401
#   from 16 MB, 402-403 at every size; qwen2-1.5B 1136-1139 / 1140-1144 / 1033-1035 (same)
BULK_FROM_BYTES: dict[str, int | None] = {"Q8_0": 0, "Q4_0": 16 << 20, "Q4_1": None}
# rows longer than LONG_ROW values: (warps per block, warps per row) of gemv_bulk_split by
# default, for the types listed (Q4_K: such rows take the bulk kernel only when listed). H200:
# Q6_K 4096 x 14336 15.8 us (77% of copy) vs 19.3 whole rows; Q4_K's register kernel stays
# faster in the runner (benchmarks/RESULTS.md, "Long rows split over warps")
LONG_ROW = 8192
LONG_SPLIT: dict[str, tuple[int, int]] = {"Q6_K": (4, 4), "Q5_K": (4, 4), "Q8_0": (4, 4),
                                           "Q4_0": (4, 4), "Q4_1": (4, 4)}   # (when taken)

# 2..8 tokens (batched decode): the types whose bulk kernel runs every matrix by default, with
# BATCH_ROWS rows per warp of 4-warp blocks, long rows split over LONG_SPLIT's warps up to
# BATCH_SPLIT_MAX tokens. H100, PDL graphs, us, register kernel -> bulk (benchmarks/
# gemv_batch.py, RESULTS.md "Batched decode GEMVs"): Q6_K 4096 x 14336 at 2 / 4 / 8 tokens
# 36.7 / 34.7 / 63.2 -> 21.3 / 29.0 / 44.9, 128256 x 4096 235 / 227 / 449 -> 143 / 157 /
# 282. Q4_K stays on the register kernel (28672 x 4096: 27.1 / 37.3 / 76.9 against 27.3 /
# 41.9 / 72.9): both decode its blocks once per token, which bounds them at 4-8 tokens
BATCH_BULK = frozenset({"Q6_K"})
BATCH_ROWS = 2
BATCH_SPLIT_MAX = 4


@pk.func
def item_dot(FMT: Const[int], sm: Ptr[u32], wrow: i32, blk: i32, n: i32, a) -> f32:
    """Item n of block blk of the row at shared word wrow times the activations in a."""
    if FMT == Q4_K:
        return q4k_half_dot(sm, wrow, blk, n, a)
    elif FMT == Q5_K:
        return q5k_half_dot(sm, wrow, blk, n, a)
    elif FMT == Q8_0:
        return q8_0_half_dot(sm, wrow, blk, n, a)
    elif FMT == Q4_0:
        return q4_0_half_dot(sm, wrow, blk, n, a)
    elif FMT == Q4_1:
        return q4_1_half_dot(sm, wrow, blk, n, a)
    elif FMT == Q6_K:
        v = pk.local_array(i32, 32)
        sc = pk.local_array(i32, 8)
        d = q6k_wide_values(sm, wrow, blk, n, v, sc)
        return d * q6k_wide_sum(v, sc, a)
    else:
        v = pk.local_array(u32, 32)
        sc = pk.local_array(i32, 8)
        d = q3k_wide_values(sm, wrow, blk, n, v, sc)
        return d * q3k_wide_sum(v, sc, a)


@pk.func
def issue_group(w: Ptr[u32, "ro"], w2: Ptr[u32, "ro"], sm, bars, bar: i32, stage: i32,
                row0: i32, rows: i32, row_words: i32, lane: i32, R: Const[int],
                GLU: Const[int]):
    """Rows row0 .. row0 + R - 1 (then, GLU, the same rows of w2) into the stage at shared
    word `stage` (lane r copies stage row r; rows past the end: the last row again), their
    bytes announced on mbarrier `bar`."""
    RR = R * (1 + GLU)
    if lane == 0:
        pk.mbarrier_arrive_expect_tx(bars, bar, RR * row_words * 4)
    for i in pk.static_range((RR + 31) // 32):
        r = lane + 32 * i
        if r < R:
            pk.bulk_copy(sm, stage + r * row_words, w, min(row0 + r, rows - 1) * row_words,
                         row_words * 4, bars, bar)
        elif r < RR:
            pk.bulk_copy(sm, stage + r * row_words, w2,
                         min(row0 + r - R, rows - 1) * row_words, row_words * 4, bars, bar)


@pk.kernel
def gemv_bulk(w: Ptr[u32, "ro"], w2: Ptr[u32, "ro"], xq: Ptr[u32], res: Ptr[f32],
              y: Ptr[f32], rows: i32, row_words: i32, nb: i32, xq_words: i32, FMT: Const[int],
              R: Const[int], WARPS: Const[int], S: Const[int], MODE: Const[int],
              BATCH: Const[int]):
    """Each warp takes groups of R rows, first = its index in the grid, then every
    (grid warps)-th: a ring of S stages per warp, the first S groups' copies issued before
    the PDL wait, a stage refilled with the group S ahead once read. MODE: gemv_kernels'
    (plain, residual, SwiGLU / GeGLU with w2's rows in the same stage). BATCH tokens (xq rows
    xq_words apart): each token's activations are loaded once per item for all R rows, the
    rows read from shared memory once per token."""
    GLU = 1 if MODE >= MODE_SWIGLU else 0
    RR = R * (1 + GLU)
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    sm = pk.dynamic_shared(u32)
    bars = pk.shared_array(u64, WARPS * S)
    SW = RR * row_words
    base = warp * S * SW
    init_warp_mbarriers(bars, warp, lane, S)
    step = pk.grid_dim.x * WARPS
    first = pk.block_idx.x * WARPS + warp
    groups = (rows + R - 1) // R
    rounds = 0
    if first < groups:
        rounds = (groups - first + step - 1) // step
    for s in pk.static_range(S):
        if s < rounds:
            issue_group(w, w2, sm, bars, warp * S + s, base + s * SW, (first + s * step) * R,
                        rows, row_words, lane, R, GLU)
    pk.grid_dependency_wait()
    acc = pk.local_array(f32, RR * BATCH)     # token t's row r at t * RR + r
    a = pk.local_array(u32, 36)
    for rd in range(rounds):
        stage = base + rd % S * SW
        row0 = (first + rd * step) * R
        for r in pk.static_range(RR * BATCH):
            acc[r] = 0.0
        pre = pk.local_array(f32, R * BATCH)     # the residuals, loaded while the rows arrive
        for r in pk.static_range(R * BATCH):
            pre[r] = 0.0
            if MODE == MODE_RESIDUAL and lane == r % 32 and row0 + r % R < rows:
                pre[r] = res[r // R * rows + row0 + r % R]
        pk.mbarrier_wait(bars, warp * S + rd % S, (rd // S) % 2)
        for item in range(lane, 2 * nb, 32):
            blk = item // 2
            n = item % 2
            for t in pk.static_range(BATCH):
                act_copy(xq, t * xq_words + 9 * (8 * blk + 4 * n), a, 36, 4)
                for r in pk.static_range(RR):
                    acc[t * RR + r] += item_dot(FMT, sm, stage + r * row_words, blk, n, a)
        for tr in pk.static_range(R * BATCH):
            t = tr // R
            r = tr % R
            total = warp_sum(acc[t * RR + r])
            gate_up = total
            if GLU:
                gate_up = warp_sum(acc[t * RR + R + r])
            if lane == tr % 32 and row0 + r < rows:
                store_output(total, gate_up, pre[tr], y, t * rows + row0 + r, MODE)
        pk.syncwarp()                          # the stage is read before it is refilled
        if rd + S < rounds:
            issue_group(w, w2, sm, bars, warp * S + rd % S, stage,
                        (first + (rd + S) * step) * R, rows, row_words, lane, R, GLU)


@pk.kernel
def gemv_bulk_split(w: Ptr[u32, "ro"], w2: Ptr[u32, "ro"], xq: Ptr[u32], res: Ptr[f32],
                    y: Ptr[f32], rows: i32, row_words: i32, unit_words: i32, units: i32,
                    chunk_words: i32, xq_words: i32, FMT: Const[int], UNIT_BLOCKS: Const[int],
                    WARPS: Const[int], SPLIT: Const[int], MODE: Const[int], BATCH: Const[int]):
    """Long rows: SPLIT warps share a row, warp c of the row copying and summing units
    [c units / SPLIT, (c + 1) units / SPLIT) of it (a unit: UNIT_BLOCKS blocks, the
    module's UNIT_BLOCKS[type]), a block holding WARPS / SPLIT rows; the partial sums meet in
    shared memory and the row's first warp adds them in a fixed order (deterministic) and runs
    the epilogue, for each of BATCH tokens (xq rows xq_words apart)."""
    GLU = 1 if MODE >= MODE_SWIGLU else 0
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    sm = pk.dynamic_shared(u32)
    bars = pk.shared_array(u64, WARPS)
    part = pk.shared_array(f32, 2 * WARPS * BATCH)     # token t's sums at 2 WARPS t + ...
    init_warp_mbarriers(bars, warp, lane, 1)
    row = pk.block_idx.x * (WARPS // SPLIT) + warp // SPLIT
    c = warp % SPLIT
    u0 = c * units // SPLIT
    u1 = (c + 1) * units // SPLIT
    src = min(row, rows - 1) * row_words + u0 * unit_words
    nbytes = (u1 - u0) * unit_words * 4
    stage = warp * (1 + GLU) * chunk_words
    if lane == 0:
        pk.mbarrier_arrive_expect_tx(bars, warp, nbytes * (1 + GLU))
        pk.bulk_copy(sm, stage, w, src, nbytes, bars, warp)
        if GLU:
            pk.bulk_copy(sm, stage + chunk_words, w2, src, nbytes, bars, warp)
    pk.grid_dependency_wait()
    pre = pk.local_array(f32, BATCH)     # the residuals, loaded while the rows arrive
    for t in pk.static_range(BATCH):
        pre[t] = 0.0
        if MODE == MODE_RESIDUAL and c == 0 and lane == t and row < rows:
            pre[t] = res[t * rows + row]
    a = pk.local_array(u32, 36)
    acc = pk.local_array(f32, 2 * BATCH)     # token t: acc[2 t], its up sum acc[2 t + 1]
    for t in pk.static_range(2 * BATCH):
        acc[t] = 0.0
    b0 = u0 * UNIT_BLOCKS
    pk.mbarrier_wait(bars, warp, 0)
    for item in range(2 * b0 + lane, 2 * u1 * UNIT_BLOCKS, 32):
        blk = item // 2
        n = item % 2
        for t in pk.static_range(BATCH):
            act_copy(xq, t * xq_words + 9 * (8 * blk + 4 * n), a, 36, 4)
            acc[2 * t] += item_dot(FMT, sm, stage, blk - b0, n, a)
            if GLU:
                acc[2 * t + 1] += item_dot(FMT, sm, stage + chunk_words, blk - b0, n, a)
    for t in pk.static_range(BATCH):
        total = warp_sum(acc[2 * t])
        up = total
        if GLU:
            up = warp_sum(acc[2 * t + 1])
        if lane == 0:
            part[2 * WARPS * t + warp] = total
            part[2 * WARPS * t + WARPS + warp] = up
    pk.syncthreads()
    if c == 0 and lane < BATCH and row < rows:
        for t in pk.static_range(BATCH):
            if lane == t:
                total = f32(0.0)
                gate_up = f32(0.0)
                for k in pk.static_range(SPLIT):
                    total += part[2 * WARPS * t + warp + k]
                    gate_up += part[2 * WARPS * t + WARPS + warp + k]
                store_output(total, gate_up, pre[t], y, t * rows + row, MODE)


def bulk_eligible(type_name: str, rows: int, n: int, batch: int = 1) -> bool:
    """The bulk kernel applies by default: sm_90+ (or the CPU target), rows of whole 16-byte
    multiples (ROW_ALIGN), and large weights: Q3_K over L2 (below it the register kernel's
    reads hit L2 on later calls), Q6_K from Q6K_MIN_BYTES (its register kernel is slower from
    HBM and L2), Q4_K from Q4K_MIN_BYTES in rows of at most Q4K_MAX_N values (long rows: few
    of them per multiprocessor, where the register kernel is as fast) unless LONG_SPLIT lists
    Q4_K, Q5_K from Q5K_MIN_BYTES and in every row over LONG_ROW values (split over
    LONG_SPLIT's warps), Q8_0 / Q4_0 / Q4_1 per BULK_FROM_BYTES (long rows split too); and
    only where the default launch's rows fit in shared memory (the gated modes' up rows
    counted). For 2..8 tokens (batched decode) every size where BATCH_BULK lists the type."""
    if type_name not in BULK_TYPES or not bulk_available() or n % ROW_ALIGN[type_name]:
        return False
    row_bytes = n // 256 * BLOCK_BYTES[type_name]
    warps, rows_per_warp, stages, split = default_launch(type_name, n, batch)
    if split > 1:                                     # gemv_bulk_split: a chunk per warp
        units = n // 256 // UNIT_BLOCKS[type_name]
        per_warp = -(-units // split) * UNIT_BLOCKS[type_name] * BLOCK_BYTES[type_name]
    else:
        per_warp = rows_per_warp * stages * row_bytes
    if 2 * warps * per_warp + SHARED_RESERVED > shared_limit():
        return False             # the default launch's rows (gated: and up rows) do not fit
    nbytes = rows * row_bytes
    if batch > 1:
        return type_name in BATCH_BULK
    if type_name == "Q4_K":
        return (n <= Q4K_MAX_N or type_name in LONG_SPLIT) and nbytes > Q4K_MIN_BYTES
    if type_name == "Q5_K":
        return n > LONG_ROW or nbytes > Q5K_MIN_BYTES
    if type_name in BULK_FROM_BYTES:
        least = BULK_FROM_BYTES[type_name]
        return least is not None and nbytes > least
    return nbytes > (L2_BYTES if type_name == "Q3_K" else Q6K_MIN_BYTES)


def default_launch(type_name: str, n: int, batch: int) -> tuple[int, int, int, int]:
    """(warps per block, rows per warp, ring stages, warps per row) of the default launch:
    one token TUNED, or LONG_SPLIT's split for rows over LONG_ROW values; 2..8 tokens
    BATCH_ROWS rows per warp (each token's activations loaded once for them), or for long
    rows up to BATCH_SPLIT_MAX tokens LONG_SPLIT's split."""
    if n > LONG_ROW and type_name in LONG_SPLIT and batch <= BATCH_SPLIT_MAX:
        warps, split = LONG_SPLIT[type_name]
        return warps, 1, 1, split
    if batch > 1:
        return 4, BATCH_ROWS, 1, 1
    return (*TUNED[type_name], 1)


def shared_limit() -> int:
    """Shared memory one block may opt in to on the current device (sm_120: ~99 KB)."""
    device = pk.current_device()
    return int(getattr(device, "max_shared_optin", MAX_SHARED_PER_BLOCK))


def resident_blocks(shared: int, threads: int) -> int:
    """Blocks of `shared` bytes of shared memory and `threads` threads that fit the GPU at once
    (the CPU target: 2)."""
    device = pk.current_device()
    if device.kind != "cuda":
        return 2
    sms = int(device.core.properties.multiprocessor_count)
    per_sm = min(SHARED_PER_SM // (shared + SHARED_RESERVED), 2048 // threads)
    return max(1, per_sm) * sms


def gemv_bulk_into(w, type_name: str, xq, y, rows: int, n: int, *, w2=None, res=None,
                   mode=None, stream=None, rows_per_warp: int | None = None,
                   warps: int | None = None, stages: int | None = None,
                   split: int | None = None, batch: int = 1):
    """y (batch, rows) = W x for `batch` tokens (1..MAX_BATCH), mode None, "residual" (+ res,
    (batch, rows)), "swiglu" / "geglu" (act(W x) * (W2 x), w2 the up rows): w / w2 u32 words of
    the rows (gemv.weight_words), xq their Q8_1 activations (batch, q8_1_bytes(n)); type_name
    one of BULK_TYPES. stages 1: one
    group of rows per warp, as many blocks as groups; >= 2: a ring of that many groups per
    warp and one wave of blocks that loop over the rows. split > 1 (with one row per warp and
    one stage): that many warps share each row (gemv_bulk_split)."""
    if type_name not in BULK_TYPES:
        raise ValueError(f"gemv bulk: no bulk-copy kernel for {type_name}; supported: "
                         f"{sorted(BULK_TYPES)}")
    what = f"gemv {type_name} bulk"
    if mode not in MODES:
        raise ValueError(f"{what}: mode {mode!r}, expected one of {list(MODES)}")
    glu = MODES[mode] >= MODE_SWIGLU
    if glu != (w2 is not None):
        raise ValueError(f"{what}: mode {mode!r} {'needs' if glu else 'takes no'} w2 (up rows)")
    if (mode == "residual") != (res is not None):
        raise ValueError(f"{what}: mode {mode!r} {'needs' if res is None else 'takes no'} res")
    if n % ROW_ALIGN[type_name]:
        raise ValueError(f"{what}: row length {n} must be a multiple of "
                         f"{ROW_ALIGN[type_name]} (16-byte rows for the bulk copies)")
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"{what}: batch {batch} outside 1..{MAX_BATCH}")
    if xq.nbytes < batch * q8_1_bytes(n) or y.size != batch * rows or y.dtype != np.float32:
        raise ValueError(f"{what}: activations of {xq.nbytes} bytes (need "
                         f"{batch * q8_1_bytes(n)}) or output {y.dtype} {tuple(y.shape)} (need "
                         f"float32 ({batch}, {rows})) do not fit")
    if res is not None and res.size != batch * rows:
        raise ValueError(f"{what}: residual of shape {tuple(res.shape)}, need ({batch}, {rows})")
    row_words = n // 256 * BLOCK_BYTES[type_name] // 4
    for name, buf in (("weights", w), ("w2", w2)):
        if buf is not None and (buf.ptr % 16 or buf.nbytes < rows * row_words * 4):
            raise ValueError(f"{what}: {name} must be a 16-byte aligned buffer of at least "
                             f"{rows} x {row_words * 4} bytes, got {buf.nbytes} bytes at "
                             f"offset {buf.ptr % 16} from 16-byte alignment")
    if rows_per_warp is None and stages is None and split is None:
        tuned_warps, rows_per_warp, stages, split = default_launch(type_name, n, batch)
        warps = warps or tuned_warps
    if split and split > 1:
        return _launch_split(w, type_name, xq, y, rows, n, w2, res, MODES[mode], stream,
                             warps or split, split, rows_per_warp or 1, stages or 1, batch)
    tuned = TUNED[type_name]
    warps = warps or tuned[0]
    rows_per_warp = rows_per_warp or tuned[1]
    stages = stages or tuned[2]
    per_block = warps * rows_per_warp
    grid = (rows + per_block - 1) // per_block
    shared = warps * stages * rows_per_warp * (1 + glu) * row_words * 4
    if stages > 1:
        grid = min(grid, resident_blocks(shared, 32 * warps))
    words = w.view(np.uint32)
    gemv_bulk[grid, 32 * warps, stream, shared](
        words, words if w2 is None else w2.view(np.uint32), xq.reshape(-1).view(np.uint32),
        y if res is None else res, y, rows, row_words, n // 256, q8_1_bytes(n) // 4,
        BULK_TYPES[type_name], rows_per_warp, warps, stages, MODES[mode], batch)


def _launch_split(w, type_name, xq, y, rows, n, w2, res, mode, stream, warps, split,
                  rows_per_warp, stages, batch):
    """gemv_bulk_split: `split` warps per row, `warps` per block (a multiple of split)."""
    what = f"gemv {type_name} bulk, rows split over {split} warps"
    unit_blocks = UNIT_BLOCKS[type_name]
    units = n // 256 // unit_blocks
    if rows_per_warp != 1 or stages != 1 or warps % split or units < split:
        raise ValueError(f"{what}: needs one row per warp, one stage, warps ({warps}) a "
                         f"multiple of the split and at least {split} units of {unit_blocks} "
                         f"blocks per row (got {rows_per_warp} rows per warp, {stages} stages, "
                         f"{units} units)")
    unit_words = unit_blocks * BLOCK_BYTES[type_name] // 4
    chunk_words = (units + split - 1) // split * unit_words
    glu = 1 if mode >= MODE_SWIGLU else 0
    per_block = warps // split
    words = w.view(np.uint32)
    gemv_bulk_split[(rows + per_block - 1) // per_block, 32 * warps, stream,
                    warps * (1 + glu) * chunk_words * 4](
        words, words if w2 is None else w2.view(np.uint32), xq.reshape(-1).view(np.uint32),
        y if res is None else res, y, rows, n // 256 * BLOCK_BYTES[type_name] // 4, unit_words,
        units, chunk_words, q8_1_bytes(n) // 4, BULK_TYPES[type_name], unit_blocks, warps,
        split, mode, batch)
