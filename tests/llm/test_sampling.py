"""Sampling chain: each filter against a direct computation, penalties, seeds, distribution."""
import numpy as np
import pytest

from llm.sampling import Sampler, SamplingParams, apply_penalties, candidates, top_k_ids

OFF = dict(top_k=0, top_p=1.0, min_p=0.0)


def test_greedy_is_argmax(rng):
    logits = rng.standard_normal(1000).astype(np.float32)
    for seed in range(3):
        assert Sampler(SamplingParams(temperature=0, seed=seed)).sample(logits) == np.argmax(logits)


def test_top_k_keeps_the_k_largest(rng):
    logits = rng.standard_normal(500).astype(np.float32)
    ids, probs = candidates(logits, SamplingParams(temperature=1.0, top_k=7, top_p=1.0, min_p=0))
    assert set(ids.tolist()) == set(np.argsort(-logits)[:7].tolist())
    assert np.isclose(probs.sum(), 1.0) and np.all(np.diff(probs) <= 1e-12)


def test_top_k_ids_are_the_k_largest_on_awkward_rows(rng, seed):
    """top_k_ids' sampled threshold against a full partition: vocabulary-sized rows, sorted
    rows, NaN entries (never chosen), and a row whose strided sample holds its largest values
    while the rest are small (the threshold leaves fewer than k: the full partition)."""
    rows = []
    for n in (128256, 49152, 1000, 33):
        rows.append((rng.standard_normal(n) * rng.uniform(0.1, 10)).astype(np.float32))
    rows.append(np.sort(rng.standard_normal(151936).astype(np.float32)))
    with_nan = rng.standard_normal(50000).astype(np.float32)
    with_nan[rng.integers(0, 50000, 5)] = np.nan
    rows.append(with_nan)
    misleading = np.zeros(128256, np.float32)
    misleading[::32] = 100.0 + rng.standard_normal(4008).astype(np.float32)
    misleading[1::32] = 50.0
    rows.append(misleading)
    for row in rows:
        for k in (1, 7, 40, 256):
            k = min(k, row.shape[0] - 1)
            got = top_k_ids(row, k)
            assert len(set(got.tolist())) == k, f"seed {seed}"
            want = np.sort(row[np.argpartition(-row, k - 1)[:k]])
            assert np.array_equal(np.sort(row[got]), want), f"seed {seed}: n {row.shape} k {k}"
            assert not np.isnan(row[got]).any()


def test_top_p_keeps_smallest_prefix_reaching_p(rng):
    logits = rng.standard_normal(300).astype(np.float32) * 3
    p = 0.6
    ids, _ = candidates(logits, SamplingParams(temperature=1.0, **{**OFF, "top_p": p}))
    order = np.argsort(-logits, kind="stable")
    full = np.exp(logits[order] - logits.max())
    full /= full.sum()
    cum = np.cumsum(full)
    expected = int(np.argmax(cum >= p)) + 1
    assert ids.tolist() == order[:expected].tolist()
    assert p <= cum[expected - 1] + 1e-9
    assert expected == 1 or cum[expected - 2] < p


def test_min_p_drops_tokens_below_fraction_of_best(rng):
    logits = rng.standard_normal(300).astype(np.float32) * 2
    ids, _ = candidates(logits, SamplingParams(temperature=1.0, **{**OFF, "min_p": 0.2}))
    probs = np.exp(logits - logits.max())
    assert set(ids.tolist()) == set(np.nonzero(probs >= 0.2)[0].tolist())


def test_temperature_scales_distribution(rng):
    logits = rng.standard_normal(50).astype(np.float32)
    for temp in (0.5, 2.0):
        ids, probs = candidates(logits, SamplingParams(temperature=temp, **OFF))
        ref = np.exp((logits[ids] - logits.max()) / temp)
        assert np.allclose(probs, ref / ref.sum(), rtol=1e-6)


def test_repeat_presence_frequency_penalties():
    logits = np.array([2.0, -1.0, 3.0, 0.5, 1.0], dtype=np.float32)
    history = [0, 1, 1, 4, 3]
    out = apply_penalties(logits, history, SamplingParams(
        repeat_penalty=2.0, repeat_last_n=3, presence_penalty=0.5, frequency_penalty=0.25))
    # window = [1, 4, 3]: positive logits divided, negative multiplied, then the other penalties
    assert out[0] == 2.0 and out[2] == 3.0  # outside the window / never seen
    assert out[1] == pytest.approx(-1.0 * 2 - 0.25 - 0.5)
    assert out[4] == pytest.approx(1.0 / 2 - 0.25 - 0.5)
    assert out[3] == pytest.approx(0.5 / 2 - 0.25 - 0.5)
    whole = apply_penalties(logits, history, SamplingParams(repeat_penalty=2.0, repeat_last_n=-1))
    assert whole[0] == 1.0 and whole[2] == 3.0
    assert np.array_equal(apply_penalties(logits, history, SamplingParams(
        repeat_penalty=2.0, repeat_last_n=0)), logits)


