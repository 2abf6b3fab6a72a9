"""Vectorised ports of ggml's scale searches: make_qkx2_quants, make_qx_quants, make_q3_quants.

Input: sub-blocks as float32 arrays laid out (n, B) (element i of every sub-block is row i; see
reference_numerics). Output: per sub-block float32 scale (and min) of shape (B,) and the integer
levels L of shape (n, B), exactly as ggml's C code computes them (float32 arithmetic, sequential
sums, C's order of operations).
"""
from __future__ import annotations

import numpy as np

from .reference_numerics import (F32, first_absmax, nearest_int, round_clip, seq_sum,
                                 within_round_range)

GROUP_MAX_EPS = F32(1e-15)  # ggml: a group whose max |x| is below this is treated as all zero


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int, use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted search for an affine fit x ~ scale*L - the_min, L in 0..nmax; returns
    (scale, the_min, L).

    x, w: (n, B). Tries the plain max-min scale, then nstep+1 scales
    (rmin + rdelta*is + nmax)/(max - min), each followed by a least-squares refit of scale and min
    (min clamped to <= 0), keeping whichever has the smallest weighted |error| (or error^2).
    As in ggml, a kept refit's min shifts the grid of every later trial.
    """
    x_min = x.min(axis=0)
    lo = np.minimum(x_min, F32(0))
    hi = x.max(axis=0)
    sum_w = seq_sum(w)
    sum_x = seq_sum(w * x)
    flat = hi == lo
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(nmax) / (hi - lo)
        scale = F32(1) / iscale
        # the levels are recomputed at the end from the (iscale, min) that produced the winner
        best_iscale, best_lo = iscale, lo
        levels = _levels(iscale, x, lo, nmax, _fast(iscale, x_min, hi, lo, flat))
        best_error = _fit_error(scale, levels, lo, x, w, use_mad)
        for step in range(nstep + 1):
            factor = F32(F32(rmin) + F32(rdelta) * F32(step)) + F32(nmax)
            trial_iscale = factor / (hi - lo)
            fast = _fast(trial_iscale, x_min, hi, lo, flat)
            trial = _levels(trial_iscale, x, lo, nmax, fast)
            weighted = w * trial
            sum_l = seq_sum(weighted)
            sum_l2 = seq_sum(weighted * trial)
            sum_xl = seq_sum(weighted * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive_min = this_min > 0
            this_min = np.where(positive_min, F32(0), this_min)
            this_scale = np.where(positive_min, sum_xl / sum_l2, this_scale)
            error = _fit_error(this_scale, trial, this_min, x, w, use_mad)
            better = (det > 0) & (error < best_error) & ~flat
            best_iscale = np.where(better, trial_iscale, best_iscale)
            best_lo = np.where(better, lo, best_lo)
            best_error = np.where(better, error, best_error)
            scale = np.where(better, this_scale, scale)
            lo = np.where(better, this_min, lo)
        fast = _fast(best_iscale, x_min, hi, best_lo, flat)
        levels = _levels(best_iscale, x, best_lo, nmax, fast)
    scale = np.where(flat, F32(0), scale)
    levels = np.where(flat, F32(0), levels)
    return scale, -lo, levels.astype(np.uint8)


def _levels(iscale, x: np.ndarray, lo, nmax: int, fast: bool) -> np.ndarray:
    """clamp(nearest_int(iscale*(x - min)), 0, nmax) as float32 (n, B)."""
    return round_clip(iscale * (x - lo), 0, nmax, fast)


def _fast(iscale, x_min, hi, lo, flat) -> bool:
    """Whether |iscale*(x - lo)| provably stays in round_clip's fast range (flat blocks are
    discarded anyway, so they do not count)."""
    reach = np.maximum(np.abs(hi - lo), np.abs(x_min - lo))
    return within_round_range(np.where(flat, F32(0), np.abs(iscale) * reach))


def _fit_error(scale, levels, lo, x, w, use_mad: bool) -> np.ndarray:
    diff = scale * levels + lo - x
    diff = np.abs(diff, out=diff) if use_mad else np.multiply(diff, diff, out=diff)
    return seq_sum(np.multiply(w, diff, out=diff))


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric scale search, weights x^2 (ggml rmse_type 1, no importance); returns (scale, L).

    x: (n, B). Levels are in [-nmax, nmax-1], returned offset by +nmax as uint8. Starts from
    -nmax/max (max = signed value of largest magnitude) and tries 18 nearby scales
    -(nmax + 0.1*is)/max, keeping the least-squares best.
    """
    amax, vmax = first_absmax(x, axis=0)
    zero = amax < GROUP_MAX_EPS
    weight = x * x
    wx = weight * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-nmax) / vmax
        levels, sumlx, suml2 = _qx_trial(iscale, x, weight, wx, nmax, amax, zero)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            trial_iscale = -(F32(nmax) + F32(0.1) * F32(step)) / vmax
            trial, slx, sl2 = _qx_trial(trial_iscale, x, weight, wx, nmax, amax, zero)
            better = (sl2 > 0) & (slx * slx > best * sl2)
            levels = np.where(better, trial, levels)
            scale = np.where(better, slx / sl2, scale)
            best = np.where(better, scale * slx, best)
    scale = np.where(zero, F32(0), scale)
    out = np.where(zero, 0, levels + nmax).astype(np.uint8)
    return scale, out


def _qx_trial(iscale, x, weight, wx, nmax: int, amax, zero):
    fast = within_round_range(np.where(zero, F32(0), np.abs(iscale) * amax))
    levels = round_clip(iscale * x, -nmax, nmax - 1, fast)
    return levels, seq_sum(wx * levels), seq_sum(weight * levels * levels)


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml make_q3_quants with do_rmse: start from -nmax/max, then up to 5 passes of coordinate
    descent moving one level at a time while the weighted (x^2) fit improves; returns (scale, L).

    x: (n, B); L in [0, 2*nmax) as uint8 (level + nmax).
    """
    amax, vmax = first_absmax(x, axis=0)
    zero = amax < GROUP_MAX_EPS
    weight = x * x
    wx = weight * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-nmax) / vmax
        levels = np.clip(nearest_int(iscale * x), -nmax, nmax - 1).astype(F32)
        sumlx = seq_sum(wx * levels)
        suml2 = seq_sum(weight * levels * levels)
        for _ in range(5):
            changed = np.zeros(x.shape[1], dtype=bool)
            for i in range(x.shape[0]):
                sumlx, suml2, moved = _q3_move(i, x, weight, wx, levels, sumlx, suml2, nmax)
                changed |= moved
            if not changed.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    scale = np.where(zero, F32(0), scale)
    out = np.where(zero, 0, levels + nmax).astype(np.uint8)
    return scale, out


def _q3_move(i, x, weight, wx, levels, sumlx, suml2, nmax):
    """One step of make_q3_quants' descent on element i of every sub-block (updates levels[i])."""
    cur = levels[i]
    slx = sumlx - wx[i] * cur
    sl2 = suml2 - weight[i] * cur * cur
    new = np.clip(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1).astype(F32)
    slx = slx + wx[i] * new
    sl2 = sl2 + weight[i] * new * new
    accept = ((sumlx - wx[i] * cur > 0) & (new != cur) & (sl2 > 0)
              & (slx * slx * suml2 > sumlx * sumlx * sl2))
    levels[i] = np.where(accept, new, cur)
    return np.where(accept, slx, sumlx), np.where(accept, sl2, suml2), accept
