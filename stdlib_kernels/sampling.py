"""Sampling on the device, so a decode step moves one int32 token id to the host: greedy
argmax, temperature + top-k + top-p + min-p sampling from logits with a given uniform random
number, and repetition/presence/frequency penalties; numpy references next to them. Also each
row's largest logits as a short candidate list (top_k_candidates, top_k_rows.py) for samplers
that run on the host, and one draw per row of a batch with each row's own uniform and filters
(sample_rows, sample_rows.py: a server step's requests).

Input: logits (vocab,) f32 ((rows, vocab) for argmax), u (a device float32 array of 1, or a
float) in [0, 1), history (n,) int32 of recent token ids (entries < 0 are empty slots, so a
fixed-size ring buffer can be replayed in a CUDA graph). Output: int32 token ids.

Semantics (llama.cpp's sampler chain order): penalties -> top-k -> top-p -> min-p ->
temperature -> draw. Argmax ties go to the lowest index; NaN logits are never chosen.
top-k keeps logits >= the k-th largest (ties at that value are all kept); top-p keeps the
largest logits whose softmax mass (over the top-k survivors, temperature 1) first reaches p;
min-p keeps p_i >= min_p * p_max; the draw picks, in index order, the first survivor whose
cumulative weight exp((x - max) / T) exceeds u * total (rounding past the end: the last token
with positive weight). Kernels: sample_kernels.py / sample_filter.py (multi-block, one launch
for argmax and temperature-only, two for the filters); scratch buffers come from a workspace
per (device, stream), allocated on first use: call once before capturing a CUDA graph.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import pykernel as pk
from pykernel import Ptr, f32, i32, i64

from pykernel.runtime.arrays import Array
from pykernel.runtime.device import current_device

from . import _launch as L
from . import sample_kernels as K
from .sample_filter import sample_hist, sample_pick
from .sample_rows import ROW_PARAMS, rows_draw
from .top_k_rows import rows_hist, rows_pick

@dataclass
class _Workspace:
    """Device scratch of the multi-block samplers, grown on demand (counters and histogram
    start zeroed; the kernels leave them zeroed)."""
    counters: Array       # i32: last-block tickets (argmax: one per row) and candidate count
    hist: Array           # i32 (HIST_BINS,)
    blk_max: Array        # f32 per block (argmax: part values, rows * blocks)
    blk_sum: Array        # f32 per block
    part_i: Array         # i32 argmax indices, rows * blocks
    unit_cum: Array       # f32 per 4-element unit (temperature-only draw)
    params: Array         # f32 [max, mass, candidate bin]
    cand_v: Array         # f32 (CANDIDATES,)
    cand_i: Array         # i32 (CANDIDATES,)


_WORKSPACES: dict = {}


def _workspace(blocks: int, units: int, stream, tickets: int = 1) -> _Workspace:
    key = (id(current_device()), id(stream))
    ws = _WORKSPACES.get(key)
    if ws is None or ws.blk_max.size < blocks or ws.unit_cum.size < units or \
            ws.counters.size < tickets + 1:
        blocks, units = max(blocks, 1024), max(units, 1 << 16)
        ws = _WORKSPACES[key] = _Workspace(
            pk.zeros(max(tickets + 1, 4), np.int32), pk.zeros(K.HIST_BINS, np.int32),
            pk.empty(blocks, np.float32), pk.empty(blocks, np.float32),
            pk.empty(blocks, np.int32), pk.empty(units, np.float32), pk.zeros(4, np.float32),
            pk.empty(K.CANDIDATES, np.float32), pk.empty(K.CANDIDATES, np.int32))
    return ws


def _units_per_thread(n: int) -> int:
    """Units (4 logits) per thread so that a row takes at most MAX_BLOCKS blocks."""
    units = 2
    while -(-n // (4 * units * K.PASS_THREADS)) > K.MAX_BLOCKS:
        units *= 2
    if units > 16:
        raise ValueError(f"sampling: rows of {n} logits are too long (at most "
                         f"{16 * 4 * K.PASS_THREADS * K.MAX_BLOCKS})")
    return units


@pk.kernel
def penalties_row(logits: Ptr[f32], history: Ptr[i32, "ro"], n_hist: i32, vocab: i32,
                  repeat: f32, presence: f32, frequency: f32):
    penalise(logits, history, n_hist, vocab, repeat, presence, frequency)


@pk.kernel
def penalties_rows(logits: Ptr[f32], history: Ptr[i32, "ro"], n_hist: i32, vocab: i32,
                   settings: Ptr[f32, "ro"]):
    """Block r: row r of logits (rows, vocab) with its history row (rows, n_hist) and its
    settings row [repeat, presence, frequency]."""
    row = pk.block_idx.x
    p = settings + i64(row) * i64(3)
    penalise(logits + i64(row) * i64(vocab), history + i64(row) * i64(n_hist), n_hist, vocab,
             p[0], p[1], p[2])


@pk.func
def penalise(logits, history, n_hist: i32, vocab: i32, repeat: f32, presence: f32,
             frequency: f32):
    # each distinct token of the history is handled once, by the thread owning its first slot
    for i in range(pk.thread_idx.x, n_hist, pk.block_dim.x):
        tok = history[i]
        first = tok >= 0 and tok < vocab
        for j in range(0, i):
            if history[j] == tok:
                first = False
        if first:
            count = 0
            for j in range(i, n_hist):
                if history[j] == tok:
                    count += 1
            v = logits[tok]
            v = v / repeat if v > 0.0 else v * repeat
            logits[tok] = v - f32(count) * frequency - presence


def argmax(x, *, out=None, stream=None):
    """Index of the largest value of each row (lowest index on ties, NaN never chosen; an
    all-NaN row gives 2**31 - 1): x (rows, n) or (n,) f32 -> int32 (rows,)."""
    x = L.as_array(x, "argmax: x", np.float32)
    rows, n = L.rows_and_length(x, "argmax: x")
    out = L.output(out, "argmax", (rows,), np.int32)
    units = _units_per_thread(n)
    blocks = -(-n // (4 * units * K.PASS_THREADS))
    ws = _workspace(rows * blocks, 0, stream, tickets=rows)
    args = (x, out, ws.blk_max, ws.part_i, ws.counters, n)
    spec = (("VEC", L.vector_width(n, x)), ("UNITS", units))
    L.launch(K.argmax_blocks, (blocks, rows, 1), K.PASS_THREADS, args, spec, stream)
    return out


@dataclass
class _TopKWorkspace:
    """top_k_candidates' scratch per (device, stream), for `rows` rows: the histograms and
    tickets start zeroed and the kernels leave them zeroed."""
    hist: Array           # i32 (rows * HIST_BINS,)
    tickets: Array        # i32 (rows,)
    bound: Array          # i32 (rows,)


_TOPK_WORKSPACES: dict = {}


def top_k_candidates(x, k: int, *, cap: int = 1024, values=None, ids=None, counts=None,
                     stream=None):
    """Each row's largest logits for a sampler on the host: x (rows, n) or (n,) f32 ->
    (values (rows, cap) f32, ids (rows, cap) int32, counts (rows,) int32). Row r's first
    min(counts[r], cap) entries hold, in no order, every logit whose order-key bin (1/8 of an
    octave) is at or above the bin of the row's k-th largest, hence the k largest (ties
    included) and never a NaN; counts[r] > cap: the list overflowed (the row is flat at the
    top) and is incomplete. Two launches; 1 <= k <= n."""
    return _top_k_lists(x, k, cap, values, ids, counts, stream, "top_k_candidates")


def _top_k_lists(x, k, cap, values, ids, counts, stream, who):
    x = L.as_array(x, f"{who}: x", np.float32)
    rows, n = L.rows_and_length(x, f"{who}: x")
    if not 1 <= k <= n:
        raise ValueError(f"{who}: k must be in 1..{n}, got {k}")
    if cap < 1:
        raise ValueError(f"{who}: cap must be >= 1, got {cap}")
    values = L.output(values, f"{who}: values", (rows, cap), np.float32)
    ids = L.output(ids, f"{who}: ids", (rows, cap), np.int32)
    counts = L.output(counts, f"{who}: counts", (rows,), np.int32)
    key = (id(current_device()), id(stream))
    ws = _TOPK_WORKSPACES.get(key)
    if ws is None or ws.tickets.size < rows:
        size = max(rows, 16)
        ws = _TOPK_WORKSPACES[key] = _TopKWorkspace(
            pk.zeros(size * K.HIST_BINS, np.int32), pk.zeros(size, np.int32),
            pk.empty(size, np.int32))
    units = _units_per_thread(n)
    grid = (-(-n // (4 * units * K.PASS_THREADS)), rows, 1)
    spec = (("VEC", L.vector_width(n, x)), ("UNITS", units))
    L.launch(rows_hist, grid, K.PASS_THREADS, (x, n, k, ws.hist, ws.tickets, ws.bound, counts),
             spec, stream)
    L.launch(rows_pick, grid, K.PASS_THREADS, (x, n, ws.bound, counts, values, ids, cap),
             spec, stream)
    return values, ids, counts


def row_settings(u, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """sample_rows' per-row settings, (rows, ROW_PARAMS) float32: u (rows,) uniforms in [0, 1);
    each filter a scalar for every row or one value per row, with sample's meanings
    (temperature <= 0: greedy; top_k <= 0, top_p >= 1, min_p <= 0: that filter off)."""
    u = np.asarray(u, np.float64).reshape(-1)
    rows = u.size
    t, k, p, mp = (np.broadcast_to(np.asarray(v, np.float64), (rows,))
                   for v in (temperature, top_k, top_p, min_p))
    if not ((u >= 0) & (u < 1)).all():
        raise ValueError("row_settings: every u must be in [0, 1)")
    greedy = t <= 0      # greedy = top-k 1 drawn at u 0: the lowest index of the maxima
    out = np.empty((rows, ROW_PARAMS), np.float32)
    out[:, 0] = np.where(greedy, 0.0, u)
    out[:, 1] = np.where(greedy, 1.0, 1.0 / np.where(greedy, 1.0, t))
    out[:, 2] = np.where(greedy, 1.0, p)
    out[:, 3] = np.where(greedy, 0.0, mp)
    out[:, 4] = np.where(greedy, 1, np.clip(np.floor(k), 0, 1 << 24))
    return out


def lists_k(settings: np.ndarray, n: int) -> int:
    """The k whose candidate lists serve every row of row_settings' host array over rows of
    n logits: the largest top_k that is on (1 when none is)."""
    top_k = np.asarray(settings)[:, 4]
    on = top_k[(top_k > 0) & (top_k < n)]
    return int(on.max()) if on.size else 1


@dataclass
class _RowsWorkspace:
    """sample_rows' scratch per (device, stream): lists of `cap` for `rows` rows."""
    values: Array         # f32 (rows * cap,)
    ids: Array            # i32 (rows * cap,)
    counts: Array         # i32 (rows,)
    settings: Array       # f32 (rows, ROW_PARAMS)


