"""Half-precision arithmetic: f16 values computed as f16 (`fma.rn.f16`, `max.f16`: no
conversions through f32) and packed pairs (`pk.f16x2`: two halves per instruction,
`fma.rn.f16x2`). `python examples/half_precision.py` (PYKERNEL_DEVICE=cpu for the CPU)."""
import numpy as np

import pykernel as pk
from pykernel import Ptr, f16, i32


@pk.kernel
def leaky_axpy(a: f16, x: Ptr[f16, "ro"], y: Ptr[f16], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        v = pk.fma(a, x[i], y[i])
        y[i] = max(v, v * 0.125)               # f16 literal: the multiply stays in f16


@pk.kernel
def leaky_axpy_pairs(a: f16, x: Ptr[pk.f16x2, "ro"], y: Ptr[pk.f16x2], pairs: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < pairs:
        v = pk.fma(pk.f16x2(a, a), x[i], y[i])  # both halves: fma.rn.f16x2
        y[i] = max(v, v * 0.125)


def main(n: int = 100_002):
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(n).astype(np.float16) for _ in range(2))
    a = np.float16(1.5)
    v = (np.float64(a) * x.astype(np.float64) + y).astype(np.float16)   # one rounding
    want = np.maximum(v, v * np.float16(0.125))
    out = pk.to_device(y)
    leaky_axpy[(n + 255) // 256, 256](a, pk.to_device(x), out, n)
    assert np.array_equal(out.numpy(), want)
    pairs = pk.to_device(y.view(np.uint32))                  # pairs: uint32 words
    leaky_axpy_pairs[(n // 2 + 255) // 256, 256](a, pk.to_device(x.view(np.uint32)), pairs,
                                                 n // 2)
    assert np.array_equal(pairs.numpy().view(np.float16), want)
    print(f"half_precision on {pk.current_device().kind}: {n} elements OK")


if __name__ == "__main__":
    main()
