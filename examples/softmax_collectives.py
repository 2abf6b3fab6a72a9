"""Row softmax from the library's block collectives: one block per row, 16-byte loads
(stdlib_kernels.collectives.load4, scalar tail when the row length is not a multiple of 4),
block_reduce for the row max and then the row sum, exp from pykernel's accurate math library.
Compare examples/softmax.py, which writes the warp shuffles out by hand."""
import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32
from stdlib_kernels.collectives import MAX, SUM, block_reduce, load4, store4


@pk.kernel
def softmax_rows(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32, BLOCK: Const[int],
                 VEC: Const[bool]):
    scratch = pk.shared_array(f32, 32)          # block_reduce's per-warp partials
    src = x + pk.block_idx.x * n                # VEC: n % 4 == 0, so rows stay 16-byte aligned
    dst = out + pk.block_idx.x * n
    m = -pk.inf
    for i in range(pk.thread_idx.x * 4, n, BLOCK * 4):
        a, b, c, d = load4(src, i, n, -pk.inf, VEC)     # -inf past n: exp gives 0
        m = max(m, a, b, c, d)
    m = block_reduce(m, scratch, MAX, BLOCK)
    s = f32(0.0)
    for i in range(pk.thread_idx.x * 4, n, BLOCK * 4):
        a, b, c, d = load4(src, i, n, -pk.inf, VEC)
        s += (pk.exp(a - m) + pk.exp(b - m)) + (pk.exp(c - m) + pk.exp(d - m))
    inv = 1.0 / block_reduce(s, scratch, SUM, BLOCK)
    for i in range(pk.thread_idx.x * 4, n, BLOCK * 4):
        a, b, c, d = load4(src, i, n, -pk.inf, VEC)
        store4(dst, i, n, pk.exp(a - m) * inv, pk.exp(b - m) * inv, pk.exp(c - m) * inv,
               pk.exp(d - m) * inv, VEC)


def softmax(x: np.ndarray, block: int = 256) -> np.ndarray:
    rows, n = x.shape
    out = pk.full((rows, n), np.nan, np.float32)
    softmax_rows[rows, block](pk.to_device(x), out, n, block, n % 4 == 0)
    return out.numpy()


def main(rows: int = 64, n: int = 1000):
    rng = np.random.default_rng(0)
    for cols, block in ((n, 256), (n + 3, 128), (45, 64)):    # vector path, then scalar tails
        x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
        e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
        np.testing.assert_allclose(softmax(x, block), e / e.sum(1, keepdims=True),
                                   rtol=1e-5, atol=1e-7)
    print(f"softmax_collectives on {pk.current_device().kind}: {rows} x {n} OK")


if __name__ == "__main__":
    main()
