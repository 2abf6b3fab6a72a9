"""The generation loop: max tokens, end-of-generation ids, stop strings (held back, never leaked),
context limits, prefix reuse, seeds, UTF-8 streaming. A scripted transformer makes the token
sequence exact; the real tiny model checks the same paths end to end."""
import numpy as np
import pytest

import llm
from llm.models.transformer import StepRunner
from llm.backends.numpy_backend import NumpyBackend
from llm.generate import ContextError, GenerationStats, Session, stream
from llm.sampling import Sampler, SamplingParams
from tests.llm.gguf_helpers import TINY_LLAMA, require_for_module

require_for_module(TINY_LLAMA)


class ScriptedTransformer(StepRunner):
    """Predicts script[k] after the k-th position past the prompt (one-hot logits), then `end`.
    (A StepRunner for the capabilities it declares; no layers run.)"""

    def __init__(self, cfg, script, prompt_len, end=262):
        self.cfg, self.script, self.prompt_len, self.end = cfg, script, prompt_len, end
        self.forwarded = 0

    def forward(self, step, caches):
        self.forwarded += step.n
        k = step.starts[0] + step.n - self.prompt_len
        logits = np.zeros((1, self.cfg.n_vocab), dtype=np.float32)
        logits[0, self.script[k] if k < len(self.script) else self.end] = 10.0
        return logits


@pytest.fixture(scope="module")
def tiny():
    return llm.load(TINY_LLAMA, n_ctx=64)


def run_script(tiny, script, prompt, n_ctx=64, **kw):
    fake = ScriptedTransformer(tiny.config, script, len(prompt))
    session = Session(fake, NumpyBackend(), n_ctx)
    stats = GenerationStats()
    greedy = Sampler(SamplingParams(temperature=0))
    pieces = list(stream(session, tiny.tokenizer, prompt, greedy, stats=stats, **kw))
    return pieces, stats, fake


def text_ids(tiny, text):
    return tiny.tokenizer.encode(text, add_special=False)


def test_max_tokens(tiny):
    script = text_ids(tiny, "hello world hello world")
    pieces, stats, _ = run_script(tiny, script, [261, 104], max_tokens=5)
    assert stats.generated_tokens == 5 and stats.stop_reason == "max_tokens"
    assert "".join(pieces) == tiny.tokenizer.decode(script[:5])


def test_stops_at_end_of_generation_token(tiny):
    script = text_ids(tiny, "hello") + [tiny.tokenizer.eos_id] + text_ids(tiny, " world")
    pieces, stats, _ = run_script(tiny, script, [261], max_tokens=50)
    assert "".join(pieces) == "hello" and stats.stop_reason == "eog"


def test_stop_string_across_tokens_is_never_leaked(tiny):
    script = text_ids(tiny, "hello world, more text")
    pieces, stats, _ = run_script(tiny, script, [261], max_tokens=50, stop=["o w", "zzz"])
    assert "".join(pieces) == "hell" and stats.stop_reason == "stop_string"
    assert all("o" not in p for p in pieces[1:]), pieces  # 'o' was held until decided
    pieces, stats, _ = run_script(tiny, script, [261], max_tokens=50, stop=["o x"])
    assert "".join(pieces) == "hello world, more text"  # held-back prefix released at the end


def test_next_step_runs_before_the_text_goes_out(tiny):
    """stream queues the next decode step before it yields a token's text (so a GPU computes
    it while the consumer prints or sends that text), and none after the last token."""
    script = text_ids(tiny, " one two three")
    prompt = text_ids(tiny, "count:")
    fake = ScriptedTransformer(tiny.config, script, len(prompt))
    session = Session(fake, NumpyBackend(), 64)
    greedy = Sampler(SamplingParams(temperature=0))
    seen = []
    for piece in stream(session, tiny.tokenizer, prompt, greedy, max_tokens=len(script)):
        seen.append((piece, fake.forwarded))
    generated = [n - len(prompt) for _, n in seen]
    assert "".join(p for p, _ in seen) == " one two three"
    # the k-th token's text comes out once the k-th token has been run (k < the last), and
    # the last token, which ends the generation (max_tokens), is never run
    assert generated[0] >= 1 and fake.forwarded == len(prompt) + len(script) - 1


