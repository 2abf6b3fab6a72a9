"""The step as an argument (llm/step.py): a `Step`'s ids and positions reach the backend's embed
and rope, and the step itself its attention, as arguments of those ops (a recording backend
sees the very arrays), for every kind of step; the kernels backend keeps nothing of a step
once it is done (CPU target: eager, captured and replayed steps of every kind); the Step
constructors reject lists that do not match."""
import numpy as np
import pytest

import llm
from llm import step as S
from llm.backends.numpy_backend import NumpyBackend
from tests.llm.gguf_helpers import TINY, TINY_LLAMA, require_for_module

require_for_module(TINY_LLAMA)


class RecordingBackend(NumpyBackend):
    """The numpy backend, noting what its step-reading ops are given."""

    def __init__(self):
        super().__init__()
        self.begun, self.calls = [], []

    def begin_forward(self, step, caches):
        self.begun.append((step, caches))
        return super().begin_forward(step, caches)

    def embed(self, table, ids, scale=1.0):
        self.calls.append(("embed", ids))
        return super().embed(table, ids, scale)

    def rope(self, x, positions, head_dim, params, freq_factors=None):
        self.calls.append(("rope", positions))
        return super().rope(x, positions, head_dim, params, freq_factors)

    def attention(self, q, k, v, step, caches, layer, scale, window=0):
        self.calls.append(("attention", step, caches, layer))
        return super().attention(q, k, v, step, caches, layer, scale, window)


def random_steps(rng, n_vocab: int, n_ctx: int) -> list:
    """One step of each kind with random ids, starts and lengths: (step, number of caches)."""
    starts = rng.integers(0, n_ctx // 2, 3)
    lengths = rng.integers(1, 6, 3)
    prompts = [rng.integers(0, n_vocab, int(n)) for n in lengths]
    return [(S.tokens(prompts[0], int(starts[0])), 1),
            (S.tokens(prompts[1], int(starts[1]), all_logits=True), 1),
            (S.batch(rng.integers(0, n_vocab, 3), starts, 3), 3),
            (S.prompts(prompts, list(starts), 3), 3)]


@pytest.mark.parametrize("name", ["tiny-llama-f32.gguf", "tiny-gpt2-f32.gguf"])
def test_step_inputs_reach_the_ops_as_arguments(name, rng):
    """embed gets the step's ids (and, with learned positions, its positions), rope its
    positions, attention the step and the caches, every layer, for every kind of step; the
    logits are the kept rows'."""
    model = llm.load(TINY / name, backend="numpy", n_ctx=64, progress=False)
    t, cfg = model.transformer, model.config
    t.backend = recording = RecordingBackend()
    for step, n_caches in random_steps(rng, cfg.n_vocab, 64):
        caches = [recording.kv_cache(cfg.n_layer, 64, cfg.n_head_kv, cfg.head_dim,
                                     cfg.head_dim_v) for _ in range(n_caches)]
        recording.begun.clear()
        recording.calls.clear()
        logits = t.forward(step, caches)
        assert recording.begun == [(step, caches)]
        embeds = [c[1] for c in recording.calls if c[0] == "embed"]
        assert embeds[0] is step.ids
        assert all(p is step.positions for p in embeds[1:])       # gpt2's position table
        assert len(embeds) == (2 if t.spec.learned_positions else 1)
        ropes = [c[1] for c in recording.calls if c[0] == "rope"]
        assert all(p is step.positions for p in ropes)
        per_layer = 1 if recording.rope_qk_together else 2       # q|k together, or q and k
        assert len(ropes) == (0 if t.spec.learned_positions else per_layer * cfg.n_layer)
        attends = [c[1:] for c in recording.calls if c[0] == "attention"]
        assert [layer for _, _, layer in attends] == list(range(cfg.n_layer))
        assert all(s is step and c is caches for s, c, _ in attends)
        kept = 1 if step.keeps_last else (step.n if step.keep is None else len(step.keep))
        assert logits.shape == (kept, cfg.n_vocab)


def test_step_constructors_check_their_lists():
    with pytest.raises(ValueError, match="forward_batch: 2 ids, 1 positions and 2 caches"):
        S.batch([1, 2], [0], 2)
    with pytest.raises(ValueError, match="forward_prompts: 1 prompts"):
        S.prompts([[1]], [0, 3], 1)
    with pytest.raises(ValueError, match="at least one token"):
        S.tokens([], 0)
    step = S.prompts([[5, 6, 7], [8]], [2, 9], 2)
    assert step.ids.tolist() == [5, 6, 7, 8] and step.positions.tolist() == [2, 3, 4, 9]
    assert step.keep.tolist() == [2, 3] and step.counts == (3, 1) and step.starts == (2, 9)


def test_kernels_backend_keeps_no_step_state(rng):
    """After steps of every kind (eager, run before capture, captured, replayed: the CPU
    target records a graph's launches) the kernels backend's attributes are the objects they
    were, but for the arena the last pass allocated from: nothing of a step stays behind."""
    model = llm.load(TINY_LLAMA, device="cpu", backend="kernels", n_ctx=64, progress=False)
    t, b, cfg = model.transformer, model.backend, model.config
    caches = b.kv_caches(3, cfg.n_layer, 64, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)

    def every_kind():
        ids = rng.integers(0, cfg.n_vocab, 12)
        t.forward_tokens(ids[:5], 0, caches[0])                 # a prompt bucket's graph
        t.forward_tokens(ids[5:6], 5, caches[0])                # the decode graph
        t.forward_tokens(ids[6:9], 6, caches[0], all_logits=True)   # eager
        t.forward_batch(ids[9:12], np.array([9, 0, 3]), caches)   # a batched graph
        t.forward_prompts([ids[:2], ids[2:5]], [0, 0], caches[1:])  # eager, several prompts

    every_kind()                 # first sight of each key: run eagerly (scratch made)
    before = dict(vars(b))
    for _ in range(2):           # captured, then replayed
        every_kind()
    after = vars(b)
    assert set(after) == set(before)
    changed = sorted(name for name in before if after[name] is not before[name])
    assert changed in ([], ["arena"]), changed
    assert b.arena in (b.prefill_arena, b.decode_arena, b.graph_prefill_arena, b.batch_arena)
