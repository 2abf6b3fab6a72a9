"""Array operations without writing a kernel: `@pk.elementwise` over a scalar function, random
numbers drawn inside it (inverted dropout with `pk.rand`), and a `@pk.reduction` sum."""
import numpy as np

import pykernel as pk
from pykernel import f32, i32


@pk.elementwise
def gelu_tanh(x: f32) -> f32:
    return f32(0.5) * x * (f32(1.0) + pk.tanh(f32(0.7978845608) * (x + f32(0.044715) * x * x * x)))


@pk.elementwise
def dropout(x: f32, index: i32, p: f32, seed: i32) -> f32:
    """x / (1 - p), or 0 with probability p: the draw depends only on (seed, index)."""
    return x / (f32(1.0) - p) if pk.rand(seed, index) >= p else f32(0.0)


@pk.reduction(identity=0.0)
def total(a: f32, b: f32) -> f32:
    return a + b


def main(n: int = 100_000):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    y = gelu_tanh(pk.to_device(x)).numpy()
    want = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    index = pk.to_device(np.arange(n, dtype=np.int32))
    kept = dropout(pk.to_device(np.ones(n, np.float32)), index, 0.25, 1234).numpy()
    dropped = float(np.mean(kept == 0))
    assert abs(dropped - 0.25) < 0.01 and np.allclose(kept[kept != 0], 1 / 0.75)
    mean = float(total(pk.to_device(y)).numpy()) / n
    assert abs(mean - float(y.astype(np.float64).mean())) < 1e-5
    print(f"elementwise on {pk.current_device().kind}: gelu (mean {mean:.4f}) and dropout "
          f"({dropped:.3f} dropped) OK")


if __name__ == "__main__":
    main()
