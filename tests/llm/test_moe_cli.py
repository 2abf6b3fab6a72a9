"""qwen3moe and gpt-oss through the user-facing commands on the numpy backend (CPU):
`pykernel run / chat / bench / perplexity` as subprocesses and the `serve` HTTP endpoints
in-process, each against the Python API on the same tiny file (golden/tiny). The kernels
backend's runs are in test_moe_kernels (they reuse its compiled models)."""
import json
import math
import re

import numpy as np
import pytest

import llm
from llm.perplexity import perplexity
from tests.llm.cli_helpers import pykernel
from tests.llm.gguf_helpers import TINY, require_for_module
from tests.llm.test_moe_models import greedy
from tests.llm.test_perplexity import nll_of
from tests.llm.test_server import call, serving

require_for_module(TINY / "tiny-moe-logits.json")
CASES = json.loads((TINY / "tiny-moe-logits.json").read_text())
ALL_FILES = sorted(CASES)
F32_FILES = sorted(name for name in CASES if "f32" in name)
N_CTX = 128
PPL_LINE = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+) \((\d+) tokens in "
                      r"(\d+) chunks of (\d+)\)")


@pytest.fixture(scope="module")
def models():
    """numpy-backend models by file name, loaded once for the module."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = llm.load(TINY / name, device="cpu", backend="numpy", n_ctx=N_CTX,
                                   progress=False)
        return cache[name]
    return get


def greedy_text(model, ids, n) -> str:
    """The text of up to n greedy tokens after ids, cut before the first end-of-generation
    token (where `run` stops)."""
    tokens = greedy(model, ids, n)
    ends = [i for i, t in enumerate(tokens) if model.tokenizer.is_eog(t)]
    return model.tokenizer.decode(tokens[:ends[0]] if ends else tokens)


def as_read(text: str) -> str:
    """text as a subprocess's stdout reads back in text mode (universal newlines: the byte
    tokens' \\r become \\n)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def cli_args(name, *args, ctx=N_CTX):
    return [*args, "--model", TINY / name, "--device", "cpu", "--backend", "numpy",
            "--ctx", ctx]


@pytest.mark.parametrize("name", ALL_FILES)
def test_run_prints_the_api_greedy_tokens(models, name):
    model, case = models(name), CASES[name][0]
    out = pykernel(*cli_args(name, "run", case["text"], "-n", 8, "--temp", 0))
    assert out.returncode == 0, out.stderr
    assert out.stdout == as_read(greedy_text(model, case["tokens"], 8)) + "\n"
    assert f"prompt: {len(case['tokens'])} tokens" in out.stderr
    if name in F32_FILES:   # the API's tokens are llama.cpp's (test_moe_models)
        assert greedy(model, case["tokens"], 8) == case["greedy"][:8]


