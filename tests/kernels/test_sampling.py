"""Device sampling: argmax (lowest-index ties), penalties, and the temperature/top-k/top-p/
min-p sampler (support exactly as filtered; chi-square of the empirical distribution)."""
import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import sampling as S


@pytest.mark.parametrize("shape", [(3, 1000), (1, 1), (2, 45), (1, 32001)])
def test_argmax_equals_numpy(device, rng, seed, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, rng.integers(0, shape[1], 3)] = x.max() + 1.0   # ties: lowest index wins
    got = S.argmax(x, out=pk.full(shape[0], -7, np.int32)).numpy()
    assert np.array_equal(got, x.argmax(axis=1)), f"seed={seed}"


def test_argmax_skips_nan_and_greedy_sample(device, rng, seed):
    x = rng.standard_normal(500).astype(np.float32)
    x[10] = np.nan
    assert S.argmax(x).numpy()[0] == np.nanargmax(x)
    assert S.sample(x, 0.3, temperature=0.0).numpy()[0] == np.nanargmax(x)


def test_penalties(device, rng, seed):
    logits = rng.standard_normal(300).astype(np.float32) * 3
    history = rng.integers(-1, 40, 64).astype(np.int32)   # -1: empty slots
    arr = pk.to_device(logits)
    S.apply_penalties(arr, history, repeat=1.3, presence=0.4, frequency=0.25)
    ref = S.penalties_reference(logits, history, 1.3, 0.4, 0.25)
    assert np.allclose(arr.numpy(), ref, rtol=1e-6, atol=1e-6), f"seed={seed}"
    untouched = np.setdiff1d(np.arange(300), history)
    assert np.array_equal(arr.numpy()[untouched], logits[untouched])


FILTERS = [dict(), dict(top_k=7), dict(top_p=0.6), dict(min_p=0.15),
           dict(temperature=0.6, top_k=20, top_p=0.9, min_p=0.02),
           dict(temperature=1.7, top_k=1)]


@pytest.mark.parametrize("kw", FILTERS)
def test_sampler_distribution(device, rng, seed, kw):
    vocab, draws = 60, 20000
    logits = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    probs = S.filtered_probs_reference(logits, **kw)
    u = np.random.default_rng(1234).random(draws).astype(np.float32)  # fixed seed: chi-square
    got = S.sample(logits, u, **kw, out=pk.full(draws, -1, np.int32)).numpy()
    assert got.min() >= 0 and np.all(probs[got] > 0), f"seed={seed} {kw}: drew a filtered token"
    counts = np.bincount(got, minlength=vocab)
    support = probs > 0
    expected = probs[support] * draws
    chi2 = float(np.sum((counts[support] - expected) ** 2 / expected))
    dof = max(int(support.sum()) - 1, 1)
    # mean dof, sd sqrt(2 dof): 6 sd is a false-alarm rate well below 1e-6
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10, f"seed={seed} {kw}: chi2 {chi2} dof {dof}"


def test_filters_exclude_exactly(device):
    # softmax of these logits: ~[0.467, 0.172, 0.172, 0.063, 0.063, ...]: exact cut points
    logits = np.array([3.0, 2.0, 2.0, 1.0, 1.0, 0.0, -1.0, -5.0], np.float32)
    u = np.linspace(0, 1, 4000, endpoint=False).astype(np.float32)
    for kw, allowed in [(dict(top_k=1), {0}), (dict(top_k=3), {0, 1, 2}),
                        (dict(top_k=2), {0, 1, 2}),        # tie at the k-th value: both kept
                        (dict(top_p=0.4), {0}), (dict(top_p=0.5), {0, 1, 2}),
                        (dict(min_p=0.3), {0, 1, 2}), (dict(min_p=0.1), {0, 1, 2, 3, 4}),
                        (dict(min_p=0.01), set(range(7)))]:
        got = set(S.sample(logits, u, **kw).numpy().tolist())
        ref = set(np.flatnonzero(S.filtered_probs_reference(logits, **kw)).tolist())
        assert got == allowed == ref, f"{kw}: drew {sorted(got)}, expected {sorted(allowed)}"


def test_u_edges(device):
    logits = np.array([0.0, 1.0, -np.inf, 2.0], np.float32)
    got = S.sample(logits, np.array([0.0, 0.9999999], np.float32)).numpy()
    assert got[0] == 0 and got[1] == 3
