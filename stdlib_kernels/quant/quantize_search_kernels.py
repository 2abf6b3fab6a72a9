"""ggml's K-quant scale searches as device functions, one sub-block per thread.

Input: `xs` (and weights `ws`), per-thread arrays of N float32 values kept in registers (every
element loop is unrolled). Output: the sub-block's scale (and min) and what is needed to rebuild
the search's integer levels. Sums run sequentially from the first term in C's operand order
(`w*x*l` is `(w*x)*l`), exactly as the numpy reference (reference_search.py) does, so the
results match it and ggml bit for bit. Candidate scales are tried one after another by the
thread; the parallelism is across sub-blocks (16 per super-block, many super-blocks per launch).
"""
from __future__ import annotations

import pykernel as pk
from pykernel import Const, f32

from .quantize_kernels import clamp, nearest_int


@pk.func
def first_absmax(xs, N: Const[int]):
    """(largest |x|, signed x that first reached it), both 0 when every |x| is 0."""
    amax = f32(0.0)
    vmax = f32(0.0)
    for i in range(N):
        if abs(xs[i]) > amax:
            amax = abs(xs[i])
            vmax = xs[i]
    return amax, vmax


@pk.func
def qx_sums(xs, iscale: f32, N: Const[int], NMAX: Const[int]):
    """sum w*x*l and sum w*l*l (w = x^2) for l = clamp(nearest_int(iscale*x), -NMAX, NMAX-1)."""
    l = f32(clamp(nearest_int(iscale * xs[0]), -NMAX, NMAX - 1))
    w = xs[0] * xs[0]
    sumlx = w * xs[0] * l
    suml2 = w * l * l
    for i in range(1, N):
        l = f32(clamp(nearest_int(iscale * xs[i]), -NMAX, NMAX - 1))
        w = xs[i] * xs[i]
        sumlx += w * xs[i] * l
        suml2 += w * l * l
    return sumlx, suml2


@pk.func
def make_qx_quants(xs, N: Const[int], NMAX: Const[int]):
    """ggml make_qx_quants, rmse_type 1, no importance: returns (scale, iscale of the kept
    levels, is_zero). Levels are clamp(nearest_int(iscale*x), -NMAX, NMAX-1) + NMAX, or all 0
    when is_zero (largest |x| below GROUP_MAX_EPS)."""
    amax, vmax = first_absmax(xs, N)
    zero = amax < 1e-15
    iscale = f32(-NMAX) / vmax
    sumlx, suml2 = qx_sums(xs, iscale, N, NMAX)
    scale = sumlx / suml2 if suml2 != 0.0 else f32(0.0)
    best = scale * sumlx
    best_iscale = iscale
    for step in range(-9, 10):
        if step != 0:
            trial = -(f32(NMAX) + 0.1 * f32(step)) / vmax
            slx, sl2 = qx_sums(xs, trial, N, NMAX)
            if sl2 > 0.0 and slx * slx > best * sl2:
                scale = slx / sl2
                best = scale * slx
                best_iscale = trial
    if zero:
        scale = f32(0.0)
    return scale, best_iscale, zero


@pk.func
def affine_level(x: f32, iscale: f32, lo: f32, NMAX: Const[int]) -> f32:
    return f32(clamp(nearest_int(iscale * (x - lo)), 0, NMAX))


@pk.func
def affine_error(xs, ws, iscale: f32, lo: f32, scale: f32, fit_min: f32, N: Const[int],
                 NMAX: Const[int], MAD: Const[bool]) -> f32:
    """sum w * |scale*l + fit_min - x| (or squared) over the levels l of (iscale, lo)."""
    diff = scale * affine_level(xs[0], iscale, lo, NMAX) + fit_min - xs[0]
    total = ws[0] * (abs(diff) if MAD else diff * diff)
    for i in range(1, N):
        diff = scale * affine_level(xs[i], iscale, lo, NMAX) + fit_min - xs[i]
        total += ws[i] * (abs(diff) if MAD else diff * diff)
    return total


