"""SiLU / GELU (tanh, erf) and the gated forms (SwiGLU, GeGLU) vs float64 numpy."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import activations as A

ACTS = ["silu", "gelu_tanh", "gelu_erf"]


def check(got, ref, seed, what):
    # exact math: relative error ~1e-7 per op; absolute floor for values near zero
    assert np.allclose(got, ref, rtol=1e-5, atol=1e-6), \
        f"seed={seed} {what}: max err {np.max(np.abs(got - ref))}"


# >= 64 rows: several 4-element units per thread (_launch.elementwise_geometry), with a
# partial last block (2052) and the unaligned scalar path (45)
@pytest.mark.parametrize("shape", [(3, 64), (5, 1), (2, 45), (1, 4099), (64, 2052), (70, 45)])
@pytest.mark.parametrize("act", ACTS)
def test_gated_and_plain(device, rng, seed, shape, act):
    g = (rng.standard_normal(shape) * 4).astype(np.float32)
    u = rng.standard_normal(shape).astype(np.float32)
    out = A.glu(g, u, act, out=pk.full(shape, np.nan, np.float32)).numpy()
    check(out, A.glu_reference(g, u, act), seed, f"{act}_mul")
    plain = A.activation(g, act, out=pk.full(shape, np.nan, np.float32)).numpy()
    check(plain, A.activation_reference(g, act), seed, act)


@pytest.mark.parametrize("n", [7, 64])
def test_glu_fused_halves(device, rng, seed, n):
    g, u = (rng.standard_normal((3, n)).astype(np.float32) for _ in range(2))
    out = A.glu_fused(np.concatenate([g, u], axis=1), "gelu_tanh").numpy()
    check(out, A.glu_reference(g, u, "gelu_tanh"), seed, "glu_fused")


def test_named_wrappers_and_f16(device, rng, seed):
    g, u = (rng.standard_normal((2, 40)).astype(np.float32) for _ in range(2))
    check(A.silu_mul(g, u).numpy(), A.glu_reference(g, u, "silu"), seed, "silu_mul")
    check(A.gelu_tanh_mul(g, u).numpy(), A.glu_reference(g, u, "gelu_tanh"), seed, "geglu")
    check(A.silu(g).numpy(), A.activation_reference(g, "silu"), seed, "silu")
    h = A.silu_mul(g.astype(np.float16), u.astype(np.float16)).numpy()
    assert h.dtype == np.float16
    assert np.allclose(h, A.glu_reference(g.astype(np.float16), u.astype(np.float16)),
                       rtol=2e-3, atol=2e-3), f"seed={seed}"


@pytest.mark.parametrize("rows", [1, 64])
def test_extreme_inputs_stay_finite(device, rows):
    x = np.tile(np.array([[-100.0, -87.5, -30.0, -1e-30, 0.0, 1e-30, 30.0, 87.5, 100.0, 3e38]],
                         np.float32), (rows, 1))
    for act in ACTS:
        out = A.activation(x, act).numpy()
        assert np.all(np.isfinite(out)), act
        check(out, A.activation_reference(x, act), 0, act)


def test_shape_mismatch(device):
    with pytest.raises(ValueError, match="gate shape"):
        A.silu_mul(np.zeros((2, 4), np.float32), np.zeros((2, 5), np.float32))
