"""qwen3moe and gpt-oss against llama.cpp: the tiny MoE files' tokens, logits at every position
and 16-token greedy continuations (golden/tiny/tiny-moe-logits.json, llama.cpp's CPU backend
with an f32 KV cache), on the numpy backend.

The quantized files' oracle carries llama.cpp's CPU activation quantization (its matmuls round
their inputs to Q8_0 blocks of 32 against Q8_0 / MXFP4 weights, to Q8_K blocks of 256 against
Q4_K). Two bounds follow from that:
- emulated (NumpyBackend(quantized_activations=True) rounds the same inputs the same way): the
  arithmetic is llama.cpp's up to float32 summation order, which can move an activation across
  one rounding step; one such flip changes that input block by one step d = amax / 127, so the
  logits by about 1/127 < 1e-2 relative (measured: 2e-7, and 2e-3 in the one case with a flip).
- float32 activations (the default): a block of B values quantized with step d = amax / 127
  has rounding error of RMS d / sqrt(12) and amax <= sqrt(B) * RMS(block), so a relative error
  of at most sqrt(B) / (127 * sqrt(12)) per quantized matmul input (1.3e-2 for Q8_0, 3.6e-2 for
  Q8_K); independent inputs add in quadrature over the quantized inputs a token passes through
  (`float_activation_bound`). A router whose k-th and (k+1)-th scores are closer than the scores
  move between the two arithmetics can choose another expert, which changes that position's
  logits by O(1): such positions are checked to have exactly that cause, and excluded.
"""
import json
import math

import numpy as np
import pytest

import llm
from llm.backends.act_quant import activation_kind
from tests.llm.gguf_helpers import TINY, require_for_module

require_for_module(TINY / "tiny-moe-logits.json")
CASES = json.loads((TINY / "tiny-moe-logits.json").read_text())
F32_FILES = sorted(name for name in CASES if "f32" in name)
QUANT_FILES = sorted(name for name in CASES if "f32" not in name)
F32_TOL = 1e-3        # the brief's bound; measured 4e-7..1.3e-6
EMULATED_TOL = 1e-2   # one activation rounding flip: ~1/127 (module docstring)
BLOCK = {"q8_0": 32, "q8_k": 256}


