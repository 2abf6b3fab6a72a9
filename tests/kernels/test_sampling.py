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


@pytest.mark.parametrize("kw", [dict(temperature=0.8), dict(temperature=0.8, top_k=40,
                                top_p=0.9, min_p=0.05), dict(temperature=1.0, top_p=0.5)],
                         ids=["temperature", "filters", "top-p"])
@pytest.mark.parametrize("row", ["nan", "-inf", "+inf"])
def test_a_row_without_a_finite_max_draws_minus_one(device, rng, seed, kw, row):
    """Nothing to draw from (every logit NaN, every one -Inf, or a +Inf among numbers: broken
    weights): sample() gives -1 for each draw on every path (temperature only: one launch; the
    filters' two), sample_rows -1 for the row, as a flag the caller turns into an error;
    outputs poisoned. NaN and -Inf beside one finite logit leave that one to draw."""
    n = 5003                                 # several blocks
    x = rng.standard_normal(n).astype(np.float32)
    if row == "+inf":
        x[rng.integers(0, n)] = np.inf
    else:
        x[:] = np.nan if row == "nan" else -np.inf
    u = pk.to_device(rng.random(3).astype(np.float32))
    got = S.sample(x, u, **kw, out=pk.full(3, -7, np.int32)).numpy()
    assert got.tolist() == [-1, -1, -1], f"seed={seed}: drew {got} from a {row} row"
    settings = S.row_settings([0.4], **kw)
    assert S.sample_rows(x[None], settings, out=pk.full(1, -7, np.int32)).numpy()[0] == -1
    lone = int(rng.integers(0, n))
    x[:] = np.nan
    x[::7] = -np.inf
    x[lone] = -3.0
    assert S.sample(x, u, **kw).numpy().tolist() == [lone] * 3, f"seed={seed}"


def test_penalties(device, rng, seed):
    logits = rng.standard_normal(300).astype(np.float32) * 3
    history = rng.integers(-1, 40, 64).astype(np.int32)   # -1: empty slots
    arr = pk.to_device(logits)
    S.apply_penalties(arr, history, repeat=1.3, presence=0.4, frequency=0.25)
    ref = S.penalties_reference(logits, history, 1.3, 0.4, 0.25)
    assert np.allclose(arr.numpy(), ref, rtol=1e-6, atol=1e-6), f"seed={seed}"
    untouched = np.setdiff1d(np.arange(300), history)
    assert np.array_equal(arr.numpy()[untouched], logits[untouched])


def test_penalties_rows(device, rng, seed):
    """apply_penalties_rows: each row as penalties_reference gives it with its own window
    and settings; a row whose settings are (1, 0, 0) and every id outside its window stay
    bit for bit; poisoned nothing: the call works in place."""
    rows, vocab = 5, 300
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    history = rng.integers(-1, 60, (rows, 48)).astype(np.int32)   # -1: empty slots
    history[3, :] = -1
    settings = np.array([[1.3, 0.4, 0.25], [1.0, 0.0, 0.0], [0.8, -0.5, 0.1], [1.5, 1.0, 1.0],
                         [1.1, 0.0, 0.0]], np.float32)
    arr = pk.to_device(logits)
    S.apply_penalties_rows(arr, history, settings)
    got = arr.numpy()
    for r in range(rows):
        ref = S.penalties_reference(logits[r], history[r], *settings[r])
        assert np.allclose(got[r], ref, rtol=1e-6, atol=1e-6), f"seed={seed} row {r}"
        untouched = np.setdiff1d(np.arange(vocab), history[r])
        assert np.array_equal(got[r, untouched], logits[r, untouched]), f"seed={seed} row {r}"
    assert np.array_equal(got[1], logits[1]) and np.array_equal(got[3], logits[3])
    with pytest.raises(ValueError, match=r"history must be \(5, n\)"):
        S.apply_penalties_rows(arr, history[:2], settings)
    with pytest.raises(ValueError, match=r"settings must be \(5, 3\)"):
        S.apply_penalties_rows(arr, history, settings[:, :2])


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


