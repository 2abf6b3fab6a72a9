"""Decode attention kernels (flash-decoding): one query token per "row" z against a KV cache.

Input: q (n_z, n_head, D) f32; K/V caches of f16 (HALF=1) or f32 elements viewed as u32 words,
head-major: (n_kv_head, max_len, D) per z, consecutive z `cache_z_stride` elements apart (0 when
every z shares one cache, as the prefill fallback does); kv_len(z) = lens[z * lens_stride] +
len_add + z * len_step, read from device memory so a CUDA graph replays with new lengths.
Output: either the normalised result out (n_z, n_head, D) f32 (direct, one split), or per split
the unnormalised partial sum part_o (n_z, n_head, n_splits, D) with its running max and
denominator part_ml (n_z, n_head, n_splits, 2). The split blocks of one head group count
themselves on `counters` (one int32 per (z, head group), zero between launches); with FUSED the
last one to finish combines the partials into out (one launch), else `combine_splits` does.

Work split: grid (n_splits, n_kv_head * n_sub, n_z); a block owns one KV head, GB of its query
heads and one contiguous slice of the key range, so each K/V row is read once for GB heads.
Inside a warp, L lanes share one key row: lane li reads 16-byte chunks li, li + L, ... (NCH per
lane, CH elements each), so a warp reads KPW = 32 / L consecutive rows = contiguous memory.
Scores are kept in the log2 domain (q pre-scaled by scale * log2(e)) so exp2 is one instruction.
Register arrays are indexed only with compile-time indices (static_range) so they stay in
registers; the kernel body is long for that reason.
"""
import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u32

from .._select import last_block_done

NEG_INIT = -1.0e30   # running max before any key: finite, so exp2(m_old - m_new) is never NaN
MASKED = -3.0e38     # score of a key outside the visible range: exp2(MASKED - m) == 0
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
def fast_exp2(x: f32) -> f32:
    return pk.fast.exp2(x)


