"""Decode attention split kernel (flash-decoding): one query token per "row" z against a KV cache.

Input: q (n_z, n_head, D) f32; K/V caches of f16 (HALF=1) or f32 elements viewed as u32 words,
head-major: (n_kv_head, max_len, D) per z, consecutive z `cache_z_stride` elements apart (0 when
every z shares one cache, as the prefill fallback does); kv_len(z) = lens[z * lens_stride] +
len_add + z * len_step, read from device memory so a CUDA graph replays with new lengths.
Output: either the normalised result out (n_z, n_head, D) f32 (direct, one split), or per split
the unnormalised partial sum part_o (n_z, n_head, n_splits, D) with its running max and
denominator part_ml (n_z, n_head, n_splits, 2). With FUSED the split blocks of one head group
count themselves on `counters` (one int32 per (z, head group), zero between launches) and the
last one combines the partials into out (decode_combine.combine_rows) in the same launch;
otherwise the `combine_splits` kernel does. With SINK each head's learned sink logit
(`sinks`, (n_head,) f32; gpt-oss) joins the softmax denominator where the result is normalised
(the direct write, the cluster merge or the combine), once per head, never in a split's partial.

Work split: grid (n_splits, n_kv_head * n_sub, n_z); a block owns one KV head, GB of its query
heads and one contiguous slice of the key range, so each K/V row is read once for GB heads.
Inside a warp, L lanes share one key row: lane li reads 16-byte chunks li, li + L, ... (NCH per
lane, CH elements each), so a warp reads KPW = 32 / L consecutive rows = contiguous memory.
A "stage" is U rows per row group (U * KPW consecutive keys per warp); a warp keeps P stages of
raw K/V words in registers, a ring: while one stage is scored, the loads of the next P - 1 are
in flight, so each thread has (P - 1) * U * NCH * 32 bytes of HBM reads outstanding. Loads are
never behind a branch (keys past the range are clamped to its last key and masked), so the
compiler issues them back to back; raw words are converted to f32 where they are used, which
keeps the registers of the ring small.
Scores are kept in the log2 domain (q pre-scaled by scale * log2(e)) so exp2 is one instruction.
Under PDL (graphs captured with pdl=True), with TRIGGER the next kernel may launch at once (the
grid is one wave), and with EARLY_KV (the caller's promise, `launch_decode(early_kv=True)`:
the kernels before this one in the graph write neither the length table nor any cache row but
each sequence's newest, kv_len - 1) the block reads kv_len and issues its first K/V loads before
`pk.grid_dependency_wait()` when its range ends at least two rows before the newest one (so no
128-byte line it loads early holds part of the newest row: L1 is not coherent); other blocks,
q and everything else load after the wait. (decode_mma's direct launches also load early the
rows before kv_len - 2 and the newest rows per lane after the wait.)
Register arrays are indexed only with compile-time indices (static_range) so they stay in
registers; the kernel body is long for that reason.
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from .._select import last_block_done
from ..quant.q8_1 import store_q8_1_block
from .decode_combine import MASKED, NEG_INIT, combine_rows, with_sink

LOG2E = 1.4426950408889634


@pk.func
def visible_range(kv_len: i32, window: i32, split: i32, n_splits: i32) -> tuple:
    """Keys [k0, k1) of this split: the visible keys are [max(0, kv_len - window), kv_len)."""
    lo = 0
    if window > 0:
        lo = max(0, kv_len - window)
    chunk = (kv_len - lo + n_splits - 1) // n_splits
    k0 = lo + split * chunk
    k1 = min(kv_len, k0 + chunk)
    return k0, k1


@pk.func
def begin_block(TRIGGER: Const[int], EARLY_KV: Const[int]):
    """Block start: early trigger; the wait for the previous kernel here unless EARLY_KV."""
    if TRIGGER:
        pk.launch_dependents()
    if not EARLY_KV:
        pk.grid_dependency_wait()


@pk.func
def loads_before_wait(k1: i32, kv_len: i32, EARLY_KV: Const[int]) -> bool:
    """EARLY_KV: may this block load its first tiles before the wait (see the docstring)?"""
    return EARLY_KV != 0 and k1 + 1 < kv_len


@pk.func
def block_work(lens, lens_stride: i32, len_add: i32, len_step: i32, window: i32, n_head: i32,
               n_kv_head: i32, GB: Const[int]) -> tuple:
    """This block's sequence z, split, KV head, first query head h0, key range [k0, k1) and
    kv_len (grid: splits x (KV heads x head sub-groups of GB) x sequences)."""
    z = pk.block_idx.z
    split = pk.block_idx.x
    group = n_head // n_kv_head
    n_sub = group // GB
    kvh = pk.block_idx.y // n_sub
    h0 = kvh * group + (pk.block_idx.y % n_sub) * GB
    kv_len = lens[z * lens_stride] + len_add + z * len_step
    k0, k1 = visible_range(kv_len, window, split, pk.grid_dim.x)
    return z, split, kvh, h0, k0, k1, kv_len


@pk.func
def merge_warp_parts(sm_acc, sm_m, sm_den, g: i32, d: i32, D: Const[int], GB: Const[int],
                     NWARPS: Const[int]):
    """(unnormalised sum, max, denominator) of head g, value d over the block's warps, from
    their parts in shared memory ((NWARPS, GB[, D]))."""
    m_all = f32(NEG_INIT)
    for w in pk.static_range(NWARPS):
        m_all = max(m_all, sm_m[w * GB + g])
    total = f32(0.0)
    o = f32(0.0)
    for w in pk.static_range(NWARPS):
        weight = fast_exp2(sm_m[w * GB + g] - m_all)
        total += sm_den[w * GB + g] * weight
        o += sm_acc[(w * GB + g) * D + d] * weight
    return o, m_all, total


@pk.func
def write_block_result(sm_acc, sm_m, sm_den, z: i32, h0: i32, split: i32, n_head: i32,
                       direct: i32, out, part_o, part_ml, xq, sinks, D: Const[int],
                       GB: Const[int], NWARPS: Const[int], Q8OUT: Const[int],
                       CLUSTER: Const[int], SINK: Const[int]):
    """The warps' (max, denominator, unnormalised sum) per head, in shared memory as
    (NWARPS, GB[, D]), merged and written: normalised into out (direct) or as one split's
    partial. Every thread of the block takes part (after a barrier). Q8OUT (direct only, D %
    32 == 0): the GB head rows also go to xq as Q8_1 (decode_combine.combine_splits' Q8OUT),
    straight from the registers: a warp's 32 lanes hold 32 consecutive values of one head row,
    i.e. one Q8_1 block, in every round of the loop. CLUSTER: the
    split blocks of a head group form one cluster and merge through distributed shared memory
    (cluster_merge) instead of writing partials."""
    if CLUSTER:
        cluster_merge(sm_acc, sm_m, sm_den, z, h0, n_head, out, xq, sinks, D, GB, NWARPS, Q8OUT,
                      SINK)
        return
    n_splits = pk.grid_dim.x
    for t in range(pk.thread_idx.x, GB * D, NWARPS * 32):
        g = t // D
        d = t % D
        o, m_all, total = merge_warp_parts(sm_acc, sm_m, sm_den, g, d, D, GB, NWARPS)
        head_row = z * n_head + h0 + g
        if direct != 0:
            value = o / with_sink(total, m_all, sinks, h0 + g, SINK)
            out[head_row * D + d] = value
            if Q8OUT:
                store_q8_1_block(value, pk.lane_id(), xq, (head_row * D + d) // 32)
        else:
            part_o[(head_row * n_splits + split) * D + d] = o
            if d == 0:
                part_ml[(head_row * n_splits + split) * 2] = m_all
                part_ml[(head_row * n_splits + split) * 2 + 1] = total


@pk.func
def cluster_merge(sm_acc, sm_m, sm_den, z: i32, h0: i32, n_head: i32, out, xq, sinks,
                  D: Const[int], GB: Const[int], NWARPS: Const[int], Q8OUT: Const[int],
                  SINK: Const[int]):
    """One launch without partials in global memory: each split block merges its warps into
    its own shared (o, m, den) per head; after a cluster barrier every warp of the cluster
    takes 32-value pieces of the GB output rows, reads that piece of every split block
    (pk.cluster_map), writes it normalised (Q8OUT: also as one Q8_1 block), and a last
    barrier keeps every block's shared memory alive until all reads are done. D % 32 == 0."""
    blk_o = pk.shared_array(f32, GB * D)
    blk_ml = pk.shared_array(f32, 2 * GB)
    for t in range(pk.thread_idx.x, GB * D, NWARPS * 32):
        g = t // D
        o, m_all, total = merge_warp_parts(sm_acc, sm_m, sm_den, g, t % D, D, GB, NWARPS)
        blk_o[t] = o
        if t % D == 0:
            blk_ml[2 * g] = m_all
            blk_ml[2 * g + 1] = total
    pk.cluster_sync()
    n_splits = pk.cluster_size()
    lane = pk.lane_id()
    piece = pk.cluster_rank() * NWARPS + pk.thread_idx.x // 32
    while piece < GB * (D // 32):
        g = piece // (D // 32)
        d = piece % (D // 32) * 32 + lane
        m_all = f32(NEG_INIT)
        for sp in range(n_splits):
            m_all = max(m_all, pk.cluster_map(blk_ml, sp)[2 * g])
        total = f32(0.0)
        o = f32(0.0)
        for sp in range(n_splits):
            ml = pk.cluster_map(blk_ml, sp)
            weight = fast_exp2(ml[2 * g] - m_all)
            total += ml[2 * g + 1] * weight
            o += pk.cluster_map(blk_o, sp)[g * D + d] * weight
        v = o / with_sink(total, m_all, sinks, h0 + g, SINK)
        row = z * n_head + h0 + g
        out[row * D + d] = v
        if Q8OUT:
            store_q8_1_block(v, lane, xq, (row * D + d - lane) // 32)
        piece += n_splits * NWARPS
    pk.cluster_sync()


@pk.func
def combine_if_last(counters, part_o, part_ml, out, z: i32, h0: i32, n_head: i32, direct: i32,
                    sinks, GB: Const[int], D: Const[int], NWARPS: Const[int], SG: Const[int],
                    TPG: Const[int], MAXS: Const[int], UNR: Const[int], SINK: Const[int]):
    """FUSED: the split block that finishes its head group last combines every split of it,
    so one launch does the whole attention (no second kernel's launch latency)."""
    if direct == 0:
        done = pk.shared_array(i32, 1)
        n_splits = pk.grid_dim.x
        if last_block_done(counters, z * pk.grid_dim.y + pk.block_idx.y, n_splits, done):
            sm_w = pk.shared_array(f32, GB * MAXS)
            sm_den = pk.shared_array(f32, GB)
            sm_red = pk.shared_array(f32, NWARPS * 32 * 4)
            combine_rows(part_o, part_ml, out, z * n_head + h0, n_splits, sm_w, sm_den,
                         sm_red, sinks, h0, GB, D, NWARPS, SG, TPG, MAXS, UNR, SINK)


@pk.func
def fast_exp2(x: f32) -> f32:
    return pk.fast.exp2(x)


@pk.func
def word_elements(word: u32, HALF: Const[int]) -> tuple:
    """The f32 elements of one cache word: two halves (f16 cache) or the word itself."""
    if HALF:
        return pk.unpack_f16x2(word)
    else:
        return pk.bitcast(word, f32), f32(0.0)


@pk.func
def score_stage(kb, vb, qv, acc, m, den, s, slot: i32, stage: i32, row: i32, k1: i32,
                softcap: f32, GB: Const[int], U: Const[int], L: Const[int], LOG2L: Const[int],
                LOG2KPW: Const[int], CH: Const[int], NCH: Const[int], HALF: Const[int]):
    """One stage (U keys per row group, raw words at ring slot `slot`): scores, online-softmax
    update and acc += p * V for the GB heads. Each word is converted once and used for every
    head right away (word-outer loops), so converted values never pile up in registers."""
    for u in pk.static_range(U):
        for g in pk.static_range(GB):
            s[u * GB + g] = 0.0
        for j in pk.static_range(NCH):
            for w in pk.static_range(4):
                x0, x1 = word_elements(kb[((slot + u) * NCH + j) * 4 + w], HALF)
                for g in pk.static_range(GB):
                    qi = (g * NCH + j) * CH + w * (1 + HALF)
                    s[u * GB + g] = pk.fma(qv[qi], x0, s[u * GB + g])
                    if HALF:
                        s[u * GB + g] = pk.fma(qv[qi + 1], x1, s[u * GB + g])
        visible = stage + (u << LOG2KPW) + row < k1
        for g in pk.static_range(GB):
            part = s[u * GB + g]
            for r in pk.static_range(LOG2L):
                part += pk.shfl_xor(part, (L >> 1) >> r)
            if softcap > 0.0:
                part = softcap * pk.tanh(part / softcap) * LOG2E
            s[u * GB + g] = part if visible else MASKED
    for g in pk.static_range(GB):
        m_new = m[g]
        for u in pk.static_range(U):
            m_new = max(m_new, s[u * GB + g])
        if m_new > m[g]:
            # rescale only when the running max grows (rare after the first keys): the
            # multiplications by 1.0 it skips were a fifth of the f16 kernel's instructions
            corr = fast_exp2(m[g] - m_new)
            m[g] = m_new
            den[g] = den[g] * corr
            for i in pk.static_range(NCH * CH):
                acc[g * NCH * CH + i] = acc[g * NCH * CH + i] * corr
        for u in pk.static_range(U):
            s[u * GB + g] = fast_exp2(s[u * GB + g] - m[g])
            den[g] += s[u * GB + g]
    for j in pk.static_range(NCH):
        for w in pk.static_range(4):
            for u in pk.static_range(U):
                y0, y1 = word_elements(vb[((slot + u) * NCH + j) * 4 + w], HALF)
                for g in pk.static_range(GB):
                    ai = (g * NCH + j) * CH + w * (1 + HALF)
                    acc[ai] = pk.fma(s[u * GB + g], y0, acc[ai])
                    if HALF:
                        acc[ai + 1] = pk.fma(s[u * GB + g], y1, acc[ai + 1])


@pk.func
def merge_and_store(acc, m, den, warp: i32, row: i32, li: i32, z: i32, h0: i32, split: i32,
                    n_head: i32, direct: i32, out, part_o, part_ml, xq, sinks,
                    D: Const[int], GB: Const[int], NWARPS: Const[int], L: Const[int],
                    LOG2KPW: Const[int], CH: Const[int], NCH: Const[int], Q8OUT: Const[int],
                    SINK: Const[int]):
    """Merge the KPW row groups of each warp (shuffles, lanes L, 2L, ... apart), then the warps
    through shared memory ((NWARPS, GB, D) sums, (NWARPS, GB) max/denominator), and write the
    block's result: normalised into out (direct) or as one split's partial."""
    for r in pk.static_range(LOG2KPW):
        for g in pk.static_range(GB):
            m_o = pk.shfl_xor(m[g], L << r)
            den_o = pk.shfl_xor(den[g], L << r)
            m_new = max(m[g], m_o)
            c_self = fast_exp2(m[g] - m_new)
            c_other = fast_exp2(m_o - m_new)
            m[g] = m_new
            den[g] = den[g] * c_self + den_o * c_other
            for i in pk.static_range(NCH * CH):
                a = acc[g * NCH * CH + i]
                acc[g * NCH * CH + i] = a * c_self + pk.shfl_xor(a, L << r) * c_other
    sm_acc = pk.shared_array(f32, NWARPS * GB * D)
    sm_m = pk.shared_array(f32, NWARPS * GB)
    sm_den = pk.shared_array(f32, NWARPS * GB)
    if row == 0:
        for g in pk.static_range(GB):
            if li == 0:
                sm_m[warp * GB + g] = m[g]
                sm_den[warp * GB + g] = den[g]
            for j in pk.static_range(NCH):
                c = j * L + li
                if c * CH < D:
                    for e in pk.static_range(CH):
                        sm_acc[(warp * GB + g) * D + c * CH + e] = acc[(g * NCH + j) * CH + e]
    pk.syncthreads()
    write_block_result(sm_acc, sm_m, sm_den, z, h0, split, n_head, direct, out, part_o, part_ml,
                       xq, sinks, D, GB, NWARPS, Q8OUT, 0, SINK)


@pk.func
def simt_prologue(kp, vp, kb, vb, first: i32, stride: i32, row: i32, li: i32, last_key: i32,
                  words: i32, U: Const[int], P: Const[int], L: Const[int],
                  LOG2KPW: Const[int], NCH: Const[int], LAST_CHUNK: Const[int]):
    """The ring's first P - 1 stages: raw K/V chunks of keys first + p * stride + ..."""
    for p in pk.static_range(P - 1):
        for u in pk.static_range(U):
            key = min(first + p * stride + (u << LOG2KPW) + row, last_key)
            for j in pk.static_range(NCH):
                at = key * words + min(j * L + li, LAST_CHUNK) * 4
                kw = pk.load_vec(kp, at, 4)
                vw = pk.load_vec(vp, at, 4)
                for w in pk.static_range(4):
                    kb[((p * U + u) * NCH + j) * 4 + w] = kw[w]
                    vb[((p * U + u) * NCH + j) * 4 + w] = vw[w]


@pk.kernel
def decode_partial(q: Ptr[f32], k_cache: Ptr[u32, "ro"], v_cache: Ptr[u32, "ro"],
                   lens: Ptr[i32, "ro"], lens_stride: i32, len_add: i32, len_step: i32,
                   cache_z_stride: i64, max_len: i32, n_head: i32, n_kv_head: i32,
                   q_scale: f32, softcap: f32, window: i32, direct: i32,
                   out: Ptr[f32], part_o: Ptr[f32], part_ml: Ptr[f32], counters: Ptr[i32],
                   xq: Ptr[u32],
                   D: Const[int], GB: Const[int], NWARPS: Const[int], U: Const[int],
                   P: Const[int], L: Const[int], LOG2L: Const[int], LOG2KPW: Const[int],
                   CH: Const[int], NCH: Const[int], HALF: Const[int], FUSED: Const[int],
                   SG: Const[int], TPG: Const[int], MAXS: Const[int], UNR: Const[int],
                   TRIGGER: Const[int], EARLY_KV: Const[int], Q8OUT: Const[int],
                   sinks: Ptr[f32, "ro"], SINK: Const[int]):
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    row = lane // L                          # which key of the warp's KPW keys
    li = lane % L                            # which 16-byte chunks of that key
    begin_block(TRIGGER, EARLY_KV)
    z, split, kvh, h0, k0, k1, kv_len = block_work(lens, lens_stride, len_add, len_step, window,
                                                   n_head, n_kv_head, GB)
    words = D * (2 - HALF) // 2              # u32 words per cache row
    base_off = (i64(z) * cache_z_stride + i64(kvh) * i64(max_len) * i64(D)) * (2 - HALF) // 2
    kp = k_cache + base_off
    vp = v_cache + base_off
    last_key = max(0, k1 - 1)

    # the ring's first stages load before q (EARLY_KV: possibly before the wait, while q may
    # still be being written by the previous kernel)
    kb = pk.local_array(u32, P * U * NCH * 4)    # the ring: P stages of raw 16-byte chunks
    vb = pk.local_array(u32, P * U * NCH * 4)
    s = pk.local_array(f32, U * GB)
    stage_keys = U << LOG2KPW
    stride = NWARPS * stage_keys             # keys of one stage of the whole block
    first = k0 + warp * stage_keys
    early = loads_before_wait(k1, kv_len, EARLY_KV)
    if early:
        simt_prologue(kp, vp, kb, vb, first, stride, row, li, last_key, words, U, P, L,
                      LOG2KPW, NCH, D // CH - 1)
    if EARLY_KV:
        pk.grid_dependency_wait()
    if not early:
        simt_prologue(kp, vp, kb, vb, first, stride, row, li, last_key, words, U, P, L,
                      LOG2KPW, NCH, D // CH - 1)

    # q chunks of the GB heads in registers, pre-scaled; chunks past D (D/CH not a multiple
    # of L, e.g. D = 80) stay zero: those lanes re-read the last chunk and contribute nothing
    qv = pk.local_array(f32, GB * NCH * CH)
    acc = pk.local_array(f32, GB * NCH * CH)
    m = pk.local_array(f32, GB)
    den = pk.local_array(f32, GB)
    for g in pk.static_range(GB):
        m[g] = NEG_INIT
        den[g] = 0.0
        for j in pk.static_range(NCH):
            c = j * L + li
            for e in pk.static_range(CH):
                acc[(g * NCH + j) * CH + e] = 0.0
                qv[(g * NCH + j) * CH + e] = 0.0
                if c * CH < D:
                    q_index = (z * n_head + h0 + g) * D + c * CH + e
                    qv[(g * NCH + j) * CH + e] = q[q_index] * q_scale

    base = first
    while base < k1:
        for p in pk.static_range(P):
            # refill the slot scored last (P - 1 stages ahead), then score slot p
            refill = (p + P - 1) % P
            for u in pk.static_range(U):
                key = min(base + (p + P - 1) * stride + (u << LOG2KPW) + row, last_key)
                for j in pk.static_range(NCH):
                    at = key * words + min(j * L + li, D // CH - 1) * 4
                    kw = pk.load_vec(kp, at, 4)
                    vw = pk.load_vec(vp, at, 4)
                    for w in pk.static_range(4):
                        kb[((refill * U + u) * NCH + j) * 4 + w] = kw[w]
                        vb[((refill * U + u) * NCH + j) * 4 + w] = vw[w]
            stage = base + p * stride
            if stage < k1:
                score_stage(kb, vb, qv, acc, m, den, s, p * U, stage, row, k1, softcap,
                            GB, U, L, LOG2L, LOG2KPW, CH, NCH, HALF)
        base += P * stride
    merge_and_store(acc, m, den, warp, row, li, z, h0, split, n_head, direct, out,
                    part_o, part_ml, xq, sinks, D, GB, NWARPS, L, LOG2KPW, CH, NCH, Q8OUT, SINK)
    if FUSED:
        combine_if_last(counters, part_o, part_ml, out, z, h0, n_head, direct, sinks, GB, D,
                        NWARPS, SG, TPG, MAXS, UNR, SINK)
