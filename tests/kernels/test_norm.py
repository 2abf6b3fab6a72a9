"""RMSNorm / per-head RMSNorm / LayerNorm kernels vs float64 numpy references (CPU and GPU)."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import norm

# >= 64 rows take the multi-unit register layouts (_rows.FEW_ROWS); fewer rows, 1 unit/thread
SHAPES = [(3, 64), (5, 1), (2, 45), (1, 4099), (2, 8192), (1, 20000), (6, 576), (1, 40000),
          (64, 576), (70, 45), (64, 2052)]


def rel_err(got, ref):
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def poisoned(shape, dtype=np.float32):
    return pk.full(shape, np.nan, dtype)


@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm_matches_reference(device, rng, seed, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    out = norm.rmsnorm(x, w, 1e-5, out=poisoned(shape)).numpy()
    err = rel_err(out, norm.rmsnorm_reference(x, w, 1e-5))
    assert err < 1e-5, f"seed={seed} shape={shape} rel err {err}"


@pytest.mark.parametrize("shape", [(3, 64), (2, 45), (1, 4099), (5, 2048), (1, 40000),
                                   (64, 2048), (65, 1001)])
def test_rmsnorm_fused_residual_writes_sum(device, rng, seed, shape):
    x, r = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    out, h = norm.rmsnorm(x, w, 1e-6, residual=r, out=poisoned(shape), sum_out=poisoned(shape))
    ref, ref_h = norm.rmsnorm_reference(x, w, 1e-6, residual=r)
    assert rel_err(out.numpy(), ref) < 1e-5, f"seed={seed}"
    assert rel_err(h.numpy(), ref_h) < 1e-6, f"seed={seed}"


def test_rmsnorm_in_place_residual_stream_and_no_weight(device, rng, seed):
    x = rng.standard_normal((4, 256)).astype(np.float32)
    r = rng.standard_normal((4, 256)).astype(np.float32)
    stream = pk.to_device(r)   # the residual stream is updated in place, as the runner does
    out, h = norm.rmsnorm(x, None, 1e-6, residual=stream, sum_out=stream)
    ref, ref_h = norm.rmsnorm_reference(x, None, 1e-6, residual=r)
    assert h is stream
    assert rel_err(stream.numpy(), ref_h) < 1e-6 and rel_err(out.numpy(), ref) < 1e-5, \
        f"seed={seed}"


def test_per_head_rmsnorm(device, rng, seed):
    q = rng.standard_normal((3, 5, 128)).astype(np.float32)   # (tokens, heads, head_dim)
    w = rng.standard_normal(128).astype(np.float32)
    out = norm.rmsnorm(q, w, 1e-6, out=poisoned(q.shape)).numpy()
    assert rel_err(out, norm.rmsnorm_reference(q, w, 1e-6)) < 1e-5, f"seed={seed}"


def test_rmsnorm_f16(device, rng, seed):
    x = rng.standard_normal((3, 96)).astype(np.float16)
    w = rng.standard_normal(96).astype(np.float32)
    out = norm.rmsnorm(x, w, 1e-6, out=poisoned(x.shape, np.float16)).numpy()
    ref = norm.rmsnorm_reference(x, w, 1e-6)
    assert np.allclose(out, ref, rtol=2e-3, atol=2e-3), f"seed={seed}"


def test_rmsnorm_unaligned_view_uses_scalar_path(device, rng, seed):
    base = pk.to_device(rng.standard_normal(4 * 64 + 1).astype(np.float32))
    x = base[1:].reshape(4, 64)   # 4-byte offset: no 16-byte vector loads
    out = norm.rmsnorm(x, None, 1e-5).numpy()
    assert rel_err(out, norm.rmsnorm_reference(x.numpy(), None, 1e-5)) < 1e-5, f"seed={seed}"


@pytest.mark.parametrize("shape", [(3, 64), (5, 1), (2, 45), (1, 4099), (9, 576), (1, 40000),
                                   (64, 4096), (66, 1002)])
def test_layernorm_matches_reference(device, rng, seed, shape):
    x = (rng.standard_normal(shape) * 2 + 5).astype(np.float32)   # offset: cancellation test
    w, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    out = norm.layernorm(x, w, b, 1e-5, out=poisoned(shape)).numpy()
    err = rel_err(out, norm.layernorm_reference(x, w, b, 1e-5))
    assert err < 1e-5, f"seed={seed} shape={shape} rel err {err}"


def test_norm_errors_name_the_argument(device):
    with pytest.raises(ValueError, match="weight has 3 elements"):
        norm.rmsnorm(np.zeros((2, 4), np.float32), np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="float32 or float16"):
        norm.layernorm(np.zeros((2, 4), np.int32))