_ROWS_WORKSPACES: dict = {}


def sample_rows(x, settings, *, k: int | None = None, cap: int = 1024, out=None,
                stream=None):
    """One draw per row of x (rows, n) f32, each row with its own uniform and filters -> int32
    (rows,). settings: row_settings(...), a (rows, ROW_PARAMS) f32 host array (copied into a
    workspace in order on the default stream), or a device copy of one, which the caller
    keeps and updates (then k, the largest top_k of the rows in 1..n, must be given: that
    is what the candidate lists are made for; no host copy, so the launches replay in a CUDA
    graph). Row r's token is the one sample(x[r], u[r], <row r's filters>) draws (the same
    thresholds and survivors, so the same token for the same uniform where row r's top-k is
    on). Three launches for the batch: top_k_candidates, then one block per row draws from
    its list (SAMPLE_THREADS threads). A row with top-k off, or whose list overflowed cap (a
    row flat at the top), takes the exact single-block pass over its whole row: tens of
    microseconds per pass on a 128k vocabulary, so for such rows sample() is faster. A row
    whose largest logit is not finite (all NaN, only -Inf, or +Inf) gives -1."""
    x = L.as_array(x, "sample_rows: x", np.float32)
    rows, n = L.rows_and_length(x, "sample_rows: x")
    if not 1 <= cap <= K.CANDIDATES:
        raise ValueError(f"sample_rows: cap must be in 1..{K.CANDIDATES}, got {cap}")
    on_device = isinstance(settings, Array)
    if not on_device:
        settings = np.ascontiguousarray(settings, np.float32)
    if tuple(settings.shape) != (rows, ROW_PARAMS) or settings.dtype != np.float32:
        raise ValueError(f"sample_rows: settings must be ({rows}, {ROW_PARAMS}) float32 "
                         f"(row_settings), got {tuple(settings.shape)} {settings.dtype}")
    if on_device and k is None:
        raise ValueError("sample_rows: settings on the device need k (the rows' largest "
                         "top_k)")
    if k is None:
        k = lists_k(settings, n)
    out = L.output(out, "sample_rows", (rows,), np.int32)
    key = (id(current_device()), id(stream))
    ws = _ROWS_WORKSPACES.get(key)
    if ws is None or ws.counts.size < rows or ws.values.size < rows * cap:
        size = max(rows, 16)
        ws = _ROWS_WORKSPACES[key] = _RowsWorkspace(
            pk.empty(size * cap, np.float32), pk.empty(size * cap, np.int32),
            pk.empty(size, np.int32), pk.empty((size, ROW_PARAMS), np.float32))
    values = ws.values[:rows * cap].reshape(rows, cap)
    ids = ws.ids[:rows * cap].reshape(rows, cap)
    counts = ws.counts[:rows]
    if not on_device:
        settings = ws.settings[:rows].copy_from(settings)
    _top_k_lists(x, k, cap, values, ids, counts, stream, "sample_rows")
    args = (x, n, settings, out, counts, values, ids, cap)
    L.launch(rows_draw, rows, K.SAMPLE_THREADS, args, (), stream)
    return out


