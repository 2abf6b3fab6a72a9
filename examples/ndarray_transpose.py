"""N-d array parameters: a tiled 2-d transpose written with `x[r, c]` and `x.shape`. The kernel
gets each array's shape and strides at launch, so it also takes non-contiguous views (here a
strided slice of a numpy array on the CPU target). `python examples/ndarray_transpose.py`
(PYKERNEL_DEVICE=cpu forces the CPU target)."""
import numpy as np

import pykernel as pk
from pykernel import f32, i64

TILE = 32


@pk.kernel
def transpose(x: pk.Array[f32, 2, "ro"], out: pk.Array[f32, 2]):
    # (TILE, TILE + 1) floats: the extra column keeps the column reads free of bank conflicts
    tile = pk.shared_array(f32, (TILE, TILE + 1))
    tx, ty = pk.thread_idx.x, pk.thread_idx.y
    r = i64(pk.block_idx.y * TILE + ty)            # the row of x this thread reads
    c = i64(pk.block_idx.x * TILE + tx)
    if r < x.shape[0] and c < x.shape[1]:
        tile[ty, tx] = x[r, c]
    pk.syncthreads()
    r = i64(pk.block_idx.x * TILE + ty)            # the row of out this thread writes
    c = i64(pk.block_idx.y * TILE + tx)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = tile[tx, ty]


def run(x):
    """out = x.T for a 2-d float32 array x (any strides) on the current device."""
    rows, cols = x.shape
    out = pk.empty((cols, rows), np.float32)
    transpose[((cols + TILE - 1) // TILE, (rows + TILE - 1) // TILE), (TILE, TILE)](x, out)
    return out


def main():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((45, 130), np.float32)
    assert np.array_equal(run(pk.to_device(a)).numpy(), a.T)
    if pk.current_device().kind == "cpu":   # host views go straight to the CPU target
        view = a[::2, 5::3]                  # non-contiguous: strides (260, 3) elements
        assert np.array_equal(run(view).numpy(), view.T)
    print(f"ndarray_transpose on {pk.current_device().kind}: {a.shape} OK")


if __name__ == "__main__":
    main()
