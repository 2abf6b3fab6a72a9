"""Activations and gated linear units: SiLU, GELU (tanh and erf forms), SwiGLU
`silu(gate) * up` and GeGLU `gelu_tanh(gate) * up`, with numpy references.

Input: gate (rows, n) [and up (rows, n)] f32/f16, or one fused (rows, 2n) tensor holding gate
then up in each row (`glu_fused`). Output: (rows, n) like gate (or `out=`).
Exact math (accurate exp/tanh/erf, no .approx): relative error below ~1e-6 vs float64.
Grid: x = row, y = chunk of UNITS * 4 * threads columns, so no per-element division.
"""
from __future__ import annotations

import math

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64

from . import _launch as L
from ._device import exp_nonpositive, store4
from ._rows import load_unit

SILU, GELU_TANH, GELU_ERF = 0, 1, 2
_ACTS = {"silu": SILU, "gelu_tanh": GELU_TANH, "gelu_erf": GELU_ERF}
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
RSQRT_2 = 1.0 / math.sqrt(2.0)
# units of 4 elements per thread: 1 was the fastest for silu_mul at every batch-512 size on the
# H200 (the math needs the threads to hide latency; benchmarks/RESULTS.md, core sweep)
GLU_UNITS = 1


@pk.func
def activate(x: f32, ACT: Const[int]) -> f32:
    if ACT == 0:   # x * sigmoid(x) from t = e**-|x| (never overflows, no range branches)
        t = exp_nonpositive(-abs(x))
        return (x if x >= 0.0 else x * t) / (1.0 + t)
    elif ACT == 1:
        return 0.5 * x * (1.0 + pk.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    else:
        return 0.5 * x * (1.0 + pk.erf(x * 0.7071067811865476))


@pk.kernel
def glu_rows(gate: Ptr["T", "ro"], up: Ptr["T", "ro"], out: Ptr["T"], n: i32, gate_stride: i32,
             up_stride: i32, ACT: Const[int], GATED: Const[bool], VEC: Const[int],
             UNITS: Const[int], T: Const[pk.dtype]):
    # a thread's UNITS units are block_dim apart (coalesced); every load precedes any math
    row = i64(pk.block_idx.x)
    first = pk.block_idx.y * pk.block_dim.x * UNITS + pk.thread_idx.x
    g = pk.local_array(f32, 4 * UNITS)
    w = pk.local_array(f32, 4 * UNITS)
    for u in pk.static_range(UNITS):
        c = (first + u * pk.block_dim.x) * 4
        g[4 * u], g[4 * u + 1], g[4 * u + 2], g[4 * u + 3] = load_unit(
            gate + row * i64(gate_stride), c, n, VEC)
        if GATED:
            w[4 * u], w[4 * u + 1], w[4 * u + 2], w[4 * u + 3] = load_unit(
                up + row * i64(up_stride), c, n, VEC)
    for u in pk.static_range(UNITS):
        c = (first + u * pk.block_dim.x) * 4
        a, b, d, e = activate(g[4 * u], ACT), activate(g[4 * u + 1], ACT), \
            activate(g[4 * u + 2], ACT), activate(g[4 * u + 3], ACT)
        if GATED:
            a, b, d, e = a * w[4 * u], b * w[4 * u + 1], d * w[4 * u + 2], e * w[4 * u + 3]
        if c < n:
            store4(out + row * i64(n), c, n, a, b, d, e, VEC, T)


def _launch_glu(gate, up, out, n, rows, gate_stride, up_stride, act, stream):
    vec = L.vector_width(n, gate, up, out)
    if gate_stride % 4 or (up is not None and up_stride % 4):
        vec = 1
    units, threads, grid = L.elementwise_geometry(rows, n, GLU_UNITS)
    args = (gate, L.either(up, gate), out, n, gate_stride, up_stride)
    spec = (("ACT", _ACTS[act]), ("GATED", up is not None), ("VEC", vec), ("UNITS", units),
            ("T", gate.dtype))
    L.launch(glu_rows, grid, threads, args, spec, stream)
    return out


def _float_array(x, name, dtype=None):
    x = L.as_array(x, name, dtype)
    if x.dtype not in (np.float32, np.float16):
        raise TypeError(f"{name}: expected float32 or float16, got {x.dtype}")
    return x


def glu(gate, up, act: str = "silu", *, out=None, stream=None):
    """act(gate) * up, elementwise over same-shaped arrays."""
    if act not in _ACTS:
        raise ValueError(f"glu: act must be one of {sorted(_ACTS)}, got {act!r}")
    gate = _float_array(gate, f"{act}_mul: gate")
    up = _float_array(up, f"{act}_mul: up", gate.dtype)
    if up.shape != gate.shape:
        raise ValueError(f"{act}_mul: gate shape {gate.shape} != up shape {up.shape}")
    rows, n = L.rows_and_length(gate, f"{act}_mul: gate")
    out = L.output(out, f"{act}_mul", gate.shape, gate.dtype)
    return _launch_glu(gate, up, out, n, rows, n, n, act, stream)


def glu_fused(gate_up, act: str = "silu", *, out=None, stream=None):
    """gate_up (rows, 2n), each row gate then up -> act(gate) * up (rows, n)."""
    if act not in _ACTS:
        raise ValueError(f"glu_fused: act must be one of {sorted(_ACTS)}, got {act!r}")
    x = _float_array(gate_up, "glu_fused: gate_up")
    rows, n2 = L.rows_and_length(x, "glu_fused: gate_up")
    if n2 % 2:
        raise ValueError(f"glu_fused: rows hold gate then up, so need an even length, got {n2}")
    n = n2 // 2
    out = L.output(out, "glu_fused", x.shape[:-1] + (n,), x.dtype)
    up = x.reshape(-1)[n:]   # row r's up half starts n elements after its gate half
    return _launch_glu(x, up, out, n, rows, n2, n2, act, stream)


def activation(x, act: str, *, out=None, stream=None):
    """act(x) elementwise: "silu", "gelu_tanh" or "gelu_erf"."""
    if act not in _ACTS:
        raise ValueError(f"activation: act must be one of {sorted(_ACTS)}, got {act!r}")
    x = _float_array(x, f"{act}: x")
    rows, n = L.rows_and_length(x, f"{act}: x")
    out = L.output(out, act, x.shape, x.dtype)
    return _launch_glu(x, None, out, n, rows, n, n, act, stream)


def silu_mul(gate, up, *, out=None, stream=None):
    """SwiGLU: silu(gate) * up."""
    return glu(gate, up, "silu", out=out, stream=stream)


def gelu_tanh_mul(gate, up, *, out=None, stream=None):
    """GeGLU (tanh approximation of GELU): gelu_tanh(gate) * up."""
    return glu(gate, up, "gelu_tanh", out=out, stream=stream)


def silu(x, *, out=None, stream=None):
    return activation(x, "silu", out=out, stream=stream)


def gelu_tanh(x, *, out=None, stream=None):
    return activation(x, "gelu_tanh", out=out, stream=stream)


def gelu_erf(x, *, out=None, stream=None):
    return activation(x, "gelu_erf", out=out, stream=stream)


def activation_reference(x, act: str):
    """float64 numpy activation."""
    x = np.asarray(x, np.float64)
    if act == "silu":
        return x / (1.0 + np.exp(-x))
    if act == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x * RSQRT_2))


def glu_reference(gate, up, act: str = "silu"):
    return activation_reference(gate, act) * np.asarray(up, np.float64)