def top_k_candidates_reference(x, k: int):
    """The set of (row, index) pairs top_k_candidates lists (cap permitting), in numpy."""
    x = np.asarray(x, np.float32).reshape(-1, np.shape(x)[-1])
    bits = x.view(np.uint32)
    keys = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000)) >> np.uint32(20)
    out = []
    for row, key in zip(x, keys):
        numbers = ~np.isnan(row)
        if numbers.sum() < k:
            low = 0
        else:
            low = np.sort(key[numbers])[::-1][k - 1]
        out.append(set(np.flatnonzero(numbers & (key >= low)).tolist()))
    return out


def apply_penalties(logits, history, *, repeat: float = 1.0, presence: float = 0.0,
                    frequency: float = 0.0, stream=None):
    """In place on logits (vocab,): for each distinct id in `history` (ids < 0 ignored) seen
    c times: logit /= repeat if > 0 else *= repeat; then logit -= c * frequency + presence."""
    logits = L.as_array(logits, "apply_penalties: logits", np.float32)
    history = L.as_array(history, "apply_penalties: history", np.int32)
    if logits.ndim != 1:
        raise ValueError(f"apply_penalties: logits must be (vocab,), got {logits.shape}")
    if history.size:
        args = (logits, history, history.size, logits.size, repeat, presence, frequency)
        L.launch(penalties_row, 1, L.threads_for(history.size, 256), args, (), stream)
    return logits