@pk.func
def affine_sums(xs, ws, iscale: f32, lo: f32, N: Const[int], NMAX: Const[int]):
    """sum w*l, sum w*l*l, sum w*l*x for the levels of (iscale, lo)."""
    level = affine_level(xs[0], iscale, lo, NMAX)
    sum_l = ws[0] * level
    sum_l2 = sum_l * level
    sum_xl = sum_l * xs[0]
    for i in range(1, N):
        level = affine_level(xs[i], iscale, lo, NMAX)
        wl = ws[i] * level
        sum_l += wl
        sum_l2 += wl * level
        sum_xl += wl * xs[i]
    return sum_l, sum_l2, sum_xl


@pk.func
def make_qkx2_quants(xs, ws, rmin: f32, N: Const[int], NMAX: Const[int], NSTEP: Const[int],
                     MAD: Const[bool]):
    """ggml make_qkx2_quants (rdelta 0.1): returns (scale, the_min, iscale, lo, flat); the kept
    levels are affine_level(x, iscale, lo) (all 0 when flat)."""
    x_min = xs[0]
    hi = xs[0]
    sum_w = ws[0]
    sum_x = ws[0] * xs[0]
    for i in range(1, N):
        if xs[i] < x_min:
            x_min = xs[i]
        if xs[i] > hi:
            hi = xs[i]
        sum_w += ws[i]
        sum_x += ws[i] * xs[i]
    lo = x_min if x_min < 0.0 else f32(0.0)
    flat = hi == lo
    iscale = f32(NMAX) / (hi - lo)
    scale = 1.0 / iscale
    best_iscale = iscale
    best_lo = lo
    best_error = affine_error(xs, ws, iscale, lo, scale, lo, N, NMAX, MAD)
    for step in range(NSTEP + 1):
        trial = ((rmin + 0.1 * f32(step)) + f32(NMAX)) / (hi - lo)
        sum_l, sum_l2, sum_xl = affine_sums(xs, ws, trial, lo, N, NMAX)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        if this_min > 0.0:
            this_min = f32(0.0)
            this_scale = sum_xl / sum_l2
        error = affine_error(xs, ws, trial, lo, this_scale, this_min, N, NMAX, MAD)
        if det > 0.0 and error < best_error and not flat:
            best_iscale = trial
            best_lo = lo
            best_error = error
            scale = this_scale
            lo = this_min
    if flat:
        scale = f32(0.0)
    return scale, -lo, best_iscale, best_lo, flat


@pk.func
def make_q3_quants(xs, levels, N: Const[int], NMAX: Const[int]) -> f32:
    """ggml make_q3_quants with do_rmse: fills levels (float32, in [-NMAX, NMAX-1]; all 0 for
    a zero sub-block) by coordinate descent on the x^2-weighted fit; returns the scale."""
    amax, vmax = first_absmax(xs, N)
    iscale = f32(-NMAX) / vmax
    for i in range(N):
        levels[i] = f32(clamp(nearest_int(iscale * xs[i]), -NMAX, NMAX - 1))
    sumlx = xs[0] * xs[0] * xs[0] * levels[0]
    suml2 = xs[0] * xs[0] * levels[0] * levels[0]
    for i in range(1, N):
        w = xs[i] * xs[i]
        sumlx += w * xs[i] * levels[i]
        suml2 += w * levels[i] * levels[i]
    for attempt in range(5):
        changed = False
        for i in range(N):
            w = xs[i] * xs[i]
            cur = levels[i]
            slx = sumlx - w * xs[i] * cur
            sl2 = suml2 - w * cur * cur
            new = f32(clamp(nearest_int(xs[i] * sl2 / slx), -NMAX, NMAX - 1))
            new_lx = slx + w * xs[i] * new
            new_l2 = sl2 + w * new * new
            if (slx > 0.0 and new != cur and new_l2 > 0.0
                    and new_lx * new_lx * suml2 > sumlx * sumlx * new_l2):
                levels[i] = new
                sumlx = new_lx
                suml2 = new_l2
                changed = True
        if not changed:
            break
    scale = sumlx / suml2 if suml2 > 0.0 else f32(0.0)
    if amax < 1e-15:
        scale = f32(0.0)
        for i in range(N):
            levels[i] = f32(-NMAX)
    return scale
