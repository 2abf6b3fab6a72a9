"""Shared by the attention tests: random prefill problems, their float64 reference, and the
error check (relative L2 under a per-dtype bound, every element finite: outputs start as NaN,
so an unwritten row fails)."""
import numpy as np

from stdlib_kernels.attention.reference import attention_reference, relative_l2

# relative L2 bounds (as the suites had them): an f16 cache and the tensor-core paths' f16
# operands round each value to 11 bits; with f32 only the f32 accumulation's rounding is left
TOLERANCE = {np.float16: 5e-3, np.float32: 1e-4}


def check_close(actual, expected, dtype, seed, what):
    err = relative_l2(actual, expected)
    assert np.isfinite(actual).all() and err < TOLERANCE[dtype], \
        f"{what}: relative L2 error {err:.3g} (seed {seed})"


def prefill_problem(rng, tokens, start, n_head, n_kv_head, head_dim, dtype, spare=3):
    """q (tokens, n_head, head_dim) f32 and a cache k, v (n_kv_head, max_len, head_dim) of
    dtype whose rows start.. belong to the prompt's tokens; `spare` rows past them."""
    max_len = start + tokens + spare
    q = rng.standard_normal((tokens, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(dtype)
    v = rng.standard_normal((n_kv_head, max_len, head_dim)).astype(dtype)
    return q, k, v


def prefill_expected(q, k, v, start, scale, window=None, softcap=None, sinks=None):
    """The float64 reference of q's tokens at positions start.. over the cache's first
    start + tokens rows."""
    kv_tokens = start + q.shape[0]
    return attention_reference(q, k[:, :kv_tokens].transpose(1, 0, 2),
                               v[:, :kv_tokens].transpose(1, 0, 2), scale, window, softcap,
                               sinks=sinks)