def apply_penalties_rows(logits, history, settings, *, stream=None):
    """apply_penalties for each row of logits (rows, vocab), in place: history (rows, n)
    int32, row r's window of ids (entries < 0 empty), and settings (rows, 3) f32, row r's
    [repeat, presence, frequency] (1, 0, 0: untouched). Each a host array (copied in order on
    the default stream) or a device array the caller keeps. One launch, a block per row."""
    logits = L.as_array(logits, "apply_penalties_rows: logits", np.float32)
    rows, vocab = L.rows_and_length(logits, "apply_penalties_rows: logits")
    history = L.as_array(history, "apply_penalties_rows: history", np.int32)
    settings = L.as_array(settings, "apply_penalties_rows: settings", np.float32)
    if history.ndim != 2 or history.shape[0] != rows:
        raise ValueError(f"apply_penalties_rows: history must be ({rows}, n), got "
                         f"{history.shape}")
    if tuple(settings.shape) != (rows, 3):
        raise ValueError(f"apply_penalties_rows: settings must be ({rows}, 3), got "
                         f"{settings.shape}")
    if history.shape[1]:
        args = (logits, history, history.shape[1], vocab, settings)
        L.launch(penalties_rows, rows, L.threads_for(history.shape[1], 256), args, (), stream)
    return logits