def pooled_chi_square(counts, probs, draws):
    """(chi2, dof) with every bin expecting < 5 draws pooled into one bin."""
    expected = probs * draws
    big = expected >= 5
    exp_bins = np.append(expected[big], expected[~big].sum())
    got_bins = np.append(counts[big], counts[~big].sum())
    keep = exp_bins > 0
    chi2 = float(np.sum((got_bins[keep] - exp_bins[keep]) ** 2 / exp_bins[keep]))
    return chi2, max(int(keep.sum()) - 1, 1)


def hot_logits(rng, vocab, hot=60):
    """`hot` tokens spread over the vocabulary carry the mass; the rest sit ~40 nats below."""
    x = (rng.standard_normal(vocab) - 40.0).astype(np.float32)
    x[rng.choice(vocab, hot, replace=False)] = rng.standard_normal(hot) * 1.5
    return x


BIG_VOCAB = [dict(temperature=0.9), dict(temperature=0.7, top_k=20),
             dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05), dict(min_p=0.1),
             dict(top_p=0.8)]


@pytest.mark.parametrize("vocab", [9001, 12288])
@pytest.mark.parametrize("kw", BIG_VOCAB)
def test_sampler_distribution_many_blocks(device, rng, seed, vocab, kw):
    logits = hot_logits(rng, vocab)
    probs = S.filtered_probs_reference(logits, **kw)
    draws = 8000
    u = np.random.default_rng(99).random(draws).astype(np.float32)
    got = S.sample(logits, u, **kw, out=pk.full(draws, -1, np.int32)).numpy()
    assert got.min() >= 0 and np.all(probs[got] > 0), f"seed={seed} {kw}: drew a filtered token"
    chi2, dof = pooled_chi_square(np.bincount(got, minlength=vocab), probs, draws)
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10, f"seed={seed} {kw}: chi2 {chi2} dof {dof}"


@pytest.mark.parametrize("ties,kw", [(True, dict(top_k=3)), (True, dict(top_p=0.5)),
                                     (True, dict(top_k=50, min_p=0.2)),
                                     (False, dict(top_p=0.95, temperature=0.5)),
                                     (False, dict(min_p=0.01)),
                                     (False, dict(top_p=0.3, min_p=0.001))])
def test_sampler_beyond_candidate_list(device, rng, seed, ties, kw):
    # 3000 tied maxima (all kept by top-k's tie rule), or top-p over a flat vocabulary: more
    # survivors than the candidate list holds (the exact whole-vocabulary path decides), or
    # thresholds right at the candidate bound
    logits = (rng.standard_normal(7000) * (0.3 if ties else 1.0)).astype(np.float32)
    if ties:
        logits[rng.choice(7000, 3000, replace=False)] = 2.0
    probs = S.filtered_probs_reference(logits, **kw)
    draws = 3000
    u = np.random.default_rng(7).random(draws).astype(np.float32)
    got = S.sample(logits, u, **kw).numpy()
    assert got.min() >= 0 and np.all(probs[got] > 0), f"seed={seed} {kw}: drew a filtered token"
    chi2, dof = pooled_chi_square(np.bincount(got, minlength=logits.size), probs, draws)
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10, f"seed={seed} {kw}: chi2 {chi2} dof {dof}"


def test_argmax_ties_across_blocks_and_rows(device, rng, seed):
    x = rng.standard_normal((3, 20000)).astype(np.float32)
    x[0, [19999, 15000, 4097]] = 9.0      # lowest index wins across blocks
    x[1, :] = np.nan
    x[1, 12345] = -1.0                    # NaN never chosen
    x[2, 2048:4096] = 7.0
    got = S.argmax(x).numpy()
    assert got.tolist() == [4097, 12345, 2048], f"seed={seed}: {got}"


@pytest.mark.parametrize("rows,n,k", [(3, 1000, 40), (1, 1, 1), (2, 45, 45), (16, 32001, 64),
                                      (5, 4099, 1)])
