"""Regression tests for hostile GGUF files (issue 45): broken hyperparameters and weights, tensor
types the runner cannot use, header counts that would allocate without bound, overlapping tensor
data. Each must end in one GGUFError naming the file and the key or tensor (or, for NaN weights
that only show at run time, NonFiniteLogitsError), never a traceback from deep inside."""
import resource
import struct
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from gguf import GGMLQuantizationType

import llm
from llm.cli import error_line
from llm.gguf_file import GGUFError, GGUFFile
from llm.sampling import NonFiniteLogitsError
from tests.llm.cli_helpers import REPO, pykernel
from tests.llm.gguf_helpers import (GGUFValueType, TINY_LLAMA, patch, require_for_module,
                                    rewrite, tensor_info_offset)
from tests.child_env import child_env

require_for_module(TINY_LLAMA)

F32 = GGUFValueType.FLOAT32
U32 = GGUFValueType.UINT32
U64 = GGUFValueType.UINT64


def _load(path):
    return llm.load(path, n_ctx=64, progress=False)


def _load_error(path) -> str:
    with pytest.raises(GGUFError) as info:
        _load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


def _weights_with(tmp_path, name: str, value: float):
    """tiny-llama with every element of tensor `name` set to value."""
    shape = GGUFFile(TINY_LLAMA).tensors[name].shape
    return rewrite(TINY_LLAMA, tmp_path / "bad.gguf",
                   tensors={name: (np.full(shape, value, np.float32), None)})


# --- 1. non-finite or out-of-range hyperparameters: rejected at load, naming the key --------

@pytest.mark.parametrize("key,value", [
    ("llama.attention.layer_norm_rms_epsilon", float("nan")),
    ("llama.attention.layer_norm_rms_epsilon", -1e-5),
    ("llama.attention.layer_norm_rms_epsilon", 0.0),
    ("llama.attention.layer_norm_rms_epsilon", float("inf")),
    ("llama.rope.freq_base", 0.0),
    ("llama.rope.freq_base", float("nan")),
    ("llama.rope.freq_base", -10000.0),
    ("llama.rope.freq_base", float("inf")),
    ("llama.rope.scaling.factor", float("nan")),
    ("llama.rope.scaling.factor", -2.0),
])
def test_bad_float_hyperparameter_is_rejected_naming_the_key(tmp_path, key, value):
    path = rewrite(TINY_LLAMA, tmp_path / "bad.gguf", set_keys={key: (value, F32)})
    message = _load_error(path)
    assert repr(key) in message and "finite" in message


# --- 1. NaN/Inf weights: one clear error per generation, greedy and sampled ------------------

@pytest.mark.parametrize("options", [
    dict(temperature=0.0),                              # plain greedy: the backend's argmax
    dict(temperature=0.0, repeat_penalty=1.3),          # greedy through Sampler.sample
    dict(temperature=0.8, seed=1),                      # top-k: candidate list, _draw_one
    dict(temperature=0.8, top_k=0, seed=1),             # whole row: filter_rows
], ids=["greedy", "greedy-penalised", "top-k", "whole-row"])
@pytest.mark.parametrize("name,value", [("blk.0.attn_norm.weight", np.nan),
                                        ("token_embd.weight", np.inf)], ids=["nan", "inf"])
def test_non_finite_weights_raise_non_finite_logits(tmp_path, name, value, options):
    model = _load(_weights_with(tmp_path, name, value))
    with pytest.raises(NonFiniteLogitsError, match="NaN|Inf"):
        "".join(model.generate("hello", max_tokens=4, **options))


def test_cli_prints_non_finite_logits_as_one_line(tmp_path):
    path = _weights_with(tmp_path, "blk.0.attn_norm.weight", np.nan)
    out = pykernel("run", "hello", "--model", path, "-n", "4", "--temp", "0", "--ctx", "64")
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("pykernel: error: ")]
    assert len(lines) == 1 and "NaN" in lines[0], out.stderr


