"""Row softmax (scale, causal mask, soft-capping) vs float64 numpy."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import row_softmax as S
from stdlib_kernels._rows import RowConfig


def check(got, ref, seed, what):
    # relative error per probability: exact math keeps it below 1e-5 (tiny floor for ~0)
    err = np.abs(got - ref) / np.maximum(ref, 1e-20)
    assert np.all(err < 1e-5) or np.allclose(got, ref, rtol=1e-5, atol=1e-12), \
        f"seed={seed} {what}: max rel err {err.max()}"


# >= 64 rows take the multi-unit register layouts (_rows.FEW_ROWS)
@pytest.mark.parametrize("shape", [(3, 64), (5, 1), (2, 45), (1, 4099), (2, 20000), (7, 576),
                                   (1, 40000), (64, 576), (64, 3001), (96, 8192)])
def test_softmax_rows(device, rng, seed, shape):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    out = S.softmax(x, 0.7, out=pk.full(shape, np.nan, np.float32)).numpy()
    check(out, S.softmax_reference(x, 0.7), seed, f"softmax {shape}")
    assert np.allclose(out.sum(-1), 1.0, atol=1e-5)


def test_softmax_large_logits_stable(device):
    x = np.array([[1000.0, 999.0, -1000.0], [-1e30, 0.0, 88.0]], np.float32)
    out = S.softmax(x).numpy()
    check(out, S.softmax_reference(x), 0, "large logits")


@pytest.mark.parametrize("q_len,pos_offset", [(None, None), (3, 5), (2, -1)])
def test_causal_mask(device, rng, seed, q_len, pos_offset):
    x = rng.standard_normal((6, 9)).astype(np.float32)
    out = S.softmax(x, 0.5, causal=True, q_len=q_len, pos_offset=pos_offset,
                    out=pk.full(x.shape, np.nan, np.float32)).numpy()
    ref = S.softmax_reference(x, 0.5, True, q_len, pos_offset)
    check(out, ref, seed, "causal")
    assert np.array_equal(out == 0, ref == 0), f"seed={seed}: masked entries differ"


def test_softcap(device, rng, seed):
    x = (rng.standard_normal((4, 33)) * 50).astype(np.float32)
    out = S.softmax(x, 1.0, softcap=30.0).numpy()
    check(out, S.softmax_reference(x, 1.0, softcap=30.0), seed, "softcap")
    out = S.softmax(x, 0.25, causal=True, softcap=5.0).numpy()
    check(out, S.softmax_reference(x, 0.25, True, softcap=5.0), seed, "softcap+causal")


def test_causal_softcap_many_rows(device, rng, seed):
    # >= 64 rows: several 4-element units per thread, partial last unit (n = 301)
    x = (rng.standard_normal((64, 301)) * 20).astype(np.float32)
    out = S.softmax(x, 0.3, causal=True, q_len=16, pos_offset=200, softcap=8.0,
                    out=pk.full(x.shape, np.nan, np.float32)).numpy()
    ref = S.softmax_reference(x, 0.3, True, 16, 200, softcap=8.0)
    check(out, ref, seed, "causal+softcap many rows")
    assert np.array_equal(out == 0, ref == 0), f"seed={seed}: masked entries differ"


# one_pass: (max, sum) pairs in one reduction; trigger: launch_dependents at entry
VARIANTS = [RowConfig(2, 4, True, one_pass=True, trigger=True),
            RowConfig(1, 8, one_pass=True, trigger=True), RowConfig(2, 4, True),
            RowConfig(4, 1, True)]


@pytest.mark.parametrize("config", VARIANTS, ids=str)
def test_softmax_geometry_variants(device, rng, seed, config, monkeypatch):
    """Several rows per block with a partial last block (67 rows), launch bounds, causal (some
    threads hold only masked logits: their (max, sum) pair is (-inf, 0))."""
    monkeypatch.setattr(S, "SOFTMAX", ((1 << 30, config),))
    x = (rng.standard_normal((67, 1000)) * 4).astype(np.float32)
    out = S.softmax(x, 0.7, causal=True, q_len=32, pos_offset=900,
                    out=pk.full(x.shape, np.nan, np.float32)).numpy()
    check(out, S.softmax_reference(x, 0.7, True, 32, 900), seed, f"softmax {config}")


@pytest.mark.parametrize("one_pass", [True, False])
def test_softmax_far_apart_maxima(device, rng, seed, one_pass, monkeypatch):
    """One logit 200 above the rest: other threads' sums are rescaled by exp(m - max), which
    flushes to 0 (as the exact result's e**-200 does), and a row of -inf gives zeros."""
    monkeypatch.setattr(S, "SOFTMAX", ((1 << 30, RowConfig(4, one_pass=one_pass)),))
    x = (rng.standard_normal((64, 3001)) * 4).astype(np.float32)
    x[:, 7] += 200.0
    x[1] = -np.inf
    out = S.softmax(x, 0.7, out=pk.full(x.shape, np.nan, np.float32)).numpy()
    check(out, S.softmax_reference(x, 0.7), seed, f"far maxima one_pass={one_pass}")
    assert np.all(out[1] == 0.0), f"seed={seed}: a row of -inf must give zeros"