def test_prompt_longer_than_context(tiny):
    with pytest.raises(ContextError, match="prompt has 10 tokens but the context holds 8"):
        run_script(tiny, [104], [104] * 10, n_ctx=8, max_tokens=4)
    with pytest.raises(ContextError, match="context"):
        list(tiny.generate([104] * 80, max_tokens=2))


def test_generation_stops_when_context_is_full(tiny):
    script = text_ids(tiny, "hello world hello world")
    pieces, stats, _ = run_script(tiny, script, [261, 104], n_ctx=6, max_tokens=50)
    assert stats.stop_reason == "context" and stats.generated_tokens == 5


def test_prefix_reuse_runs_only_new_tokens(tiny):
    fake = ScriptedTransformer(tiny.config, [104] * 10, 4)
    session = Session(fake, NumpyBackend(), 32)
    assert session.prefill([261, 104, 105, 106])[1] == 4
    assert session.prefill([261, 104, 105, 106, 107, 108])[1] == 2
    assert session.prefill([261, 104, 99])[1] == 1     # diverges: recomputes from there
    assert session.tokens == [261, 104, 99]
    assert fake.forwarded == 7


def test_utf8_is_whole_in_every_piece(tiny):
    script = text_ids(tiny, "é€😀 ok")
    pieces, _, _ = run_script(tiny, script, [261], max_tokens=50)
    assert "".join(pieces) == "é€😀 ok" and all("\ufffd" not in p for p in pieces)


def test_seed_reproducible_on_real_model(tiny):
    opts = dict(max_tokens=24, temperature=1.2, top_k=0, top_p=1.0, min_p=0.0)
    a = "".join(tiny.generate("hello", seed=3, **opts))
    b = "".join(tiny.generate("hello", seed=3, **opts))
    c = "".join(tiny.generate("hello", seed=4, **opts))
    assert a == b and a != c


def test_generate_stats_and_greedy_matches_logits(tiny):
    stats = GenerationStats()
    ids = tiny.tokenizer.encode("or he will")
    out = "".join(tiny.generate(ids, max_tokens=6, temperature=0, stats=stats))
    expected = []
    for _ in range(stats.generated_tokens):
        expected.append(int(np.argmax(tiny.logits(ids + expected)[-1])))
    assert tiny.tokenizer.decode(expected) == out
    assert stats.prompt_tokens >= 1 and stats.prompt_seconds > 0


def test_logits_rejects_bad_ids(tiny):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny.logits([1, 5000])
    with pytest.raises(ValueError, match="at least one"):
        tiny.logits([])


def test_context_defaults_to_training_context_capped_by_memory(tiny, monkeypatch):
    from llm import model as model_module
    cfg = tiny.config
    assert model_module.choose_context(cfg, None)[0] == cfg.n_ctx_train  # 256: fits easily
    huge = type(cfg)(**{**vars(cfg), "n_ctx_train": 1 << 24})
    monkeypatch.setattr(model_module, "_available_memory", lambda: 64 << 20)
    n_ctx, note = model_module.choose_context(huge, None)
    assert n_ctx * cfg.kv_bytes_per_token <= (64 << 20) // 4 and n_ctx % 256 == 0
    assert "capped" in note and str(n_ctx) in note
    n_requested, note_requested = model_module.choose_context(huge, 1000)
    assert n_requested == 1000 and "requested" in note_requested
    with pytest.raises(ValueError, match="positive"):
        model_module.choose_context(cfg, 0)
    assert tiny.session().cache.nbytes == 64 * cfg.kv_bytes_per_token
    # a GPU backend's device budget caps the default too, at the cache's actual bytes (f16: 2)
    monkeypatch.setattr(model_module, "_available_memory", lambda: 1 << 40)
    budget = 300 * cfg.kv_bytes_per_token // 2
    n_dev, note_dev = model_module.choose_context(huge, None, 2, budget)
    assert n_dev == 256 and "device memory" in note_dev, note_dev
    n_host, _ = model_module.choose_context(huge, None, 2, 1 << 40)    # host cap binds
    assert n_host == (4 << 30) // cfg.kv_bytes_per_token // 256 * 256