@pk.kernel
def decode_partial(q: Ptr[f32, "ro"], k_cache: Ptr[u32, "ro"], v_cache: Ptr[u32, "ro"],
                   lens: Ptr[i32, "ro"], lens_stride: i32, len_add: i32, len_step: i32,
                   cache_z_stride: i64, max_len: i32, n_head: i32, n_kv_head: i32,
                   q_scale: f32, softcap: f32, window: i32, direct: i32,
                   out: Ptr[f32], part_o: Ptr[f32], part_ml: Ptr[f32], counters: Ptr[i32],
                   D: Const[int], GB: Const[int], NWARPS: Const[int], U: Const[int],
                   L: Const[int], LOG2L: Const[int], LOG2KPW: Const[int], CH: Const[int],
                   NCH: Const[int], HALF: Const[int], FUSED: Const[int]):
    lane = pk.lane_id()
    warp = pk.thread_idx.x // 32
    row = lane // L                          # which key of the warp's KPW keys
    li = lane % L                            # which 16-byte chunks of that key
    z = pk.block_idx.z
    split = pk.block_idx.x
    n_splits = pk.grid_dim.x
    group = n_head // n_kv_head
    n_sub = group // GB
    kvh = pk.block_idx.y // n_sub
    h0 = kvh * group + (pk.block_idx.y % n_sub) * GB
    kv_len = lens[z * lens_stride] + len_add + z * len_step
    k0, k1 = visible_range(kv_len, window, split, n_splits)
    base_elems = i64(z) * cache_z_stride + i64(kvh) * i64(max_len) * i64(D)
    base_off = base_elems * (2 - HALF) // 2  # in u32 words
    kp = k_cache + base_off
    vp = v_cache + base_off

    # q chunks of the GB heads in registers, pre-scaled; chunks past D (D/CH not a multiple
    # of L, e.g. D = 80) stay zero and their lanes never touch memory
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

    # software pipeline: the loads of the next U keys per row group are in flight while the
    # current ones are scored and accumulated (the pass with base < first only issues loads)
    kn = pk.local_array(u32, U * NCH * 4)    # raw 16-byte chunks: next keys
    vn = pk.local_array(u32, U * NCH * 4)
    kf = pk.local_array(f32, U * NCH * CH)   # current keys, converted
    vf = pk.local_array(f32, U * NCH * CH)
    s = pk.local_array(f32, U * GB)
    for i in pk.static_range(U * NCH * 4):
        kn[i] = u32(0)
        vn[i] = u32(0)
    stride = NWARPS * (U << LOG2KPW)
    first = k0 + warp * (U << LOG2KPW)
    base = first - stride
    while base < k1:
        for i in pk.static_range(U * NCH * 4):
            word = kn[i]
            vword = vn[i]
            if HALF:
                k_lo, k_hi = pk.unpack_f16x2(word)
                v_lo, v_hi = pk.unpack_f16x2(vword)
                kf[2 * i] = k_lo
                kf[2 * i + 1] = k_hi
                vf[2 * i] = v_lo
                vf[2 * i + 1] = v_hi
            else:
                kf[i] = pk.bitcast(word, f32)
                vf[i] = pk.bitcast(vword, f32)
        nxt = base + stride
        if nxt < k1:
            for u in pk.static_range(U):
                key = min(nxt + (u << LOG2KPW) + row, k1 - 1)   # clamped: masked later
                for j in pk.static_range(NCH):
                    c = j * L + li
                    if c * CH < D:
                        at = key * (D * (2 - HALF) // 2) + c * 4
                        kw = pk.load_vec(kp, at, 4)
                        vw = pk.load_vec(vp, at, 4)
                        for w in pk.static_range(4):
                            kn[(u * NCH + j) * 4 + w] = kw[w]
                            vn[(u * NCH + j) * 4 + w] = vw[w]
                    else:
                        for w in pk.static_range(4):
                            kn[(u * NCH + j) * 4 + w] = u32(0)
                            vn[(u * NCH + j) * 4 + w] = u32(0)
        if base >= first:
            for u in pk.static_range(U):
                visible = base + (u << LOG2KPW) + row < k1
                for g in pk.static_range(GB):
                    part = f32(0.0)
                    for i in pk.static_range(NCH * CH):
                        part = pk.fma(qv[g * NCH * CH + i], kf[u * NCH * CH + i], part)
                    for r in pk.static_range(LOG2L):
                        part += pk.shfl_xor(part, (L >> 1) >> r)
                    if softcap > 0.0:
                        part = softcap * pk.tanh(part / softcap) * LOG2E
                    s[u * GB + g] = part if visible else MASKED
            for g in pk.static_range(GB):
                m_new = m[g]
                for u in pk.static_range(U):
                    m_new = max(m_new, s[u * GB + g])
                corr = fast_exp2(m[g] - m_new)
                m[g] = m_new
                den[g] = den[g] * corr
                for u in pk.static_range(U):
                    s[u * GB + g] = fast_exp2(s[u * GB + g] - m_new)
                    den[g] += s[u * GB + g]
                for i in pk.static_range(NCH * CH):
                    a = acc[g * NCH * CH + i] * corr
                    for u in pk.static_range(U):
                        a = pk.fma(s[u * GB + g], vf[u * NCH * CH + i], a)
                    acc[g * NCH * CH + i] = a
        base = nxt

    # merge the KPW row groups of the warp (lanes L, 2L, ... apart)
    for r in pk.static_range(LOG2KPW):
        for g in pk.static_range(GB):
            m_o = pk.shfl_xor(m[g], L << r)
            den_o = pk.shfl_xor(den[g], L << r)
            m_new = max(m[g], m_o)
            c_self = fast_exp2(m[g] - m_new)
            c_other = fast_exp2(m_o - m_new)
            m[g] = m_new
            den[g] = den[g] * c_self + den_o * c_other
            for j in pk.static_range(NCH):
                for e in pk.static_range(CH):
                    a = acc[(g * NCH + j) * CH + e]
                    acc[(g * NCH + j) * CH + e] = a * c_self + pk.shfl_xor(a, L << r) * c_other

    # merge the warps through shared memory: (NWARPS, GB, D) sums, (NWARPS, GB) max/denominator
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
    for t in range(pk.thread_idx.x, GB * D, NWARPS * 32):
        g = t // D
        d = t % D
        m_all = f32(NEG_INIT)
        for w in range(NWARPS):
            m_all = max(m_all, sm_m[w * GB + g])
        total = f32(0.0)
        o = f32(0.0)
        for w in range(NWARPS):
            weight = fast_exp2(sm_m[w * GB + g] - m_all)
            total += sm_den[w * GB + g] * weight
            o += sm_acc[(w * GB + g) * D + d] * weight
        head_row = z * n_head + h0 + g
        if direct != 0:
            out[head_row * D + d] = o / total
        else:
            part_o[(head_row * n_splits + split) * D + d] = o
            if d == 0:
                part_ml[(head_row * n_splits + split) * 2] = m_all
                part_ml[(head_row * n_splits + split) * 2 + 1] = total
    if FUSED:
        # the block that finishes its head group last combines every split of it, so one
        # launch does the whole attention (no second kernel's launch latency)
        if direct == 0:
            done = pk.shared_array(i32, 1)
            if last_block_done(counters, z * pk.grid_dim.y + pk.block_idx.y, n_splits, done):
                combine_rows(part_o, part_ml, out, z * n_head + h0, GB, n_splits, D)


@pk.func
def combine_rows(part_o, part_ml, out, row0: i32, rows: i32, n_splits: i32, D: i32):
    """Rows row0 .. row0 + rows - 1 of out, the block's threads striding over (row, d):
    out = sum_s o_s 2^(m_s - M) / sum_s l_s 2^(m_s - M). part_o/part_ml are written by other
    blocks of this launch, so they are read with coherent (not read-only cache) loads."""
    for t in range(pk.thread_idx.x, rows * D, pk.block_dim.x):
        head_row = row0 + t // D
        d = t % D
        ml = head_row * n_splits * 2
        m_all = f32(NEG_INIT)
        for sp in range(n_splits):
            m_all = max(m_all, part_ml[ml + 2 * sp])
        total = f32(0.0)
        o = f32(0.0)
        for sp in range(n_splits):
            weight = fast_exp2(part_ml[ml + 2 * sp] - m_all)
            total += part_ml[ml + 2 * sp + 1] * weight
            o += part_o[(head_row * n_splits + sp) * D + d] * weight
        out[head_row * D + d] = o / total


@pk.kernel
def combine_splits(part_o: Ptr[f32], part_ml: Ptr[f32], out: Ptr[f32], n_splits: i32,
                   D: Const[int]):
    """Two-launch variant (a workspace without counters): one block per (z, head) row."""
    combine_rows(part_o, part_ml, out, pk.block_idx.x, 1, n_splits, D)