def test_top_k_candidates_hold_the_k_largest(device, rng, seed, rows, n, k):
    """top_k_candidates lists exactly the reference's set (every logit at or above the k-th
    largest's histogram bin), values with their ids; NaN never; a row with fewer than k
    numbers lists them all; a row flat at the top overflows cap and says so; twice in a
    row (the kernels leave their scratch zeroed), outputs poisoned before each launch."""
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    x[0, rng.integers(0, n, 3)] = x.max()                      # ties at the top
    if rows > 2:
        x[1, ::3] = np.nan
        x[2, :] = 0.5                                          # flat: more than cap
    cap = min(n, 512)          # real rows list tens to hundreds; the flat row overflows
    expected = S.top_k_candidates_reference(x, k)
    for _ in range(2):
        values = pk.full((rows, cap), -7.0, np.float32)
        ids = pk.full((rows, cap), -7, np.int32)
        counts = pk.full(rows, -7, np.int32)
        S.top_k_candidates(x, k, cap=cap, values=values, ids=ids, counts=counts)
        values, ids, counts = values.numpy(), ids.numpy(), counts.numpy()
        for r in range(rows):
            assert counts[r] == len(expected[r]), f"seed={seed} row {r}"
            listed = ids[r, :min(counts[r], cap)]
            assert np.array_equal(values[r, :len(listed)], x[r, listed]), f"seed={seed}"
            if counts[r] <= cap:
                assert set(listed.tolist()) == expected[r], f"seed={seed} row {r}"
            else:
                assert set(listed.tolist()) <= expected[r] and rows > 2 and r == 2
            top = np.argsort(-np.nan_to_num(x[r], nan=-np.inf), kind="stable")[:k]
            assert set(top[~np.isnan(x[r, top])].tolist()) <= expected[r]


def test_top_k_candidates_checks_its_arguments(device):
    x = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="k must be in 1..10"):
        S.top_k_candidates(x, 0)
    with pytest.raises(ValueError, match="k must be in 1..10"):
        S.top_k_candidates(x, 11)
    with pytest.raises(ValueError, match="cap must be >= 1"):
        S.top_k_candidates(x, 3, cap=0)


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_top_k_candidate_kernels_ptx_assemble(arch, assemble):
    """rows_hist and rows_pick: PTX that ptxas accepts for every arch."""
    from stdlib_kernels.top_k_rows import rows_hist, rows_pick
    for kernel in (rows_hist, rows_pick):
        assemble(kernel.ptx(arch, VEC=4, UNITS=2), arch)


def row_filters(rng, rows):
    """Random per-row settings: greedy rows, top-k on and off, top-p, min-p."""
    temperature = np.where(rng.random(rows) < 0.2, 0.0, rng.uniform(0.3, 1.7, rows))
    top_k = np.where(rng.random(rows) < 0.25, 0, rng.integers(1, 300, rows))
    top_p = np.where(rng.random(rows) < 0.4, 1.0, rng.uniform(0.2, 0.99, rows))
    min_p = np.where(rng.random(rows) < 0.5, 0.0, rng.uniform(0.0, 0.3, rows))
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


@pytest.mark.parametrize("rows,n", [(7, 5003), (16, 32001), (3, 2), (1, 700)])
def test_sample_rows_draw_what_sample_draws(device, rng, seed, rows, n):
    """sample_rows: each row's token is the one sample() draws from that row alone with the
    same uniform and filters where top-k is on (the same survivors and sums); elsewhere (top-k
    off, an overflowed list: a row flat at the top, NaN rows) a token of the row's filtered
    support; an all-NaN row gives -1. Outputs poisoned; twice (the kernels' scratch is left
    reusable)."""
    x = (rng.standard_normal((rows, n)) * 2.5).astype(np.float32)
    if rows > 2:
        x[1, :] = 0.25                       # flat: overflows the candidate list
        x[2, ::2] = np.nan
    if rows > 3:
        x[3, :] = np.nan                     # nothing to draw: -1
    kw = row_filters(rng, rows)
    for _ in range(2):
        u = rng.random(rows)
        settings = S.row_settings(u, **kw)
        got = S.sample_rows(x, settings, out=pk.full(rows, -7, np.int32)).numpy()
        for r in range(rows):
            if r == 3:
                assert got[r] == -1, f"seed={seed}: an all-NaN row drew {got[r]}"
                continue
            mine = {name: value[r] for name, value in kw.items()}
            alone = S.sample(x[r], np.float32(u[r]), **mine).numpy()[0]
            probs = S.filtered_probs_reference(x[r], **mine) if mine["temperature"] > 0 else \
                (np.arange(n) == np.nanargmax(x[r])).astype(float)
            assert probs[got[r]] > 0, f"seed={seed} row {r} {mine}: drew a filtered token"
            if 0 < mine["top_k"] < n and r != 1:
                assert got[r] == alone, f"seed={seed} row {r} {mine}: {got[r]} vs {alone}"


