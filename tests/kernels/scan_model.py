"""numpy float32 model of stdlib_kernels._select.block_scan, operation for operation, so tests
can assert the kernel bit for bit and build inputs that break the plain chunked scan (the
scan before the monotone clamp): `plain_scan` is that old arithmetic, `block_scan` today's."""
import numpy as np

F32 = np.float32


def warp_inclusive(v):
    """collectives.warp_scan(v, True) on rows of 32 lanes: Kogge-Stone, deltas 1..16."""
    v = v.astype(F32).copy()
    for k in range(5):
        d = 1 << k
        v[:, d:] = v[:, d:] + v[:, :-d]   # right side read before the write: numpy copies
    return v


def tree_exclusive(run, block):
    """collectives.block_scan(run, scratch, False, block): each thread's exclusive offset."""
    warps = run.reshape(block // 32, 32)
    inc = warp_inclusive(warps)
    exc = np.zeros_like(inc)
    exc[:, 1:] = inc[:, :-1]
    if block > 32:
        totals = np.zeros((1, 32), F32)
        totals[0, :block // 32] = inc[:, 31]
        t = warp_inclusive(totals)[0]
        exc[1:] = exc[1:] + t[:block // 32 - 1, None]
    return exc.reshape(-1)


def chunks(length, block):
    per = -(-length // block)
    return [(min(length, t * per), min(length, t * per + per)) for t in range(block)]


def chunk_runs(w, block):
    """Each thread's serial running sums (list of arrays) and its total run_t."""
    runs = [np.add.accumulate(w[lo:hi], dtype=F32) for lo, hi in chunks(w.size, block)]
    totals = np.array([r[-1] if r.size else 0 for r in runs], F32)
    return runs, totals


def plain_scan(w, block):
    """The scan before the clamp: fl(run_i + before_t)."""
    runs, totals = chunk_runs(w, block)
    before = tree_exclusive(totals, block)
    return np.concatenate([r + before[t] for t, r in enumerate(runs)]).astype(F32)


def block_scan(w, block):
    """_select.block_scan: chunk ends made monotone (running max), values clamped to them."""
    runs, totals = chunk_runs(w, block)
    before = tree_exclusive(totals, block)
    end = np.where(totals > 0, before + totals, F32(0)).astype(F32)
    stop = np.maximum.accumulate(end)
    start = np.concatenate([[F32(0)], stop[:-1]]).astype(F32)
    out = [np.where(r == totals[t], stop[t], np.minimum(start[t] + r, stop[t]))
           for t, r in enumerate(runs)]
    return np.concatenate(out).astype(F32)


def zero_weight_steps(cum, w):
    """Indices whose weight is 0 but whose cumulative sum differs from the one before (a
    search could pick them), and indices where the sum decreases."""
    prev = np.concatenate([[F32(0)], cum[:-1]])
    return np.flatnonzero((w == 0) & (cum != prev)), np.flatnonzero(cum < prev)


def adversarial_weights(rng, length, block):
    """Softmax-like weights where every chunk starts with a zero weight (so any mismatch
    between a chunk's offset and the previous chunk's end makes a zero weight step), some
    chunks all zero, and a few huge weights so the tree's offsets round differently."""
    w = np.exp(rng.standard_normal(length) * 3).astype(F32)
    w[rng.random(length) < 0.2] = 0
    bounds = chunks(length, block)
    for lo, hi in bounds:
        if lo < hi:
            w[lo] = 0
            if rng.random() < 0.1:
                w[lo:hi] = 0
    w[rng.integers(0, length, 3)] *= F32(1e3)
    return w
