"""gpt-oss's attention with sinks on the kernels backend (CPU target) against the numpy backend,
at gpt-oss's head size 64, where the stdlib decode / prefill kernels take it (the tiny oracle
files have head size 16, which the backend's own per-head kernel serves): every step kind
(a prompt, one token, several prompts, a batched decode), full and sliding-window layers,
f32, f16 and q8_0 caches."""
import numpy as np
import pytest

import pykernel as pk
from llm import step as steps
from llm.backends.kernels_backend import KernelsBackend
from llm.backends.numpy_backend import NumpyBackend

N_HEAD, N_KV, HEAD_DIM = 8, 2, 64
# (kernels backend's activations, KV cache type): f32 everywhere (the accurate mode), f16
# with Q / P rounded to f16 as llama.cpp's CUDA path rounds them, q8_0 (the tensor-core decode
# kernel on int8 quants; the numpy cache holds the same Q8_0 values)
MODES = [("f32", "f32", 2e-5), ("q8_1", "f16", 5e-3), ("q8_1", "q8_0", 5e-3)]


def _rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _both(kb, nb, step, kcaches, ncaches, rng, sinks, window):
    """One attention call on both backends with the same fresh q / k / v rows."""
    n = step.n
    q = rng.standard_normal((n, N_HEAD * HEAD_DIM)).astype(np.float32)
    k = rng.standard_normal((n, N_KV * HEAD_DIM)).astype(np.float32)
    v = rng.standard_normal((n, N_KV * HEAD_DIM)).astype(np.float32)
    kstep = kb.begin_forward(step, kcaches)
    got = kb.to_host(kb.attention(pk.to_device(q), pk.to_device(k), pk.to_device(v), kstep,
                                  kcaches, 0, HEAD_DIM ** -0.5, window,
                                  sinks=pk.to_device(sinks)))
    want = nb.attention(q, k, v, step, ncaches, 0, HEAD_DIM ** -0.5, window, sinks=sinks)
    return got, want


@pytest.mark.parametrize("window", [0, 5], ids=["full", "window5"])
@pytest.mark.parametrize("activations,kv,tol", MODES, ids=["f32", "f16", "q8_0"])
def test_sinks_on_every_step_kind(rng, seed, window, activations, kv, tol):
    kb = KernelsBackend(device="cpu", activations=activations, kv_dtype=kv, graphs=False)
    nb = NumpyBackend()
    kcaches = kb.kv_caches(2, 1, 64, N_KV, HEAD_DIM, HEAD_DIM)
    ncaches = nb.kv_caches(2, 1, 64, N_KV, HEAD_DIM, HEAD_DIM)
    for c in ncaches:
        c.kv_type = kv
    sinks = rng.normal(0.0, 2.0, N_HEAD).astype(np.float32)
    sinks[int(rng.integers(N_HEAD))] = 5.0            # one head's sink takes most of its softmax
    n0, n1 = 11, 6
    plan = [("prompt", steps.tokens(np.zeros(n0), 0, all_logits=True), [0]),
            ("token", steps.tokens(np.zeros(1), n0), [0]),
            ("prompts", steps.prompts([np.zeros(n1), np.zeros(3)], [n0 + 1, 0], 2), [0, 1]),
            ("batch", steps.batch(np.zeros(2), [n0 + 1 + n1, 3], 2), [0, 1])]
    for what, step, which in plan:
        got, want = _both(kb, nb, step, [kcaches[i] for i in which],
                          [ncaches[i] for i in which], rng, sinks, window)
        assert np.isfinite(got).all() and _rel(got, want) < tol, \
            f"{what} step: relative L2 {_rel(got, want):.2e} (seed {seed})"