def test_learned_positions_bound_the_context():
    gpt2 = llm.load(TINY_LLAMA.parent / "tiny-gpt2-f32.gguf", n_ctx=256)
    with pytest.raises(ContextError, match="256 learned positions"):
        gpt2.logits([100] * 257)
    with pytest.raises(ContextError, match="learned positions"):
        llm.load(TINY_LLAMA.parent / "tiny-gpt2-f32.gguf", n_ctx=300)


def test_backend_choice_errors():
    with pytest.raises(llm.BackendUnavailable, match="CPU only"):
        llm.load(TINY_LLAMA, device="cuda", backend="numpy")
    with pytest.raises(ValueError, match="unknown backend"):
        llm.load(TINY_LLAMA, backend="torch")
    with pytest.raises(ValueError, match="unknown device"):
        llm.load(TINY_LLAMA, device="tpu")
    assert isinstance(llm.BackendUnavailable("x"), NotImplementedError)


def test_prompt_time_waits_for_the_device(tiny, monkeypatch):
    """The prompt's seconds end when its device work does (a GPU runs the prefill
    asynchronously: timing the launches alone overstated prompt tok/s)."""
    import time
    monkeypatch.setattr(tiny.backend, "synchronize", lambda: time.sleep(0.3))
    list(tiny.generate("Hello there", max_tokens=1, temperature=0))
    assert tiny.last_stats.prompt_seconds >= 0.3


def test_weights_too_big_for_host_memory_are_refused_before_loading(monkeypatch, capsys):
    """The numpy backend's float32 copy of the weights is checked against the free memory
    before anything is dequantized (not an out-of-memory kill minutes later)."""
    from llm import host_memory
    from llm import model as model_module
    from pykernel.cli import main
    gguf = llm.GGUFFile(TINY_LLAMA)
    need = NumpyBackend().host_weight_bytes(gguf.tensors.values())
    assert need == 4 * sum(t.n_elements for t in gguf.tensors.values()) > 0
    dequantized = []
    monkeypatch.setattr(NumpyBackend, "matrix", lambda self, parts: dequantized.append(parts))
    small = need + host_memory.HEADROOM_BYTES - 1
    monkeypatch.setattr(model_module, "_available_memory", lambda: small)
    with pytest.raises(llm.HostMemoryError) as info:
        llm.load(TINY_LLAMA)
    message = str(info.value)
    assert str(TINY_LLAMA) in message and "numpy" in message and "PYKERNEL_HOST_MEMORY_CHECK=0" \
        in message and f"{need / 2**30:.2f} GiB" in message and f"{small / 2**30:.2f}" in message
    assert isinstance(info.value, MemoryError) and not dequantized
    # the command line prints it as one line, exit status 1
    assert main(["run", "x", "--model", str(TINY_LLAMA), "-n", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pykernel: error: ") and "Traceback" not in err and "GiB" in err
    # the switch for machines whose swap should take the rest; exactly enough memory passes
    monkeypatch.undo()
    monkeypatch.setattr(model_module, "_available_memory", lambda: small)
    monkeypatch.setenv("PYKERNEL_HOST_MEMORY_CHECK", "0")
    assert llm.load(TINY_LLAMA).logits([1, 2]).shape[0] == 2
    monkeypatch.delenv("PYKERNEL_HOST_MEMORY_CHECK")
    monkeypatch.setattr(model_module, "_available_memory", lambda: small + 1)
    llm.load(TINY_LLAMA)