def rel_l2(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def load(name, quantized_activations=False):
    return llm.load(TINY / name, n_ctx=64, progress=False,
                    quantized_activations=quantized_activations)


def greedy(model, prompt, n):
    """n greedy tokens after prompt, through prefill and single-token decode steps (no stop)."""
    session = model.session()
    session.reset()
    logits, _ = session.prefill(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = session.step(out[-1])
    return out


@pytest.mark.parametrize("name", F32_FILES)
def test_f32_files_match_llama_cpp(name):
    model = load(name)
    for case in CASES[name]:
        assert model.tokenizer.encode(case["text"]) == case["tokens"], case["text"]
        err = rel_l2(model.logits(case["tokens"]), np.asarray(case["logits"], np.float32))
        assert err < F32_TOL, f"{name} {case['text']!r}: relative L2 {err:.2e}"
        assert greedy(model, case["tokens"], 16) == case["greedy"], case["text"]


@pytest.mark.parametrize("name", QUANT_FILES)
def test_quantized_files_match_llama_cpp_with_emulated_activations(name):
    model = load(name, quantized_activations=True)
    for case in CASES[name]:
        err = rel_l2(model.logits(case["tokens"]), np.asarray(case["logits"], np.float32))
        assert err < EMULATED_TOL, f"{name} {case['text']!r}: relative L2 {err:.2e}"
        assert greedy(model, case["tokens"], 16) == case["greedy"], case["text"]


def float_activation_bound(model) -> float:
    """sqrt(sum over the quantized matmul inputs a token passes of (sqrt(B) / (127 sqrt(12)))^2)
    for this file's weight types (module docstring)."""
    g = model.gguf
    names = ["output.weight" if "output.weight" in g.tensors else "token_embd.weight"]
    for il in range(model.config.n_layer):
        names += [f"blk.{il}.{t}.weight" for t in ("attn_q", "attn_output", "ffn_gate_exps",
                                                   "ffn_down_exps")]
    total = 0.0
    for name in names:
        kind = activation_kind(g.tensors[name].ggml_type)
        if kind in BLOCK:
            total += (math.sqrt(BLOCK[kind]) / (127 * math.sqrt(12))) ** 2
    return math.sqrt(total)


class RouterLog:
    """Records every router call of a backend: (scores (n, n_expert), ids (n, k))."""

    def __init__(self, backend):
        self.calls, route = [], backend.moe_route

        def logged(scores, n_used, gating):
            ids, probs = route(scores, n_used, gating)
            self.calls.append((np.array(scores, np.float32), np.array(ids)))
            return ids, probs
        backend.moe_route = logged


def first_flip(emulated: RouterLog, floats: RouterLog, k: int, n: int) -> int:
    """The first position some layer routes to other experts in the two runs (n: none), after
    checking that there the emulated run's k-th and (k+1)-th scores are closer than twice the
    largest score change between the runs (a near tie the arithmetic can reorder)."""
    for pos in range(n):
        for (s_q, ids_q), (s_f, ids_f) in zip(emulated.calls, floats.calls):
            if set(ids_q[pos]) != set(ids_f[pos]):
                ranked = np.sort(s_q[pos])[::-1]
                margin, moved = ranked[k - 1] - ranked[k], np.abs(s_q[pos] - s_f[pos]).max()
                assert margin <= 2 * moved, f"position {pos}: experts differ at a margin " \
                    f"{margin:.2e} the scores' change {moved:.2e} does not explain"
                return pos
    return n


@pytest.mark.parametrize("name", QUANT_FILES)
def test_quantized_files_with_float_activations_within_the_derived_bound(name):
    """Float32 activations against llama.cpp's quantized ones: the positions before the first
    router flip (a flip at p changes p's key and value, so every later position) within the
    bound derived in the module docstring."""
    emulated, floats = load(name, quantized_activations=True), load(name)
    bound = float_activation_bound(floats)
    assert 0.02 < bound < 0.07, bound   # 8-9 Q8_0 inputs (+ two Q8_K): 3.6e-2 .. 6.2e-2
    k, checked, total = floats.config.moe.n_expert_used, 0, 0
    for case in CASES[name]:
        log_q, log_f = RouterLog(emulated.backend), RouterLog(floats.backend)
        ref = np.asarray(case["logits"], np.float32)
        ours = floats.logits(case["tokens"])
        emulated.logits(case["tokens"])
        kept = first_flip(log_q, log_f, k, len(ref))
        checked, total = checked + kept, total + len(ref)
        if kept:
            err = rel_l2(ours[:kept], ref[:kept])
            assert err < bound, f"{name} {case['text']!r}: relative L2 {err:.2e} > {bound:.1e}"
    assert checked >= total // 2, f"{name}: only {checked} of {total} positions before a flip"


@pytest.mark.parametrize("name", F32_FILES)
def test_batched_decode_and_prompts_equal_single_sequences(name):
    """forward_batch and forward_prompts (the server's paths) route, window and sink each
    sequence as its own forward pass does."""
    model = load(name)
    t, cfg, b = model.transformer, model.config, model.backend
    seqs = [CASES[name][1]["tokens"] + CASES[name][1]["greedy"], CASES[name][3]["tokens"]]
    singles = [model.logits(s) for s in seqs]

    def caches():
        return [b.kv_cache(cfg.n_layer, 64, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
                for _ in seqs]
    prefix = [len(s) - 1 for s in seqs]
    batch_caches = caches()
    firsts = b.to_host(t.forward_prompts([s[:n] for s, n in zip(seqs, prefix)], [0, 0],
                                         batch_caches))
    for row, single, n in zip(firsts, singles, prefix):
        assert rel_l2(row, single[n - 1]) < 1e-5
    last = b.to_host(t.forward_batch(np.array([s[-1] for s in seqs]), np.array(prefix),
                                     batch_caches))
    for row, single in zip(last, singles):
        assert rel_l2(row, single[-1]) < 1e-5


def write_variant(tmp_path, name, **keys):
    from gguf import GGUFValueType as V

    from tests.llm.gguf_helpers import rewrite
    arch = "gpt-oss" if "gpt-oss" in name else "qwen3moe"
    kinds = {str: V.STRING, int: V.UINT32, float: V.FLOAT32}
    drop = [f"{arch}.{k}" for k, v in keys.items() if v is None]
    set_keys = {f"{arch}.{k}": (v, kinds[type(v)]) for k, v in keys.items() if v is not None}
    return rewrite(TINY / name, tmp_path / name, set_keys=set_keys, drop_keys=drop)


@pytest.mark.parametrize("name, keys, key, message", [
    ("tiny-qwen3moe-f32.gguf", {"expert_used_count": 9}, "expert_used_count", "at most"),
    ("tiny-qwen3moe-f32.gguf", {"expert_count": 0}, "expert_count", "positive"),
    ("tiny-qwen3moe-f32.gguf", {"expert_feed_forward_length": None},
     "expert_feed_forward_length", "missing"),
    ("tiny-gpt-oss-f32.gguf", {"attention.sliding_window": None}, "sliding_window", "missing"),
    ("tiny-gpt-oss-f32.gguf", {"rope.scaling.type": "ntk"}, "rope.scaling.type", "not supported"),
    ("tiny-gpt-oss-f32.gguf", {"rope.scaling.yarn_beta_fast": float("nan")}, "yarn_beta_fast",
     "finite"),
    ("tiny-gpt-oss-f32.gguf", {"rope.scaling.original_context_length": 0},
     "original_context_length", "positive"),
])
def test_bad_moe_keys_are_errors_naming_the_key(tmp_path, name, keys, key, message):
    from llm.gguf_file import GGUFError
    path = write_variant(tmp_path, name, **keys)
    with pytest.raises(GGUFError, match=key) as info:
        llm.load(path, n_ctx=64, progress=False)
    assert message in str(info.value).lower()


def test_expert_tensor_of_the_wrong_shape_is_an_error_naming_it(tmp_path):
    from llm.gguf_file import GGUFError
    path = write_variant(tmp_path, "tiny-qwen3moe-f32.gguf", expert_feed_forward_length=16)
    with pytest.raises(GGUFError, match="ffn_gate_exps"):
        llm.load(path, n_ctx=64, progress=False)


@pytest.mark.parametrize("name", ["tiny-qwen3moe-f32.gguf", "tiny-gpt-oss-f32.gguf"])
def test_backend_without_moe_ops_is_a_clear_error(name):
    """A backend without the MoE features: loading says which backend to use."""
    from llm.backends import BackendUnavailable
    from llm.config import load_config
    from llm.gguf_file import GGUFFile
    from llm.model import check_backend_runs
    from llm.models.archs import ARCH_SPECS

    class DenseOnly:
        name, model_features = "kernels", frozenset()
    cfg = load_config(GGUFFile(TINY / name))
    with pytest.raises(BackendUnavailable, match=f"{cfg.arch} needs the numpy backend"):
        check_backend_runs(cfg, ARCH_SPECS[cfg.arch], DenseOnly())


def test_gpt_oss_chat_renders_harmony_through_the_sandbox():
    """The tiny file has no template: the harmony fallback renders in the sandboxed worker."""
    model = load("tiny-gpt-oss-f32.gguf")
    text = model.chat_prompt([{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "hello"}])
    assert text == ("<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
                    "<|start|>user<|message|>hello<|end|><|start|>assistant")
    assert model.chat_ids([{"role": "user", "content": "hello"}])


def test_gpt_4o_pre_tokenizer_splits_as_o200k():
    """gpt-oss's `gpt-4o` split: upper/lower case runs with their contraction, digits in
    threes, spaces before a digit left alone, '/' starting a symbol run."""
    import regex

    from llm.tokenizer.pretokenize import REGEXES
    (pattern,) = REGEXES["gpt-4o"]
    assert regex.findall(pattern, "Hello WORLD's  123456 a/b\n\n x") == [
        "Hello", " WORLD's", " ", " ", "123", "456", " a", "/b", "\n\n", " x"]
    assert regex.findall(pattern, "camelCase") == ["camel", "Case"]
