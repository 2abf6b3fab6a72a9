"""qwen3moe and gpt-oss on the kernels backend (CPU target) against llama.cpp's oracles
(golden/tiny/tiny-moe-logits.json): the stdlib MoE kernels (router, expert GEMVs, grouped
prompt path), attention sinks, YaRN RoPE and the sliding window, eager and graph-replayed.

Bounds for the quantized files. The kernels quantize a quantized matrix's input to Q8_1:
blocks of 32 with d = amax / 127, rounded as llama.cpp's Q8_0 (Q8_1 adds only the block sum),
so against Q8_0 / MXFP4 weights they hold llama.cpp's activations and the emulated bound of
test_moe_models applies (EMULATED_TOL: one rounding flip from summation order, ~1/127).
Against Q4_K llama.cpp rounds to Q8_K (blocks of 256) and the kernels to Q8_1: two
independent roundings of relative RMS sqrt(B) / (127 sqrt(12)) each (test_moe_models'
docstring), added in quadrature over each such input a token passes through
(`kernels_activation_bound`). The files are fixed, so a near-tied router choice the two
arithmetics could order differently would show as a failure here, not as noise: none occurs
(measured: 2e-7 on q8_0, 8e-7 on mxfp4, 2.2e-2 on q4_k against a bound of 5.6e-2).
"""
import json
import math

import numpy as np
import pytest

import llm
import pykernel as pk
from llm.backends.act_quant import activation_kind
from llm.backends.kernels_backend import KernelsBackend
from llm.backends.numpy_backend import NumpyBackend
from llm.config import RopeParams, YarnParams
from llm.gguf_file import GGUFFile
from llm.model import load_tokenizer
from llm.perplexity import perplexity
from tests.llm.cli_helpers import pykernel
from tests.llm.gguf_helpers import TINY, require_for_module
from tests.llm.test_moe_cli import as_read
from tests.llm.test_moe_models import greedy, rel_l2

require_for_module(TINY / "tiny-moe-logits.json")
CASES = json.loads((TINY / "tiny-moe-logits.json").read_text())
F32_FILES = sorted(name for name in CASES if "f32" in name)
QUANT_FILES = sorted(name for name in CASES if "f32" not in name)
F32_TOL = 1e-3        # the bound; measured 6e-7..1.5e-6
EMULATED_TOL = 1e-2   # as test_moe_models: one activation rounding flip, ~1/127
GRAPH_TOL = 1e-5      # the same kernels up to summation order (decode vs grouped experts)


def block_error(block: int) -> float:
    """Relative RMS error of quantizing a block of `block` values to int8 (amax / 127 steps)."""
    return math.sqrt(block) / (127 * math.sqrt(12))


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = llm.load(TINY / name, device="cpu", backend="kernels", n_ctx=64,
                                   progress=False)
        return cache[name]
    return get


@pytest.mark.parametrize("name", F32_FILES)
def test_f32_files_match_llama_cpp(models, name):
    model = models(name)
    for case in CASES[name]:
        err = rel_l2(model.logits(case["tokens"]), np.asarray(case["logits"], np.float32))
        assert err < F32_TOL, f"{name} {case['text']!r}: relative L2 {err:.2e}"
        assert greedy(model, case["tokens"], 16) == case["greedy"], case["text"]


def kernels_activation_bound(model) -> float:
    """sqrt(EMULATED_TOL^2 + sum over the inputs llama.cpp rounds to Q8_K of the two
    roundings' errors squared) for this file's weight types (module docstring)."""
    g = model.gguf
    names = ["output.weight" if "output.weight" in g.tensors else "token_embd.weight"]
    for il in range(model.config.n_layer):
        names += [f"blk.{il}.{t}.weight" for t in ("attn_q", "attn_output", "ffn_gate_exps",
                                                   "ffn_down_exps")]
    total = EMULATED_TOL ** 2
    for name in names:
        if activation_kind(g.tensors[name].ggml_type) == "q8_k":
            total += block_error(256) ** 2 + block_error(32) ** 2
    return math.sqrt(total)


@pytest.mark.parametrize("name", QUANT_FILES)
def test_quantized_files_within_the_q8_1_bound(models, name):
    model = models(name)
    bound = kernels_activation_bound(model)
    assert bound < 0.07, bound      # at most two Q4_K inputs per token in these files
    for case in CASES[name]:
        err = rel_l2(model.logits(case["tokens"]), np.asarray(case["logits"], np.float32))
        assert err < bound, f"{name} {case['text']!r}: relative L2 {err:.2e} > {bound:.1e}"
        assert greedy(model, case["tokens"], 16) == case["greedy"], case["text"]


@pytest.mark.parametrize("name", ["tiny-gpt-oss-f32.gguf", "tiny-qwen3moe-q8_0.gguf"])
def test_graph_decode_equals_prefill(models, name):
    """Token by token through the captured decode step (router on the device, experts' decode
    path, sinks) gives the eager prefill's logits (grouped experts over all tokens)."""
    model = models(name)
    ids = CASES[name][1]["tokens"]
    full = model.logits(ids)
    session = model.session()
    session.reset()
    steps = [session.prefill(ids[:2])[0]] + [session.step(t) for t in ids[2:]]
    assert session.cache.graph is not None, "decode did not use a captured graph"
    err = rel_l2(np.stack(steps), full[1:])
    assert err < GRAPH_TOL, f"{name}: graph decode vs prefill {err:.2e}"