def sample(logits, u, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           min_p: float = 0.0, out=None, stream=None):
    """Draw a token id from logits (vocab,) f32 with uniform u in [0, 1) -> int32 (1,).
    u may also be an array of d uniforms: d independent draws -> int32 (d,).
    temperature <= 0 is greedy (argmax); top_k <= 0, top_p >= 1, min_p <= 0 disable a filter.
    A row whose largest logit is not finite (all NaN, only -Inf, or +Inf: nothing to draw
    from) gives -1 (greedy: argmax's, 2**31 - 1 for all NaN)."""
    logits = L.as_array(logits, "sample: logits", np.float32)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"sample: logits must be (vocab,), got {logits.shape}")
    u = L.as_array(np.array([u], np.float32) if np.isscalar(u) else u, "sample: u",
                   np.float32)
    out = L.output(out, "sample", (u.size,), np.int32)
    if temperature <= 0:
        return argmax(logits, out=out, stream=stream)
    n = logits.size
    units = _units_per_thread(n)
    blocks = -(-n // (4 * units * K.PASS_THREADS))
    ws = _workspace(blocks, blocks * units * K.PASS_THREADS, stream)
    vec = L.vector_width(n, logits)
    if (0 < top_k < n) or top_p < 1.0 or min_p > 0.0:
        k_on = int(top_k) if 0 < top_k < n else 0
        args = (logits, n, k_on, float(min_p), ws.blk_max, ws.blk_sum, ws.hist, ws.params,
                ws.counters)
        L.launch(sample_hist, blocks, K.PASS_THREADS, args, (("VEC", vec), ("UNITS", units)),
                 stream)
        args = (logits, u, out, u.size, n, int(top_k), float(top_p), float(min_p),
                1.0 / temperature, ws.params, ws.cand_v, ws.cand_i, ws.counters)
        L.launch(sample_pick, -(-n // (4 * K.SAMPLE_THREADS)), K.SAMPLE_THREADS, args,
                 (("VEC", vec),), stream)
        return out
    args = (logits, u, out, u.size, n, 1.0 / temperature, ws.blk_max, ws.blk_sum, ws.unit_cum,
            ws.counters)
    L.launch(K.sample_temp, blocks, K.PASS_THREADS, args, (("VEC", vec), ("UNITS", units)),
             stream)
    return out


def penalties_reference(logits, history, repeat=1.0, presence=0.0, frequency=0.0):
    y = np.array(logits, np.float32)
    ids, counts = np.unique([t for t in np.asarray(history) if 0 <= t < y.size],
                            return_counts=True)
    for tok, count in zip(ids, counts):
        v = y[tok] / np.float32(repeat) if y[tok] > 0 else y[tok] * np.float32(repeat)
        y[tok] = v - np.float32(count * frequency) - np.float32(presence)
    return y


def filtered_probs_reference(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """float64 probabilities of each token after top-k, top-p, min-p and temperature."""
    x = np.asarray(logits, np.float64)
    keep = ~np.isnan(x)
    m = x[keep].max()
    if 0 < top_k < x.size:
        keep &= x >= np.sort(x[keep])[::-1][top_k - 1]
    if top_p < 1.0:
        w = np.where(keep, np.exp(x - m), 0.0)
        order = np.argsort(-x, kind="stable")
        cum = np.cumsum(w[order])
        cut = np.searchsorted(cum, top_p * cum[-1])   # first index where cum >= p * Z
        keep &= x >= x[order[min(cut, x.size - 1)]]
    if min_p > 0.0:
        keep &= x >= m + math.log(min_p)
    w = np.where(keep, np.exp((x - m) / temperature), 0.0)
    return w / w.sum()