@pytest.mark.parametrize("name, rendered", [
    ("tiny-gpt-oss-mxfp4.gguf", "<|start|>user<|message|>hello there<|end|><|start|>assistant"),
    ("tiny-qwen3moe-q4_k.gguf",
     "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"),
])
def test_chat_one_turn_from_stdin_uses_the_template(models, name, rendered):
    """gpt-oss's harmony (rendered in the template sandbox) and qwen3moe's ChatML: the reply
    is the API's greedy reply to the same message, after a prompt of the rendered length."""
    model = models(name)
    messages = [{"role": "user", "content": "hello there"}]
    assert model.chat_prompt(messages) == rendered
    ids = model.chat_ids(messages)
    out = pykernel(*cli_args(name, "chat", "-n", 6, "--temp", 0), stdin="hello there\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout == as_read(greedy_text(model, ids, 6)) + "\n"
    assert f"prompt: {len(ids)} tokens" in out.stderr and out.stderr.count("decode:") == 1


SERVED = [("tiny-qwen3moe-q8_0.gguf", "cpu"), ("tiny-gpt-oss-mxfp4.gguf", "cpu")]


def require_gpu():
    import pykernel as pk
    if not pk.gpu_available():
        pytest.skip("no usable CUDA GPU (driver or device missing)")


@pytest.fixture(scope="module", params=SERVED + [
    pytest.param((name, "cuda"), marks=pytest.mark.gpu) for name, _ in SERVED])
def served(request, models):
    """The file served on the numpy backend (cpu) or the kernels backend (cuda)."""
    name, device = request.param
    if device == "cuda":
        require_gpu()
        model = llm.load(TINY / name, device="cuda", n_ctx=N_CTX, progress=False)
    else:
        model = models(name)
    with serving(model, "tiny-moe") as url:
        yield model, url


def test_serve_completion_and_chat_and_survives_a_bad_request(served):
    model, url = served
    body = {"prompt": "hello world", "max_tokens": 6, "temperature": 0}
    ids = model.tokenizer.encode("hello world", add_special=True, parse_special=False)
    status, out = call(url, "/v1/completions", body)
    assert status == 200 and out["choices"][0]["text"] == greedy_text(model, ids, 6)
    assert out["usage"]["prompt_tokens"] == len(ids)
    status, bad = call(url, "/v1/chat/completions", {"messages": [{"role": "user"}]})
    assert status == 400 and "string 'content'" in bad["error"]["message"], bad
    messages = [{"role": "user", "content": "hi"}]
    status, out = call(url, "/v1/chat/completions",
                       {"messages": messages, "max_tokens": 6, "temperature": 0})
    assert status == 200
    assert out["choices"][0]["message"] == {
        "role": "assistant", "content": greedy_text(model, model.chat_ids(messages), 6)}


@pytest.mark.gpu
@pytest.mark.parametrize("name", F32_FILES)
def test_gpu_run_prints_llama_cpp_greedy_tokens(models, name):
    """The f32 KV cache, as the oracle's: the tokens are llama.cpp's (test_moe_models)."""
    require_gpu()
    case = CASES[name][0]
    out = pykernel("run", case["text"], "--model", TINY / name, "--device", "cuda", "--ctx",
                   N_CTX, "--cache-type", "f32", "-n", 8, "--temp", 0, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout == as_read(greedy_text(models(name), case["tokens"], 8)) + "\n"
    assert "kernels backend on cuda" in out.stderr


@pytest.mark.parametrize("name", ["tiny-qwen3moe-q4_k.gguf", "tiny-gpt-oss-mxfp4.gguf"])
def test_bench_prints_a_row_per_test(name):
    out = pykernel("bench", TINY / name, "-p", 8, "-n", 4, "-r", 1, "--device", "cpu",
                   "--backend", "numpy")
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[4] in ("pp8", "tg4"):
            rows[cells[4]] = cells
    assert set(rows) == {"pp8", "tg4"}, out.stdout
    for cells in rows.values():
        assert cells[0] == name.rsplit("-", 1)[0] and "numpy (cpu)" in cells[3]
        assert float(cells[5].split()[0]) > 0


def test_perplexity_cli_equals_the_api_and_llama_cpp(models, tmp_path):
    """The CLI's number is llm.perplexity's on the same text; on one 16-token chunk of a
    golden text, the perplexity llama.cpp's own logits give (its logits are within 1e-3
    relative L2 of ours, test_moe_models; measured 1e-6, so 1e-3 on the ppl is loose)."""
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    for name in F32_FILES:
        model = models(name)
        out = pykernel(*cli_args(name, "perplexity", "-f", text, ctx=32))
        assert out.returncode == 0, out.stderr
        found = PPL_LINE.search(out.stdout)
        assert found, out.stdout
        result = perplexity(model, text.read_text(), n_ctx=32)
        assert math.isfinite(result.ppl) and result.ppl > 1
        # printed to 4 decimals (5e-5); the other process's float32 logits (another context
        # size, BLAS threads) may differ by a few ulps of |x| ~ 10, and log ppl moves by at
        # most 2 max|dx|: ~1e-6 relative
        assert float(found.group(1)) == pytest.approx(result.ppl, rel=2e-6, abs=5e-5)
        assert int(found.group(3)) == result.tokens_scored and int(found.group(5)) == 32
        case = next(c for c in CASES[name] if len(c["tokens"]) >= 16)
        chunk = case["tokens"][:16]
        expected = math.exp(nll_of(np.asarray(case["logits"], np.float32)[:16], chunk,
                                   8).mean())
        assert perplexity(model, chunk, n_ctx=16).ppl == pytest.approx(expected, rel=1e-3)