@pytest.mark.parametrize("name", F32_FILES)
def test_batched_decode_and_prompts_equal_single_sequences(models, name):
    """forward_prompts and forward_batch (the server's paths) route, window and sink each
    sequence as its own forward pass does."""
    model = models(name)
    t, cfg, b = model.transformer, model.config, model.backend
    seqs = [CASES[name][1]["tokens"] + CASES[name][1]["greedy"], CASES[name][3]["tokens"]]
    singles = [model.logits(s) for s in seqs]
    caches = b.kv_caches(len(seqs), cfg.n_layer, 64, cfg.n_head_kv, cfg.head_dim,
                         cfg.head_dim_v)
    prefix = [len(s) - 1 for s in seqs]
    firsts = b.to_host(t.forward_prompts([s[:n] for s, n in zip(seqs, prefix)], [0, 0],
                                         caches))
    for row, single, n in zip(firsts, singles, prefix):
        assert rel_l2(row, single[n - 1]) < GRAPH_TOL
    last = b.to_host(t.forward_batch(np.array([s[-1] for s in seqs]), np.array(prefix),
                                     caches))
    for row, single in zip(last, singles):
        assert rel_l2(row, single[-1]) < GRAPH_TOL


@pytest.mark.parametrize("name", F32_FILES)
def test_cli_run_prints_llama_cpp_greedy_tokens_on_the_kernels_backend(name):
    """`pykernel run --backend kernels` prints llama.cpp's greedy continuation (up to an
    end-of-generation token), as the numpy backend's run does."""
    case = CASES[name][0]
    tokenizer = load_tokenizer(GGUFFile(TINY / name))
    tokens = case["greedy"][:8]
    ends = [i for i, t in enumerate(tokens) if tokenizer.is_eog(t)]
    expected = as_read(tokenizer.decode(tokens[:ends[0]] if ends else tokens)) + "\n"
    out = pykernel("run", case["text"], "--model", TINY / name, "--device", "cpu",
                   "--backend", "kernels", "--ctx", 64, "-n", "8", "--temp", "0", timeout=600)
    assert out.returncode == 0, out.stderr
    numpy_run = pykernel("run", case["text"], "--model", TINY / name, "--device", "cpu",
                         "--backend", "numpy", "--ctx", 64, "-n", "8", "--temp", "0")
    assert numpy_run.returncode == 0, numpy_run.stderr
    assert out.stdout == numpy_run.stdout == expected and out.stdout.strip()
    assert "tok/s" in out.stderr


@pytest.mark.parametrize("name", F32_FILES)
def test_perplexity_equals_the_numpy_backend(models, name):
    """llm.perplexity on a golden text's 16-token chunk from the two backends' logits X', X
    of that chunk: within 2 F32_TOL relative L2 of each other (each is within F32_TOL of
    llama.cpp's, test_f32_files_match_llama_cpp); a position's -log softmax moves by at most
    2 max|dx| <= 2 ||X' - X||_F, so the mean, log ppl, by no more either."""
    case = next(c for c in CASES[name] if len(c["tokens"]) >= 16)
    chunk = case["tokens"][:16]
    kernels = models(name)
    reference = llm.load(TINY / name, device="cpu", backend="numpy", n_ctx=64, progress=False)
    x_kernels, x_numpy = kernels.logits(chunk), reference.logits(chunk)
    moved = float(np.linalg.norm(x_kernels - x_numpy))
    assert moved <= 2 * F32_TOL * float(np.linalg.norm(x_numpy))
    ours, want = perplexity(kernels, chunk, n_ctx=16), perplexity(reference, chunk, n_ctx=16)
    assert math.isfinite(ours.ppl) and ours.tokens_scored == want.tokens_scored == 7
    assert abs(math.log(ours.ppl / want.ppl)) <= 2 * moved, (ours.ppl, want.ppl, moved)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("yarn", [None, YarnParams(n_ctx_orig=64, attn_factor=1.1)])
def test_scaled_rope_equals_numpy_backend(rng, seed, neox, yarn):
    """Linear and YaRN RoPE scaling on the kernels backend (a freq_factors table and
    RopeSpec.mscale) against the numpy backend's float64 angles, with the file's rope_freqs,
    on a partial rotation (n_rot 12 of 16), at positions up to 3000."""
    params = RopeParams(n_rot=12, base=10000.0, neox=neox, freq_scale=0.25, yarn=yarn)
    x = rng.standard_normal((6, 3 * 16)).astype(np.float32)
    positions = np.array([0, 1, 7, 100, 1234, 3000])
    freqs = rng.uniform(1.0, 4.0, 6).astype(np.float32)
    want = NumpyBackend().rope(x.copy(), positions, 16, params, freqs)
    kb = KernelsBackend(device="cpu")
    got = kb.to_host(kb.rope(pk.to_device(x), positions, 16, params, pk.to_device(freqs)))
    # f32 angles: absolute error ~ position * 2^-24 per radian (rotary.py), times mscale
    tol = 4e-7 * (positions.max() + 8) * 1.5 + 1e-5
    assert np.max(np.abs(got - want)) < tol, f"seed={seed}"
    np.testing.assert_array_equal(got.reshape(6, 3, 16)[..., 12:], x.reshape(6, 3, 16)[..., 12:])