def test_penalty_changes_greedy_choice():
    logits = np.array([1.0, 0.9, 0.1], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0, repeat_penalty=1.5))
    assert sampler.sample(logits, history=[]) == 0
    assert sampler.sample(logits, history=[0]) == 1


@pytest.mark.parametrize("params,plain", [
    (dict(temperature=0), True),
    (dict(temperature=0, repeat_penalty=1.5), False),
    (dict(temperature=0, presence_penalty=0.5), False),
    (dict(temperature=0, frequency_penalty=-0.2), False),
    (dict(temperature=0, repeat_penalty=1.5, repeat_last_n=0), True),   # window off
    (dict(temperature=0.7), False)])
def test_plain_argmax_means_the_argmax_alone_decides(params, plain, rng):
    """plain_argmax (a backend may then take the token on its device): exactly the samplers
    whose pick is np.argmax of the raw logits whatever the history."""
    sampler = Sampler(SamplingParams(seed=0, **params))
    assert sampler.plain_argmax is plain
    if plain:
        logits = rng.standard_normal(500).astype(np.float32)
        history = [int(np.argmax(logits))] * 3
        assert sampler.sample(logits, history) == np.argmax(logits)


@pytest.mark.parametrize("params,drawable", [
    (dict(temperature=0), True), (dict(temperature=0, repeat_penalty=1.3, seed=4), True),
    (dict(temperature=0.8, top_k=40), True), (dict(temperature=0.8, top_k=40, seed=4), False),
    (dict(temperature=0.8, top_k=40, presence_penalty=0.5), True),
    (dict(temperature=0.8, top_k=0), False), (dict(temperature=0.8, top_k=257), False)])
def test_device_row_draws_means_greedy_or_unseeded_top_k(params, drawable):
    """device_row_draws (Backend.sample_rows may draw the token on the device, penalties
    applied there first): any greedy sampler (a seed decides nothing there), or an unseeded
    one whose top-k list (up to CANDIDATE_K_MAX) holds every token it may draw."""
    assert Sampler(SamplingParams(**params)).device_row_draws is drawable


@pytest.mark.parametrize("params,k", [
    (dict(temperature=0), 1), (dict(temperature=0.8, top_k=40), 40),
    (dict(temperature=0.8, top_k=256), 256), (dict(temperature=0.8, top_k=257), 0),
    (dict(temperature=0.8, top_k=0), 0), (dict(temperature=0.8, repeat_penalty=1.1), 0),
    (dict(temperature=0.8, top_k=40, repeat_penalty=1.1, repeat_last_n=0), 40)])
def test_candidate_k_and_sampling_among_the_largest_logits(params, k, rng, seed):
    """candidate_k: how many of a row's largest logits decide the token (0: the whole row).
    sample_among over a superset of those (here the 3k largest, shuffled) draws the same
    tokens as sample over the whole row with the same seed."""
    assert Sampler(SamplingParams(**params)).candidate_k == k
    if not k:
        return
    whole, among = Sampler(SamplingParams(seed=seed, **params)), \
        Sampler(SamplingParams(seed=seed, **params))
    for _ in range(20):
        logits = (rng.standard_normal(5000) * 3).astype(np.float32)
        ids = rng.permutation(np.argsort(-logits)[:3 * k])
        assert among.sample_among(logits[ids], ids) == whole.sample(logits), f"seed {seed}"


def test_seed_reproducible_and_different_seeds_differ(rng):
    logits = rng.standard_normal(2000).astype(np.float32)

    def draws(seed):
        sampler = Sampler(SamplingParams(seed=seed, temperature=1.5, **OFF))
        return [sampler.sample(logits) for _ in range(40)]

    assert draws(11) == draws(11)
    assert draws(11) != draws(12)


def test_draws_follow_the_distribution(seed):
    logits = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    sampler = Sampler(SamplingParams(temperature=1.0, seed=seed, **OFF))
    counts = np.bincount([sampler.sample(logits) for _ in range(6000)], minlength=3) / 6000
    assert np.allclose(counts, [0.5, 0.3, 0.2], atol=0.03), f"seed {seed}: {counts}"


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(min_p=2),
                                 dict(repeat_penalty=0), dict(repeat_last_n=-2)])
def test_invalid_parameters(bad):
    with pytest.raises(ValueError, match="invalid sampling parameter"):
        Sampler(SamplingParams(**bad))


def test_rows_sampled_together_pick_what_each_picks_alone(rng, seed):
    """sample_among_rows (a batched step's rows in one numpy pass, lists of different lengths
    padded) gives each sampler the token Sampler.sample gives it over its whole row with the
    same seed: greedy, top-k with top-p / min-p / temperatures, top-k above the list."""
    from llm.sampling import sample_among_rows
    params = [dict(temperature=0), dict(top_k=40), dict(top_k=5, top_p=0.5, temperature=1.3),
              dict(top_k=100, min_p=0.2), dict(top_k=3, top_p=1.0, min_p=0.0, temperature=2)]
    together = [Sampler(SamplingParams(seed=seed + i, **p)) for i, p in enumerate(params)]
    alone = [Sampler(SamplingParams(seed=seed + i, **p)) for i, p in enumerate(params)]
    for _ in range(30):
        rows = (rng.standard_normal((len(params), 3000)) * 3).astype(np.float32)
        lists = []
        for row, p in zip(rows, params):
            ids = rng.permutation(np.argsort(-row)[:p.get("top_k", 1) + rng.integers(0, 50)])
            lists.append((row[ids], ids))
        assert sample_among_rows(together, lists) == [s.sample(r) for s, r in
                                                      zip(alone, rows)], f"seed {seed}"


