"""Two GEMVs of different types in one launch (stdlib_kernels.quant.gemv_pair): each part must
equal, bit for bit, the register kernel run alone on it (same body, same tuned shape), and the
runner's mixed-type one-token matmul takes it."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.gemv import gemv_config, gemv_q8_into, weight_words
from stdlib_kernels.quant.gemv_pair import GemvPart, gemv_q8_pair_into, pair_eligible
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into


def _alone(words, type_name, xq, rows, n, res):
    """The part through gemv_q8_into with the same register-kernel shape (its tuned config
    given explicitly: never the bulk-copy kernel)."""
    y = pk.full((rows,), np.nan, np.float32)
    gemv_q8_into(words, type_name, xq, y, rows, n, res=res,
                 mode=None if res is None else "residual",
                 config=gemv_config(type_name, 1, n))
    return y.numpy()


@pytest.mark.parametrize("types,rows,n,residual", [
    (("Q4_K", "Q6_K"), (96, 37), 512, False),      # Q4_K_M's q|k + v
    (("Q4_K", "Q6_K"), (70, 33), 256, True),
    (("Q6_K", "Q4_K"), (5, 130), 512, False),
    (("Q4_0", "Q8_0"), (41, 19), 160, True),
    (("Q5_K", "Q4_1"), (23, 64), 256, False),
])
def test_pair_matches_each_part_alone(device, rng, seed, types, rows, n, residual):
    x = rng.standard_normal((1, n)).astype(np.float32)
    xq = pk.empty((1, q8_1_bytes(n)), np.uint8)
    quantize_q8_1_into(pk.to_device(x), xq)
    if not pair_eligible(types[0], rows[0], types[1], rows[1], n, xq):
        pytest.skip(f"{types} take different block shapes on this device")
    parts, alone = [], []
    for t, r in zip(types, rows):
        raw = ref.quantize(rng.standard_normal((r, n)).astype(np.float32), t)
        words = weight_words(pk.to_device(raw), t, n)[0]
        res = pk.to_device(rng.standard_normal(r).astype(np.float32)) if residual else None
        alone.append(_alone(words, t, xq, r, n, res))
        parts.append(GemvPart(words, t, r, pk.full((r,), np.nan, np.float32), res))
    gemv_q8_pair_into(parts, xq, n, "residual" if residual else None)
    for p, want in zip(parts, alone):
        got = p.y.numpy()
        assert np.isfinite(got).all(), f"{p.type_name}: rows left unwritten (seed {seed})"
        assert np.array_equal(got, want), f"{p.type_name}: pair != alone (seed {seed})"


def test_pair_rejects_what_it_cannot_run(device, rng):
    n = 256
    xq = pk.empty((1, q8_1_bytes(n)), np.uint8)
    words = weight_words(pk.to_device(ref.quantize(np.ones((4, n), np.float32), "Q4_K")),
                         "Q4_K", n)[0]
    y = pk.empty((4,), np.float32)
    part = GemvPart(words, "Q4_K", 4, y)
    with pytest.raises(ValueError, match="two parts"):
        gemv_q8_pair_into([part], xq, n)
    with pytest.raises(ValueError, match="needs res"):
        gemv_q8_pair_into([part, part], xq, n, "residual")
    with pytest.raises(ValueError, match="mode 'swiglu'"):
        gemv_q8_pair_into([part, part], xq, n, "swiglu")
    assert not pair_eligible("F16", 4, "Q4_K", 4, n, xq)
