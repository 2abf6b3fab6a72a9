"""A persistent kernel: as many blocks as the device holds at once (`co_resident_grid`) stay
resident and take work items from an atomic counter, in order, until none is left; an item
waits on the items it depends on through counters in global memory (acquire / release)
instead of a kernel boundary. The work: a chain of row updates, row r =
3 * gather(row r - 1) + x[r], each row split into tiles that different blocks compute; tile
(r, t) waits until row r - 1's counter says all its tiles are done. Items are taken in order,
so an item only ever waits on items already taken by running blocks: no deadlock.
`python examples/persistent_queue.py` (PYKERNEL_DEVICE=cpu for the CPU target)."""
import numpy as np

import pykernel as pk
from pykernel import Ptr, i32, u32

BLOCK = 64


@pk.kernel
def chain_rows(x: Ptr[i32, "ro"], rows: Ptr[i32], next_item: Ptr[u32], done: Ptr[u32],
               n_rows: i32, n: i32, tiles: i32):
    t = pk.thread_idx.x
    taken = pk.shared_array(i32, 1)
    tile_len = (n + tiles - 1) // tiles
    while True:
        if t == 0:
            taken[0] = i32(pk.atomic_add(next_item, 0, u32(1)))     # the next item, in order
        pk.syncthreads()
        item = taken[0]
        pk.syncthreads()                 # all have read it before thread 0 takes the next
        if item >= n_rows * tiles:
            break
        row, tile = item // tiles, item % tiles
        lo = tile * tile_len
        hi = lo + tile_len
        if hi > n:
            hi = n
        if t == 0 and row > 0:
            pk.prefetch_l2(x, row * n + lo)          # this tile's input streams in meanwhile
            while pk.load_acquire(done, row - 1) < u32(tiles):    # row - 1 complete?
                pk.nanosleep(64)
        pk.syncthreads()                 # the acquire above orders the whole block's reads
        for j in range(lo + t, hi, BLOCK):
            prev = 0
            if row > 0:
                prev = rows[(row - 1) * n + (j * 7 + 1) % n]
            rows[row * n + j] = 3 * prev + x[row * n + j]
        pk.syncthreads()                 # every thread's writes, then one release publishes
        if t == 0:
            pk.atomic_add(done, row, u32(1), order="release")


def reference(x: np.ndarray) -> np.ndarray:
    rows = np.empty_like(x)
    gather = (np.arange(x.shape[1]) * 7 + 1) % x.shape[1]
    prev = np.zeros(x.shape[1], np.int32)
    with np.errstate(over="ignore"):
        for r in range(x.shape[0]):
            prev = (np.int32(3) * prev[gather] + x[r]).astype(np.int32)
            rows[r] = prev
    return rows


def main(n_rows: int = 37, n: int = 301, tiles: int = 5):
    x = np.random.default_rng(0).integers(-1000, 1000, (n_rows, n)).astype(np.int32)
    blocks = chain_rows.co_resident_grid(BLOCK)
    rows = pk.full((n_rows, n), -12345, np.int32)      # poisoned: an unwritten tile fails
    next_item, done = pk.zeros(1, np.uint32), pk.zeros(n_rows, np.uint32)
    chain_rows[blocks, BLOCK](pk.to_device(x), rows, next_item, done, n_rows, n, tiles)
    np.testing.assert_array_equal(rows.numpy(), reference(x))
    assert done.numpy().tolist() == [tiles] * n_rows
    print(f"persistent_queue on {pk.current_device().kind}: {n_rows * tiles} items, "
          f"{blocks} resident blocks OK")


if __name__ == "__main__":
    main()
