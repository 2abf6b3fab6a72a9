"""Elementwise kernels: add, mul, scale (with an optional broadcast row vector), copy/convert
between f32 and f16, and f32 <-> bf16 (bf16 held as uint16 bit patterns: numpy has no bf16),
with numpy references.

Input: a (rows, n), b (rows, n) or (n,) (broadcast over rows: biases, weights), f32/f16.
Output: out = (a op b) * alpha in out's dtype (new array like a, or `out=`; may alias a).
Exact: one f32 rounding per operation (f16 inputs/outputs converted with round-to-nearest-even).
"""
from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, bf16, f32, i32, i64, u16, u32

from . import _launch as L
from ._device import store4
from ._rows import load_unit

ADD, MUL, NONE = 0, 1, 2
# units of 4 elements per thread at batch >= 64: 4 was the fastest (or tied) for add and
# f32->f16 on the H200 (benchmarks/RESULTS.md, core sweep)
BINARY_UNITS = 4
# f32 <-> f16 with 8-element units (16-byte f16 accesses) at most this many per thread;
# 0 = convert through binary_rows (4-element units). 4 was the fastest on the H200, by ~1%.
CONVERT8_UNITS = 4


@pk.kernel
def binary_rows(a: Ptr["TA", "ro"], b: Ptr["TB", "ro"], out: Ptr["TO"], n: i32, b_stride: i32,
                alpha: f32, OP: Const[int], VEC: Const[int], UNITS: Const[int],
                TA: Const[pk.dtype], TB: Const[pk.dtype], TO: Const[pk.dtype]):
    # grid: x = row, y = chunk of UNITS * 4 * threads columns; b_stride 0 broadcasts one row
    # of b. A thread's units are block_dim apart (each pass coalesced) and all load first.
    row = i64(pk.block_idx.x)
    first = pk.block_idx.y * pk.block_dim.x * UNITS + pk.thread_idx.x
    v = pk.local_array(f32, 4 * UNITS)
    for u in pk.static_range(UNITS):
        x0, x1, x2, x3 = load_unit(a + row * i64(n), (first + u * pk.block_dim.x) * 4, n, VEC)
        if OP == 0 or OP == 1:
            y0, y1, y2, y3 = load_unit(b + row * i64(b_stride), (first + u * pk.block_dim.x) * 4,
                                       n, VEC)
            if OP == 0:
                x0, x1, x2, x3 = x0 + y0, x1 + y1, x2 + y2, x3 + y3
            else:
                x0, x1, x2, x3 = x0 * y0, x1 * y1, x2 * y2, x3 * y3
        v[4 * u] = x0 * alpha
        v[4 * u + 1] = x1 * alpha
        v[4 * u + 2] = x2 * alpha
        v[4 * u + 3] = x3 * alpha
    for u in pk.static_range(UNITS):
        c = (first + u * pk.block_dim.x) * 4
        if c < n:
            store4(out + row * i64(n), c, n, v[4 * u], v[4 * u + 1], v[4 * u + 2],
                   v[4 * u + 3], VEC, TO)


@pk.func
def load8(p, c: i32, WIDE: Const[bool]):
    """Elements c..c+7 as f32: two 16-byte loads of f32 (WIDE) or one of f16."""
    if WIDE:
        a, b, d, e = pk.load_vec(p, c, 4)
        f, g, h, k = pk.load_vec(p, c + 4, 4)
        return f32(a), f32(b), f32(d), f32(e), f32(f), f32(g), f32(h), f32(k)
    else:
        a, b, d, e, f, g, h, k = pk.load_vec(p, c, 8)
        return f32(a), f32(b), f32(d), f32(e), f32(f), f32(g), f32(h), f32(k)


@pk.kernel
def convert_rows8(x: Ptr["TA", "ro"], out: Ptr["TO"], n: i32, UNITS: Const[int],
                  TA: Const[pk.dtype], TO: Const[pk.dtype], WIDE_IN: Const[bool]):
    # f32 <-> f16 in units of 8 elements (n a multiple of 8, rows 16-byte aligned), so the
    # f16 side moves 16 bytes per access too; grid as binary_rows. Loads are clamped to the
    # row's last unit (never in a branch), stores guarded.
    row = i64(pk.block_idx.x)
    first = pk.block_idx.y * pk.block_dim.x * UNITS + pk.thread_idx.x
    v = pk.local_array(f32, 8 * UNITS)
    for u in pk.static_range(UNITS):
        c = min((first + u * pk.block_dim.x) * 8, n - 8)
        v[8 * u], v[8 * u + 1], v[8 * u + 2], v[8 * u + 3], v[8 * u + 4], v[8 * u + 5], \
            v[8 * u + 6], v[8 * u + 7] = load8(x + row * i64(n), c, WIDE_IN)
    for u in pk.static_range(UNITS):
        c = (first + u * pk.block_dim.x) * 8
        if c < n:
            o = out + row * i64(n)
            if WIDE_IN:   # f32 -> f16: one 16-byte store
                pk.store_vec(o, c, (TO(v[8 * u]), TO(v[8 * u + 1]), TO(v[8 * u + 2]),
                                    TO(v[8 * u + 3]), TO(v[8 * u + 4]), TO(v[8 * u + 5]),
                                    TO(v[8 * u + 6]), TO(v[8 * u + 7])))
            else:
                pk.store_vec(o, c, (TO(v[8 * u]), TO(v[8 * u + 1]), TO(v[8 * u + 2]),
                                    TO(v[8 * u + 3])))
                pk.store_vec(o, c + 4, (TO(v[8 * u + 4]), TO(v[8 * u + 5]),
                                        TO(v[8 * u + 6]), TO(v[8 * u + 7])))


