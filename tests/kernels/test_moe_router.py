"""The MoE router kernel (stdlib_kernels.moe.router) against its float64 numpy reference:
ids exactly (ties to the lower index), weights to f32 rounding of a few exp and divides."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels.moe.router import route_into, route_reference


def run(logits, k, mode, bias=None):
    tokens = logits.shape[0]
    ids = pk.full((tokens, k), -7, np.int32)
    weights = pk.full((tokens, k), np.nan, np.float32)
    route_into(pk.to_device(logits), ids, weights, k, mode,
               None if bias is None else pk.to_device(bias))
    return ids.numpy(), weights.numpy()


@pytest.mark.parametrize("mode", ["softmax_norm", "softmax", "topk_softmax"])
@pytest.mark.parametrize("tokens,n_expert,k", [(3, 8, 2), (5, 45, 4), (2, 128, 8)])
def test_router_matches_reference(device, rng, seed, mode, tokens, n_expert, k):
    logits = (rng.standard_normal((tokens, n_expert)) * 3).astype(np.float32)
    logits[0, rng.permutation(n_expert)[:3]] = logits[0].max()   # a three-way tie at the top
    if tokens > 1:                                            # NaN is never picked
        logits[1, rng.integers(n_expert)] = np.nan
    bias = (rng.standard_normal(n_expert)).astype(np.float32) if mode == "topk_softmax" \
        else None
    ids, w = run(logits, k, mode, bias)
    want_ids, want_w = route_reference(logits, k, mode, bias)
    assert np.array_equal(ids, want_ids), f"ids {ids} vs {want_ids} (seed {seed})"
    np.testing.assert_allclose(w, want_w, rtol=2e-6, atol=1e-7, err_msg=f"seed {seed}")
    if mode != "softmax":
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6, err_msg=f"seed {seed}")


def test_reference_semantics():
    """The modes on a hand-checked row: qwen3moe renormalises the top-k of the full softmax;
    gpt-oss adds the bias, takes the top-k logits and a softmax over them."""
    logits = np.array([[1.0, 3.0, 2.0, 3.0]], np.float32)
    ids, w = route_reference(logits, 2, "softmax_norm")
    assert ids.tolist() == [[1, 3]] and np.allclose(w, [[0.5, 0.5]])
    ids, w = route_reference(logits, 2, "topk_softmax", np.array([0, 0, 2, 0], np.float32))
    e = np.exp([0.0, -1.0])
    assert ids.tolist() == [[2, 1]] and np.allclose(w, [e / e.sum()])
    p = np.exp(logits[0] - 3) / np.exp(logits[0] - 3).sum()
    assert np.allclose(route_reference(logits, 3, "softmax")[1], [[p[1], p[3], p[2]]])


def test_router_rejects_bad_arguments():
    logits = pk.to_device(np.zeros((2, 8), np.float32))
    ids = pk.empty((2, 3), np.int32)
    w = pk.empty((2, 3), np.float32)
    with pytest.raises(ValueError, match="mode"):
        route_into(logits, ids, w, 3, "sigmoid")
    with pytest.raises(ValueError, match="k = 9"):
        route_into(logits, ids, w, 9, "softmax")
    with pytest.raises(ValueError, match="ids must be int32 with 2x2"):
        route_into(logits, ids, w, 2, "softmax")