@pytest.mark.parametrize("sampling", [
    None,                                                    # greedy_tokens: argmax_next
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # sampled: the filters' launches
    dict(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0),     # sampled: temperature alone
], ids=["greedy", "sampled-filters", "sampled-temperature"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_device_picked_tokens_raise_non_finite_logits(tmp_path, sampling, device):
    """The graphed kernels backend's one-stream loops (the decode graph picks each token on
    the device and feeds it to the next step): every embedding row but token 1's is NaN, so
    the step after token 1 picks a finite token and the step after that one has NaN logits.
    That step flags its pick (-1 in the io the host reads each token) and the loop raises
    NonFiniteLogitsError at that token instead of going on with token 0; on cuda it is read
    while the step behind it, which embeds the flag, runs (pipelined). Embedding the flag
    reads in bounds (the CPU target checks every access and raises on one out of range)."""
    import pykernel as pk
    from llm.sampling import SamplingParams
    if device == "cuda" and not pk.gpu_available():
        pytest.skip("no usable CUDA GPU")
    table = GGUFFile(TINY_LLAMA).tensors["token_embd.weight"]
    rows = np.full(table.shape, np.nan, np.float32)
    rows[1] = table.data.view(np.float32).reshape(table.shape)[1]
    path = rewrite(TINY_LLAMA, tmp_path / "nan.gguf", tensors={"token_embd.weight": (rows, None)})
    model = llm.load(path, device=device, backend="kernels", n_ctx=64, progress=False)
    cfg, t = model.config, model.transformer
    cache = model.backend.kv_cache(cfg.n_layer, 32, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v)
    params = None if sampling is None else SamplingParams(**sampling)
    if params is None:
        tokens = t.greedy_tokens(1, 0, cache, 8)
    else:
        tokens = t.sampled_tokens(1, 0, cache, 8, params, np.random.default_rng(0).random(8))
    got = []
    with pytest.raises(NonFiniteLogitsError, match="no finite value: its weights"):
        for token in tokens:
            got.append(token)
    assert got and got[:-1] == [1] * (len(got) - 1) and got[-1] != 1, got
    assert 0 <= got[-1] < cfg.n_vocab, got
    logits = t.decode_step(-1, len(got) + 1, cache, params)   # the flag as a step's token
    assert np.isnan(logits.numpy()).all()
    assert int(cache.graph.io.numpy()[0]) == -1


def test_cli_error_line_is_never_empty():
    assert error_line(MemoryError()) == "MemoryError (MemoryError())"
    assert error_line(ValueError("  ")).startswith("ValueError")
    assert error_line(GGUFError("f.gguf", "key 'x'", "bad")) == "f.gguf: key 'x': bad"


# --- 2. tensor types the format allows but no backend can use --------------------------------

@pytest.mark.parametrize("ggml_type,dtype", [
    (GGMLQuantizationType.F64, np.float64), (GGMLQuantizationType.I8, np.int8),
    (GGMLQuantizationType.I16, np.int16), (GGMLQuantizationType.I32, np.int32),
    (GGMLQuantizationType.I64, np.int64)], ids=lambda v: getattr(v, "name", ""))
def test_unusable_tensor_type_is_rejected_before_any_work(tmp_path, monkeypatch, ggml_type,
                                                          dtype):
    import llm.backends.numpy_backend as numpy_backend
    calls = []
    real = numpy_backend.dequantize
    monkeypatch.setattr(numpy_backend, "dequantize", lambda *a, **k: calls.append(1) or real(
        *a, **k))
    name = "blk.1.ffn_down.weight"   # the last layer's: every other tensor comes first
    shape = GGUFFile(TINY_LLAMA).tensors[name].shape
    path = rewrite(TINY_LLAMA, tmp_path / "typed.gguf",
                   tensors={name: (np.zeros(shape, dtype), ggml_type)})
    message = _load_error(path)
    assert f"tensor {name!r}" in message and f"type {ggml_type.name}" in message
    assert calls == [], "tensors were dequantized before the unusable one was found"


# --- 3. header counts are checked against the tensors before anything is allocated ----------

def _as_gemma3(tmp_path, **overrides):
    """tiny-llama's hyperparameters under gemma3's keys (its tensors lack gemma3's norms, but
    every check here fails before the tensors are looked up)."""
    g = GGUFFile(TINY_LLAMA)
    keys = {"general.architecture": ("gemma3", GGUFValueType.STRING),
            "gemma3.attention.sliding_window": (32, U32)}
    for key, value in g.metadata.items():
        if key.startswith("llama."):
            keys["gemma3." + key[len("llama."):]] = (value, g.value_types[key][0])
    keys.update(overrides)
    drop = [k for k in g.metadata if k.startswith("llama.")]
    return rewrite(TINY_LLAMA, tmp_path / "gemma3.gguf", set_keys=keys, drop_keys=drop)


LOAD_SCRIPT = """
import sys, tracemalloc, llm
tracemalloc.start()
try:
    llm.load(sys.argv[1], n_ctx=64, progress=False)
except llm.GGUFError as exc:
    print(f"GGUFError|{tracemalloc.get_traced_memory()[1]}|{exc}")
"""


def _load_capped(path) -> tuple[str, int, str]:
    """(exception type, peak traced bytes, message) of llm.load in a process whose address
    space is capped at 2 GiB and time at 60 s: a regression fails the test instead of
    exhausting the machine (block_count 2^40 once built a 2^40-entry tuple)."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(path)], capture_output=True,
                         text=True, timeout=60, preexec_fn=cap, cwd=REPO,
                         env=child_env(OPENBLAS_NUM_THREADS="1"))
    assert out.stdout.startswith("GGUFError|"), out.stdout + out.stderr[-2000:]
    kind, peak, message = out.stdout.strip().split("|", 2)
    return kind, int(peak), message


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_huge_block_count_fails_fast_without_allocating(tmp_path, arch):
    key = f"{arch}.block_count"
    path = (_as_gemma3(tmp_path, **{key: (2**40, U64)}) if arch == "gemma3" else
            rewrite(TINY_LLAMA, tmp_path / "big.gguf", set_keys={key: (2**40, U64)}))
    _, peak, message = _load_capped(path)
    assert message.startswith(f"{path}: ") and repr(key) in message
    assert "no tensors for block 2" in message
    assert peak < 64 << 20, f"loading allocated {peak >> 20} MiB"


@pytest.mark.parametrize("key,value,named", [
    ("llama.embedding_length", 2**40, "'llama.embedding_length'"),
    ("llama.vocab_size", 2**40, "'token_embd.weight'"),
    ("llama.attention.head_count", 2**32 - 1, "'llama.attention.head_count_kv'"),
    ("llama.attention.key_length", 2**31, "'blk.0.attn_q.weight'"),
    ("llama.feed_forward_length", 2**40, "'blk.0.ffn_gate.weight'"),
])
def test_count_contradicted_by_the_tensors_is_rejected(tmp_path, key, value, named):
    path = rewrite(TINY_LLAMA, tmp_path / "count.gguf", set_keys={key: (value, U64)})
    assert named in _load_error(path)


def test_huge_context_length_is_capped_by_memory_not_allocated(tmp_path):
    """context_length is not checked against a tensor (rope models have none): the default
    context is capped to the KV budget and the numpy cache grows with use."""
    path = rewrite(TINY_LLAMA, tmp_path / "ctx.gguf",
                   set_keys={"llama.context_length": (2**40, U64)})
    tracemalloc.start()
    try:
        model = llm.load(path, progress=False)
        text = "".join(model.generate("hello", max_tokens=4, temperature=0))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text and model.n_ctx < 2**40 and "capped" in model.context_note
    assert peak < 64 << 20, f"loading allocated {peak >> 20} MiB"


def test_more_tokens_than_embedding_rows_is_rejected(tmp_path):
    """A tokenizer that can emit ids past the embedding table (an IndexError at run time)."""
    table = np.zeros((100, 64), np.float32)
    path = rewrite(TINY_LLAMA, tmp_path / "vocab.gguf",
                   set_keys={"llama.vocab_size": (100, U32)},
                   tensors={"token_embd.weight": (table, None), "output.weight": (table, None)})
    message = _load_error(path)
    assert "'tokenizer.ggml.tokens'" in message and "263 tokens" in message


# --- 4. overlapping tensor data ----------------------------------------------------------------

def _offset_field(path, name: str) -> int:
    """Byte offset of tensor `name`'s data-offset field in its header entry."""
    pos = tensor_info_offset(path, name)
    n_dims = struct.unpack_from("<I", path.read_bytes(), pos)[0]
    return pos + 4 + 8 * n_dims + 4


def test_overlapping_tensor_data_is_rejected_naming_both(tmp_path):
    path = rewrite(TINY_LLAMA, tmp_path / "overlap.gguf")
    g = GGUFFile(path)
    first, second = "blk.0.attn_q.weight", "blk.0.attn_k.weight"
    relative = struct.unpack_from("<Q", path.read_bytes(), _offset_field(path, first))[0]
    del g
    patch(path, _offset_field(path, second), "<Q", relative + 32)  # inside the first's bytes
    with pytest.raises(GGUFError) as info:
        GGUFFile(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "overlaps" in message
    assert repr(first) in message and repr(second) in message