@pk.kernel
def f32_to_bf16_bits(x: Ptr[f32, "ro"], out: Ptr[u16], total: i64):
    i = i64(pk.block_idx.x) * i64(pk.block_dim.x) + i64(pk.thread_idx.x)
    if i < total:
        out[i] = pk.bitcast(bf16(x[i]), u16)


@pk.kernel
def bf16_bits_to_f32(bits: Ptr[u16, "ro"], out: Ptr[f32], total: i64):
    i = i64(pk.block_idx.x) * i64(pk.block_dim.x) + i64(pk.thread_idx.x)
    if i < total:
        out[i] = pk.bitcast(u32(bits[i]) << 16, f32)


def _binary(a, b, op: int, alpha: float, out, dtype, name: str, stream):
    a = L.as_array(a, f"{name}: a")
    if a.dtype not in (np.float32, np.float16):
        raise TypeError(f"{name}: a must be float32 or float16, got {a.dtype}")
    rows, n = L.rows_and_length(a, f"{name}: a")
    b_stride = 0
    if b is not None:
        b = L.as_array(b, f"{name}: b")
        if b.dtype not in (np.float32, np.float16):
            raise TypeError(f"{name}: b must be float32 or float16, got {b.dtype}")
        if b.shape == a.shape:
            b_stride = n
        elif b.size != n:
            raise ValueError(f"{name}: b must have a's shape {a.shape} or be one row of {n}, "
                             f"got {b.shape}")
    out = L.output(out, name, a.shape, a.dtype if dtype is None else dtype)
    vec = L.vector_width(n, a, b, out)
    units, threads, grid = L.elementwise_geometry(rows, n, BINARY_UNITS)
    bb = L.either(b, a)
    spec = (("OP", op), ("VEC", vec), ("UNITS", units), ("TA", a.dtype), ("TB", bb.dtype),
            ("TO", out.dtype))
    L.launch(binary_rows, grid, threads, (a, bb, out, n, b_stride, alpha), spec, stream)
    return out


def add(a, b, *, alpha: float = 1.0, out=None, stream=None):
    """(a + b) * alpha; b same shape as a or one broadcast row."""
    return _binary(a, b, ADD, alpha, out, None, "add", stream)


def mul(a, b, *, alpha: float = 1.0, out=None, stream=None):
    """(a * b) * alpha; b same shape as a or one broadcast row."""
    return _binary(a, b, MUL, alpha, out, None, "mul", stream)


def scale(a, alpha: float, *, out=None, stream=None):
    return _binary(a, None, NONE, alpha, out, None, "scale", stream)


def convert(a, dtype, *, out=None, stream=None):
    """Copy with conversion: float32 <-> float16 (and same-type copies); "bfloat16" gives
    uint16 bf16 bit patterns from float32, and `from_bf16` goes back."""
    if dtype in ("bfloat16", "bf16"):
        return to_bf16(a, out=out, stream=stream)
    a = L.as_array(a, "convert: a")
    dtype = np.dtype(dtype)
    pair = {a.dtype, dtype}
    if CONVERT8_UNITS and pair == {np.dtype(np.float32), np.dtype(np.float16)}:
        rows, n = L.rows_and_length(a, "convert: a")
        out = L.output(out, "convert", a.shape, dtype)
        if n % 8 == 0 and a.ptr % 16 == 0 and out.ptr % 16 == 0:
            # n // 2 "elements" of 4 = n / 8 units of 8
            units, threads, grid = L.elementwise_geometry(rows, n // 2, CONVERT8_UNITS)
            spec = (("UNITS", units), ("TA", a.dtype), ("TO", dtype),
                    ("WIDE_IN", a.dtype == np.float32))
            L.launch(convert_rows8, grid, threads, (a, out, n), spec, stream)
            return out
    return _binary(a, None, NONE, 1.0, out, dtype, "convert", stream)


def _flat_launch(kernel, x, out, stream):
    total = x.size
    if total:
        L.launch(kernel, -(-total // 256), 256, (x, out, total), (), stream)
    return out


def to_bf16(x, *, out=None, stream=None):
    """float32 -> bf16 (round to nearest even) as uint16 bit patterns, same shape."""
    x = L.as_array(x, "to_bf16: x", np.float32)
    return _flat_launch(f32_to_bf16_bits, x, L.output(out, "to_bf16", x.shape, np.uint16),
                        stream)


def from_bf16(bits, *, out=None, stream=None):
    """bf16 bit patterns (uint16) -> float32 (exact)."""
    bits = L.as_array(bits, "from_bf16: bits", np.uint16)
    return _flat_launch(bf16_bits_to_f32, bits,
                        L.output(out, "from_bf16", bits.shape, np.float32), stream)


def bf16_bits_reference(x) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even, NaN kept quiet."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, np.float32))
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