def test_ties_at_the_top_k_cut_keep_the_lowest_ids(rng):
    """top_k_ids and the filters' order: the lowest ids first among equal logits, so a cut
    through a tie is the same from any superset of the k largest (a device's candidates)."""
    logits = np.zeros(5000, np.float32)
    logits[[4000, 17, 2500, 900]] = [3.0, 1.0, 1.0, 1.0]
    assert sorted(top_k_ids(logits, 3).tolist()) == [17, 900, 4000]
    assert sorted(top_k_ids(logits, 6).tolist()) == [0, 1, 17, 900, 2500, 4000]
    ids, probs = candidates(logits, SamplingParams(temperature=1.0, **OFF))
    assert ids[:5].tolist() == [4000, 17, 900, 2500, 0] and probs[1] == probs[2]


def test_draw_rows_is_numpys_choice(rng):
    """draw_rows with a generator's next uniform picks what Generator.choice(p=) picks."""
    from llm.sampling import draw_rows
    for _ in range(200):
        n = int(rng.integers(1, 200))
        probs = rng.random(n) ** 6
        probs /= probs.sum()
        s = int(rng.integers(1 << 30))
        expected = np.random.default_rng(s).choice(n, p=probs)
        got = draw_rows(np.arange(n)[None], probs[None], [np.random.default_rng(s).random()])
        assert got[0] == expected


def test_one_list_alone_draws_what_padded_rows_draw(rng, seed):
    """A sampler alone takes a shorter path (its list cut to each filter's prefix) than a
    batch (masked, padded rows): the same pick for the same uniform on random lists, ties,
    every filter on or off, a row padded beside a longer one."""
    from llm.sampling import _draw_one, _padded, draw_rows, filter_rows
    for trial in range(500):
        n = int(rng.integers(1, 300))
        values = (rng.standard_normal(n) * rng.uniform(0.1, 5)).astype(np.float32)
        if trial % 5 == 0:
            values[rng.integers(0, n, 3)] = values[0]
        ids = rng.permutation(100000)[:n]
        p = SamplingParams(temperature=float(rng.uniform(0.1, 2)),
                           top_k=int(rng.integers(0, n + 5)),
                           top_p=float(rng.choice([1.0, rng.uniform(0.05, 1)])),
                           min_p=float(rng.choice([0.0, rng.uniform(0, 0.5)])))
        u = float(rng.random())
        other = (rng.standard_normal(400).astype(np.float32), np.arange(400))
        rows_v, rows_i = _padded([(values, ids), other])
        sorted_ids, probs, _ = filter_rows(rows_v, rows_i, [p, SamplingParams()])
        together = int(draw_rows(sorted_ids, probs, [u, 0.5])[0])
        assert _draw_one(values, ids, p, u) == together, f"seed {seed} trial {trial}"


@pytest.mark.parametrize("params", [dict(temperature=0), dict(temperature=0.8, top_k=40),
                                    dict(temperature=0.8, top_k=0)], ids=["greedy", "k", "row"])
@pytest.mark.parametrize("poison", ["nan", "inf", "all-neg-inf"])
def test_non_finite_rows_raise_one_error_on_every_path(rng, params, poison):
    """A NaN/+Inf row (broken weights) or one with nothing drawable: NonFiniteLogitsError from
    the whole-row sampler, the candidate-list paths (a device's lists drop NaN, so a NaN row
    arrives empty) alone and batched; a finite neighbour in a batch is not the culprit."""
    from llm.sampling import NonFiniteLogitsError, filter_rows, sample_among_rows
    row = rng.standard_normal(300).astype(np.float32)
    row[rng.integers(300)] = {"nan": np.nan, "inf": np.inf, "all-neg-inf": -np.inf}[poison]
    if poison == "all-neg-inf":
        row[:] = -np.inf                         # one -Inf is a masked token, all: no draw
    samplers = [Sampler(SamplingParams(seed=1, **params)) for _ in range(3)]
    with pytest.raises(NonFiniteLogitsError):
        samplers[0].sample(row)                  # one NaN / +Inf in the whole row is enough
    if poison == "nan":
        row[:] = np.nan                          # broken weights: every logit NaN
    finite = rng.standard_normal(300).astype(np.float32)
    ids = np.arange(300)
    listed = (row[~np.isnan(row)], ids[~np.isnan(row)])
    for lists in ([listed], [(finite, ids), listed, (finite, ids)]):
        with pytest.raises(NonFiniteLogitsError):
            sample_among_rows(samplers[:len(lists)], lists)
    with pytest.raises(NonFiniteLogitsError):
        filter_rows(np.stack([finite, row]), np.stack([ids, ids]), [samplers[0].params] * 2)