@pytest.mark.parametrize("kw", [dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
                                dict(temperature=1.3, top_k=12), dict(top_p=0.7)])
def test_sample_rows_distribution(device, rng, seed, kw):
    rows, vocab = 600, 300
    logits = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    u = np.random.default_rng(4321).random(rows)     # fixed seed: chi-square
    got = S.sample_rows(np.tile(logits, (rows, 1)), S.row_settings(u, **kw)).numpy()
    probs = S.filtered_probs_reference(logits, **kw)
    assert np.all(probs[got] > 0), f"seed={seed} {kw}: drew a filtered token"
    chi2, dof = pooled_chi_square(np.bincount(got, minlength=vocab), probs, rows)
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10, f"seed={seed} {kw}: chi2 {chi2} dof {dof}"


def test_sample_rows_replay_with_settings_on_the_device(device, rng, seed):
    """Settings kept on the device (k given): the launches capture into a graph whose
    replays draw with whatever settings the array holds, as eager calls do."""
    rows, n = 5, 3000
    x = pk.to_device((rng.standard_normal((rows, n)) * 2).astype(np.float32))
    kw = dict(temperature=0.7, top_k=[40, 3, 0, 90, 1], top_p=0.9, min_p=0.05)
    settings = pk.to_device(S.row_settings(rng.random(rows), **kw))
    out = pk.full(rows, -7, np.int32)
    assert S.lists_k(S.row_settings(np.zeros(rows), **kw), n) == 90
    S.sample_rows(x, settings, k=90, out=out)           # workspace made before the capture
    with pk.capture_graph() as graph:
        S.sample_rows(x, settings, k=90, out=out)
    for _ in range(2):
        host = S.row_settings(rng.random(rows), **kw)
        settings.copy_from(host)
        out.fill(-7)
        graph.replay()
        pk.synchronize()
        eager = S.sample_rows(x, host).numpy()
        assert np.array_equal(out.numpy(), eager), f"seed={seed}"


def test_sample_rows_checks_its_arguments(device):
    x = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match=r"settings must be \(2, 5\)"):
        S.sample_rows(x, S.row_settings([0.5]))
    with pytest.raises(ValueError, match="cap must be in 1..2048"):
        S.sample_rows(x, S.row_settings([0.5, 0.5]), cap=4096)
    with pytest.raises(ValueError, match=r"every u must be in \[0, 1\)"):
        S.row_settings([0.5, 1.0])
    with pytest.raises(ValueError, match="need k"):
        S.sample_rows(x, pk.to_device(S.row_settings([0.5, 0.5])))


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_sample_rows_kernels_ptx_assemble(arch, assemble):
    from stdlib_kernels.sample_rows import rows_draw
    assemble(rows_draw.ptx(arch), arch)
    assemble(S.penalties_rows.ptx(arch), arch)


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_one_row_sampler_kernels_ptx_assemble(arch, assemble):
    """sample_temp, sample_hist and sample_pick (sample()'s launches, with their -1 for a row
    without a finite maximum): PTX that ptxas accepts for every arch."""
    from stdlib_kernels.sample_filter import sample_hist, sample_pick
    from stdlib_kernels.sample_kernels import sample_temp
    assemble(sample_temp.ptx(arch, VEC=4, UNITS=2), arch)
    assemble(sample_hist.ptx(arch, VEC=4, UNITS=2), arch)
    assemble(sample_pick.ptx(arch, VEC=4), arch)
