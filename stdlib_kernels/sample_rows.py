"""Batched sampling: one draw per logits row, each row with its own uniform and filter
settings (a server step's requests), after top_k_candidates (top_k_rows.py) listed each row's
largest logits.

rows_draw: one block of SAMPLE_THREADS per row loads the row's candidate list into shared
memory (its max is the row's max: the top bin is always listed) and draws exactly as the
one-row sampler's last block does (sample_filter.draw_from_candidates: thresholds by radix
select, survivors sorted by index, one search of the cumulative weights). A row whose list
overflowed, or with top-k off (its top-p / min-p cut may lie below the listed bins), runs the
exact single-block pass over its whole row instead. A row whose largest logit is not finite
(all NaN, only -Inf, or +Inf) gives -1.

Per-row settings: params (rows, ROW_PARAMS) f32 = [u, 1 / temperature, top_p, min_p, top_k]
(top_k exact as f32 below 2**24). Wrapper: sampling.sample_rows.
"""
import pykernel as pk
from pykernel import Ptr, f32, i32, i64, u32

from ._device import NEG_INF, block_max
from ._select import order_key
from .sample_filter import draw_from_candidates
from .sample_kernels import CANDIDATES, HIST_BINS

ROW_PARAMS = 5


@pk.kernel
def rows_draw(x: Ptr[f32, "ro"], n: i32, params: Ptr[f32, "ro"], out: Ptr[i32],
              counts: Ptr[i32, "ro"], cand_v: Ptr[f32, "ro"], cand_i: Ptr[i32, "ro"],
              cap: i32):
    scratch = pk.shared_array(f32, 32)
    local = pk.shared_array(i32, 2)
    cv = pk.shared_array(f32, CANDIDATES)
    ci = pk.shared_array(i32, CANDIDATES)
    sw = pk.shared_array(f32, CANDIDATES)
    si = pk.shared_array(i32, CANDIDATES)
    hist = pk.shared_array(f32, 256)
    bcast = pk.shared_array(f32, 2)
    row = pk.block_idx.x
    if pk.thread_idx.x == 0:
        out[row] = -1         # stays when nothing can be drawn (a row without a number)
    p = params + i64(row) * i64(ROW_PARAMS)
    top_k = i32(p[4])
    total = counts[row]
    count = min(total, cap)
    first = i64(row) * i64(cap)
    m = f32(NEG_INF)
    low = f32(HIST_BINS)      # the lowest listed bin: the list's bound
    for k in range(pk.thread_idx.x, count, pk.block_dim.x):
        v = cand_v[first + i64(k)]
        cv[k] = v
        ci[k] = cand_i[first + i64(k)]
        m = max(m, v)
        low = min(low, f32(i32(order_key(v) >> u32(20))))
    m = block_max(m, scratch)
    low = -block_max(-low, scratch)   # its barriers also publish cv / ci
    ok = total <= cap and count > 0 and top_k > 0 and top_k < n
    draw_from_candidates(x + i64(row) * i64(n), p, out + row, 1, n, cv, ci, count, ok,
                         u32(i32(min(low, f32(HIST_BINS - 1)))) << u32(20), m, f32(0.0),
                         top_k, p[2], p[3], p[1], sw, si, local, hist, bcast, scratch)
