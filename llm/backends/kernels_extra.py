"""Small pykernel kernels the kernels backend needs beyond stdlib_kernels' public entry points.

Input: device arrays (pykernel Arrays, f32 activations unless said). Output: results written
into preallocated arrays (nothing allocated, so every launch can sit in a captured CUDA graph).

    attention_rows   causal attention of any head size (stdlib's decode kernel covers 64..256;
                     the tiny CI models use 16), the start position read from device memory
    kv_store         K/V rows into the cache at their positions (models without RoPE: gpt2)
    add_into         a += b                      add_bias    rows of y += bias
    copy_cols        a block of columns from one row-major array to another
    argmax_next      greedy id of the last logits row -> io[0] (-1: no finite logit, a broken
                     model); io[1] (the position) += 1 (many blocks, the last one merging:
                     stdlib's argmax_blocks plus the advance), so a replayed decode graph
                     feeds itself
    sample_into      the same with stdlib's sampler (top-k / top-p / min-p / temperature; -1
                     where it has nothing to draw from), its uniform taken from a
                     per-position table (take_uniform, advance_position)
    embed_generic    embedding rows of any GGUF type (stdlib's embedding covers five types);
                     an id out of range gives a NaN row, as stdlib's does
    matmul_rows      y = x @ W.T, one thread per output element, no barriers or shuffles: the
                     CPU target runs it as plain compiled loops (stdlib's GEMV, built for the
                     GPU, runs a coroutine per thread there and takes ~25 s per tiny forward);
                     Q8 mode reads Q8_1 activations (the values llama.cpp's quantized path sees)
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64, u8
from stdlib_kernels import _launch as L
from stdlib_kernels._device import finite, warp_sum
from stdlib_kernels._select import last_block_done
from stdlib_kernels.sample_kernels import parts_argmax, span_argmax
from stdlib_kernels.sampling import sample
from stdlib_kernels.quant.dequant_kernels import CODES, dequantize_one, load_half
from stdlib_kernels.quant.formats import get_format

MAX_HEAD_DIM = 256
NEG_INIT = -1.0e30  # running max before any key: finite, so exp(m_old - m_new) is never NaN
NAN = float("nan")


@pk.kernel
def attention_rows(q: Ptr[f32, "ro"], k_cache: Ptr["C", "ro"], v_cache: Ptr["C", "ro"],
                   out: Ptr[f32], start: Ptr[i32, "ro"], n_head: i32, n_kv: i32, max_len: i32,
                   scale: f32, window: i32, sinks: Ptr[f32, "ro"], D: Const[int],
                   NPL: Const[int], C: Const[pk.dtype], HAS_SINKS: Const[bool]):
    # grid (tokens, n_head), one warp per query head; lane owns dims lane + 32 * j (j < NPL).
    # Caches (n_kv, max_len, D); query t sits at position start[0] + t and sees keys
    # [max(0, pos - window + 1) if window else 0, pos]. HAS_SINKS: head h's softmax has one
    # more logit sinks[h] (gpt-oss; unscaled, no value): the running max starts there with
    # its exp(0) = 1 in the denominator
    t = pk.block_idx.x
    h = pk.block_idx.y
    lane = pk.lane_id()
    kvh = h // (n_head // n_kv)
    pos = start[0] + t
    lo = 0
    if window > 0:
        lo = max(0, pos - window + 1)
    row = (i64(t) * i64(n_head) + i64(h)) * i64(D)
    qv = pk.local_array(f32, NPL)
    acc = pk.local_array(f32, NPL)
    for j in pk.static_range(NPL):
        qv[j] = 0.0
        acc[j] = 0.0
        if lane + 32 * j < D:
            qv[j] = q[row + i64(lane + 32 * j)] * scale
    base = i64(kvh) * i64(max_len) * i64(D)
    m = f32(NEG_INIT)
    denom = f32(0.0)
    if HAS_SINKS:
        m = sinks[h]
        denom = f32(1.0)
    for key in range(lo, pos + 1):
        krow = base + i64(key) * i64(D)
        s = f32(0.0)
        for j in pk.static_range(NPL):
            if lane + 32 * j < D:
                s += qv[j] * f32(k_cache[krow + i64(lane + 32 * j)])
        s = warp_sum(s)
        m_new = max(m, s)
        corr = pk.exp(m - m_new)
        p = pk.exp(s - m_new)
        denom = denom * corr + p
        for j in pk.static_range(NPL):
            if lane + 32 * j < D:
                acc[j] = acc[j] * corr + p * f32(v_cache[krow + i64(lane + 32 * j)])
        m = m_new
    for j in pk.static_range(NPL):
        if lane + 32 * j < D:
            out[row + i64(lane + 32 * j)] = acc[j] / denom


@pk.kernel
def kv_store(k: Ptr[f32, "ro"], v: Ptr[f32, "ro"], k_cache: Ptr["C"], v_cache: Ptr["C"],
             start: Ptr[i32, "ro"], n_kv: i32, max_len: i32, D: i32, seq_stride: i64,
             C: Const[pk.dtype]):
    # grid (tokens, n_kv): row t of k/v (n_kv heads of D) -> caches[head, start[0] + t] of one
    # sequence (seq_stride 0), or (a batched decode) -> caches[t][head, start[t]] of sequence t,
    # seq_stride elements after sequence t - 1
    t = pk.block_idx.x
    h = pk.block_idx.y
    pos = start[0] + t
    base = i64(0)
    if seq_stride != i64(0):
        pos = start[t]
        base = i64(t) * seq_stride
    if pos >= 0 and pos < max_len:
        src = (i64(t) * i64(n_kv) + i64(h)) * i64(D)
        dst = base + (i64(h) * i64(max_len) + i64(pos)) * i64(D)
        for d in range(pk.thread_idx.x, D, pk.block_dim.x):
            k_cache[dst + i64(d)] = C(k[src + i64(d)])
            v_cache[dst + i64(d)] = C(v[src + i64(d)])


@pk.kernel
def add_into(a: Ptr[f32], b: Ptr[f32, "ro"], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        a[i] = a[i] + b[i]


@pk.kernel
def add_bias(y: Ptr[f32], bias: Ptr[f32, "ro"], total: i32, width: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < total:
        y[i] = y[i] + bias[i % width]


@pk.kernel
def copy_cols(src: Ptr[f32, "ro"], dst: Ptr[f32], width: i32, src_stride: i32, src_off: i32,
              dst_stride: i32, dst_off: i32):
    # grid (rows): dst[r, dst_off + c] = src[r, src_off + c] for c < width
    r = i64(pk.block_idx.x)
    for c in range(pk.thread_idx.x, width, pk.block_dim.x):
        dst[r * i64(dst_stride) + i64(dst_off + c)] = src[r * i64(src_stride) + i64(src_off + c)]


@pk.kernel
def argmax_next(x: Ptr[f32, "ro"], io: Ptr[i32], part_v: Ptr[f32], part_i: Ptr[i32],
                counter: Ptr[i32], n: i32, VEC: Const[int], UNITS: Const[int],
                ADVANCE: Const[bool]):
    # stdlib's multi-block argmax (sample_kernels.argmax_blocks: each block a span of
    # 4 * UNITS * block_dim logits, the last block to finish merges the blocks' results), whose
    # merging block also advances the position, in one launch (the single 1024-thread block it
    # replaces took ~50 us per token on a 128k vocabulary in the 8B profile). Ties go to the
    # lowest index.
    sv = pk.shared_array(f32, 32)
    si = pk.shared_array(i32, 32)
    flag = pk.shared_array(i32, 1)
    bv, bi = span_argmax(x, n, sv, si, UNITS, VEC)
    if pk.thread_idx.x == 0:
        part_v[pk.block_idx.x] = bv
        part_i[pk.block_idx.x] = bi
    if last_block_done(counter, 0, pk.grid_dim.x, flag):
        bv, bi = parts_argmax(part_v, part_i, 0, pk.grid_dim.x, sv, si)
        if pk.thread_idx.x == 0:
            # -1 where the row has no finite largest logit (all NaN, only -Inf, or +Inf: broken
            # weights): the host raises NonFiniteLogitsError on it, and a step already queued
            # behind embeds -1 as a NaN row (embed_rows checks ids), never out of range
            io[0] = bi if bi < n and finite(bv) else -1
            if ADVANCE:
                io[1] = io[1] + 1


@pk.kernel
def take_uniform(uniforms: Ptr[f32, "ro"], io: Ptr[i32, "ro"], u: Ptr[f32]):
    # u[0] = uniforms[io[1]]: the draw of the step at position io[1] (a sampled decode graph)
    if pk.thread_idx.x == 0:
        u[0] = uniforms[io[1]]


@pk.kernel
def advance_position(io: Ptr[i32]):
    # io[1] += 1, after a sampled decode graph's draw wrote its token to io[0]
    if pk.thread_idx.x == 0:
        io[1] = io[1] + 1


@pk.kernel
def embed_generic(table: Ptr[u8, "ro"], ids: Ptr[i32, "ro"], out: Ptr[f32], n: i32,
                  row_bytes: i32, vocab: i32, scale: f32, FMT: Const[int], BE: Const[int],
                  BB: Const[int]):
    # grid (tokens): out[t] = dequantized row ids[t] of the table, times scale; an id outside
    # [0, vocab) (a device pick's -1 for a broken row) gives a NaN row, never a wild read
    t = pk.block_idx.x
    tok = ids[t]
    valid = tok >= 0 and tok < vocab
    src = table + i64(tok if valid else 0) * i64(row_bytes)
    for c in range(pk.thread_idx.x, n, pk.block_dim.x):
        v = f32(NAN)
        if valid:
            v = dequantize_one(src + (c // BE) * BB, c % BE, FMT) * scale
        out[i64(t) * i64(n) + i64(c)] = v


@pk.kernel
def matmul_rows(w: Ptr[u8, "ro"], x: Ptr[f32, "ro"], xq: Ptr[u8, "ro"], y: Ptr[f32], rows: i32,
                k: i32, row_bytes: i32, y_stride: i32, y_off: i32, FMT: Const[int],
                BE: Const[int], BB: Const[int], Q8: Const[bool]):
    # grid (row blocks, tokens): y[t, y_off + r] = sum_c W[r, c] * x[t, c]
    r = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    t = pk.block_idx.y
    if r < rows:
        wrow = w + i64(r) * i64(row_bytes)
        xrow = xq + i64(t) * i64(k // 32 * 36)   # Q8_1 block (36 B): d:f16 | s:f16 | qs:i8[32]
        acc = f32(0.0)
        for c in range(k):
            wv = dequantize_one(wrow + (c // BE) * BB, c % BE, FMT)
            if Q8:
                blk = xrow + (c // 32) * 36
                q = i32(blk[4 + c % 32])
                q = q - 256 if q > 127 else q
                acc += wv * (load_half(blk, 0) * f32(q))
            else:
                acc += wv * x[i64(t) * i64(k) + i64(c)]
        y[i64(t) * i64(y_stride) + i64(y_off + r)] = acc


# --- launch wrappers ----------------------------------------------------------------------------
def attention(q, k_cache, v_cache, out, start, n_head: int, scale: float, window: int,
              stream=None, sinks=None) -> None:
    """q/out (tokens, n_head * D) f32; caches (n_kv, max_len, D); start: device int32 [pos];
    sinks: None, or device f32 (n_head,), one more logit per head's softmax."""
    n_kv, max_len, d = k_cache.shape
    if d > MAX_HEAD_DIM:
        raise ValueError(f"attention: head size {d} > {MAX_HEAD_DIM} is not supported")
    if sinks is not None and (sinks.dtype != np.float32 or sinks.size != n_head):
        raise ValueError(f"attention: sinks must be float32 ({n_head},), got {sinks.dtype} "
                         f"{tuple(sinks.shape)}")
    tokens = q.shape[0]
    args = (q, k_cache, v_cache, out, start, n_head, n_kv, max_len, scale, window,
            out if sinks is None else sinks)
    spec = (("D", d), ("NPL", -(-d // 32)), ("C", k_cache.dtype), ("HAS_SINKS", sinks is not None))
    L.launch(attention_rows, (tokens, n_head, 1), 32, args, spec, stream)


def store_kv(k, v, k_cache, v_cache, start, stream=None) -> None:
    """k, v rows (tokens, n_kv * D) into caches (n_kv, max_len, D) at start[0] + t, or into
    caches (tokens, n_kv, max_len, D) row t at start[t] (one token per sequence)."""
    n_kv, max_len, d = k_cache.shape[-3:]
    seq_stride = n_kv * max_len * d if k_cache.ndim == 4 else 0
    if seq_stride and k_cache.shape[0] != k.shape[0]:
        raise ValueError(f"store_kv: {k.shape[0]} rows for caches of {k_cache.shape[0]} "
                         f"sequences")
    args = (k, v, k_cache, v_cache, start, n_kv, max_len, d, seq_stride)
    L.launch(kv_store, (k.shape[0], n_kv, 1), L.threads_for(d, 256), args,
             (("C", k_cache.dtype),), stream)


def add(a, b, stream=None) -> None:
    n = a.size
    L.launch(add_into, -(-n // 256), 256, (a, b, n), (), stream)


def bias(y, b, stream=None) -> None:
    total = y.size
    L.launch(add_bias, -(-total // 256), 256, (y, b, total, b.size), (), stream)


def columns(src, dst, rows: int, width: int, src_off: int, dst_off: int, stream=None) -> None:
    """dst[:, dst_off:dst_off+width] = src[:, src_off:src_off+width] (row-major, f32)."""
    args = (src, dst, width, src.shape[-1], src_off, dst.shape[-1], dst_off)
    L.launch(copy_cols, rows, L.threads_for(width, 256), args, (), stream)


ARGMAX_THREADS = 256
ARGMAX_UNITS = 4                 # 4-logit units per thread: 4096 logits per block


def argmax_scratch(n: int) -> tuple:
    """Scratch of argmax_into for rows of n logits: per-block results and the ticket counter
    (zero; the kernel resets it). One per stream that launches it: two launches in flight on
    different streams must not share a counter."""
    blocks = -(-n // (4 * ARGMAX_UNITS * ARGMAX_THREADS))
    return pk.empty(blocks, np.float32), pk.empty(blocks, np.int32), pk.zeros(1, np.int32)


def argmax_into(x, io, advance: bool, scratch: tuple, stream=None) -> None:
    """io[0] = argmax of the f32 row x (n,); io[1] += 1 when `advance` (scratch: argmax_scratch
    (n), allocated before any graph capture)."""
    n = x.size
    part_v, part_i, counter = scratch
    if part_v.size * 4 * ARGMAX_UNITS * ARGMAX_THREADS < n:
        raise ValueError(f"argmax_into: scratch for {part_v.size} blocks, {n} logits given")
    spec = (("VEC", L.vector_width(n, x)), ("UNITS", ARGMAX_UNITS), ("ADVANCE", advance))
    L.launch(argmax_next, part_v.size, ARGMAX_THREADS, (x, io, part_v, part_i, counter, n),
             spec, stream)


def sample_into(x, io, uniforms, u, params, stream=None) -> None:
    """io[0] = stdlib's sampler's draw from the f32 row x (n,) with params' filters and
    temperature, using uniforms[io[1]] (copied to the device scalar u first); io[1] += 1.
    A row without a finite largest logit draws -1."""
    L.launch(take_uniform, 1, 32, (uniforms, io, u), (), stream)
    sample(x, u, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
           min_p=params.min_p, out=io[0:1], stream=stream)
    L.launch(advance_position, 1, 32, (io,), (), stream)


def embed_rows(table, type_name: str, ids, out, scale: float, stream=None) -> None:
    """out (tokens, n) = rows ids of a uint8 (vocab, row_bytes) table of GGUF type type_name
    (an id outside [0, vocab): a NaN row)."""
    fmt = get_format(type_name)
    n = out.shape[-1]
    args = (table, ids, out, n, table.shape[-1], table.shape[0], scale)
    spec = (("FMT", CODES[type_name]), ("BE", fmt.block_elems), ("BB", fmt.block_bytes))
    L.launch(embed_generic, out.shape[0], L.threads_for(n, 256), args, spec, stream)


def matmul(w, type_name: str, x, xq, y, rows: int, y_off: int, stream=None) -> None:
    """y[:, y_off:y_off+rows] = x @ W.T for W uint8 (rows, row_bytes) of type_name; x (n, k)
    f32, or xq (n, k/32*36) Q8_1 bytes when given."""
    fmt = get_format(type_name)
    n, k = x.shape
    args = (w, x, L.dummy(np.uint8) if xq is None else xq, y, rows, k, w.shape[-1],
            y.shape[-1], y_off)
    spec = (("FMT", CODES[type_name]), ("BE", fmt.block_elems), ("BB", fmt.block_bytes),
            ("Q8", xq is not None))
    L.launch(matmul_rows, (-(-rows // 64), n, 1), 64, args, spec, stream)
