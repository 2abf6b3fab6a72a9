"""`pykernel run/chat/tokenize/info` through the real entry point (subprocesses)."""
import subprocess
import sys

import pytest

from tests.llm.cli_helpers import REPO, pykernel
from tests.llm.gguf_helpers import TINY, TINY_LLAMA, require_for_module
from tests.child_env import child_env

require_for_module(TINY_LLAMA)


def test_run_streams_continuation_and_stats():
    out = pykernel("run", "hello world", "--model", TINY_LLAMA, "-n", "12", "--temp", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and "hello world" not in out.stdout  # continuation only
    assert "tok/s" in out.stderr and "prompt:" in out.stderr and "decode:" in out.stderr
    assert "context 256 tokens" in out.stderr
    again = pykernel("run", "hello world", "--model", TINY_LLAMA, "-n", "12", "--temp", "0")
    assert again.stdout == out.stdout


def test_run_seeded_sampling_and_prompt_from_stdin():
    args = ["run", "--model", TINY_LLAMA, "-n", "10", "--temp", "1.0", "--seed", "7"]
    a, b = pykernel(*args, stdin="or he"), pykernel(*args, stdin="or he")
    assert a.returncode == 0 and a.stdout == b.stdout


def test_run_errors_are_one_line():
    out = pykernel("run", "x", "--model", "/nonexistent/model.gguf")
    assert out.returncode == 1 and out.stderr.startswith("pykernel: error: ")
    assert "Traceback" not in out.stderr
    long_prompt = "hello " * 300
    out = pykernel("run", long_prompt, "--model", TINY_LLAMA, "--ctx", "32")
    assert out.returncode == 1 and "context holds 32" in out.stderr
    out = pykernel("run", "x", "--model", TINY_LLAMA, "--device", "cuda")
    if out.returncode == 0:  # a GPU and the kernels backend are present
        assert "tok/s" in out.stderr
    else:
        assert out.returncode == 1 and "cuda" in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) <= 3, out.stderr


def test_chat_reads_stdin_with_reset_and_quit():
    out = pykernel("chat", "--model", TINY_LLAMA, "-n", "4", "--temp", "0",
                   stdin="hello\n/reset\nhello\n/quit\nnever sent\n")
    assert out.returncode == 0, out.stderr
    replies = out.stdout.splitlines()
    assert len(replies) >= 2 and "history cleared" in out.stderr
    assert out.stderr.count("decode:") == 2  # the line after /quit was not answered


def test_tokenize_ids_and_pieces():
    out = pykernel("tokenize", "--model", TINY_LLAMA, "hello world")
    assert out.returncode == 0 and out.stdout.strip().startswith("[261,")
    pieces = pykernel("tokenize", "--model", TINY_LLAMA, "hello world", "--pieces")
    assert "'Ġw" in pieces.stdout or "' w" in pieces.stdout or "' wor" in pieces.stdout


def test_info_prints_metadata_and_tensor_table():
    out = pykernel("info", TINY / "tiny-llama-q8_0.gguf")
    assert out.returncode == 0, out.stderr
    assert "llama.block_count" in out.stdout and "tokenizer.ggml.tokens" in out.stdout
    assert "blk.0.attn_q.weight" in out.stdout and "Q8_0" in out.stdout and "64 x 64" in out.stdout
    q_row = next(line for line in out.stdout.splitlines() if "blk.0.attn_q.weight" in line)
    assert q_row.split()[-1] == "4,352"  # 64 rows x 2 Q8_0 blocks x 34 bytes
    bad = pykernel("info", TINY / "tiny-logits.json")
    assert bad.returncode == 1 and "not a GGUF file" in bad.stderr


def test_run_default_model_on_cpu():
    """The README's main command: `pykernel run` with the default model, no GPU."""
    try:
        from llm.model_files import resolve_model
        resolve_model("smollm2", progress=False)
    except Exception as exc:  # noqa: BLE001 - any failure to obtain the file
        pytest.skip(f"default model unavailable: {exc}")
    out = pykernel("run", "The capital of France is", "-n", "8", "--temp", "0", timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(" Paris"), out.stdout
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in out.stderr and "tok/s" in out.stderr


def test_serve_answers_over_http_until_stopped():
    """`pykernel serve --port 0` prints its address, answers a completion, stops on SIGTERM
    (SIGINT would not do here: a shell running the tests in the background starts them with
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler)."""
    import json
    import re
    import signal
    import urllib.request
    env = child_env()
    proc = subprocess.Popen([sys.executable, "-m", "pykernel.cli", "serve", "--model",
                             str(TINY_LLAMA), "--port", "0", "--device", "cpu"], cwd=REPO,
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        address = None
        for _ in range(20):
            line = proc.stderr.readline()
            found = re.search(r"serving \S+ on (http://[\d.]+:\d+)/v1", line)
            if found:
                address = found.group(1)
                break
        assert address, "no 'serving ... on' line"
        request = urllib.request.Request(
            address + "/v1/completions", headers={"Content-Type": "application/json"},
            data=json.dumps({"prompt": "hello", "max_tokens": 3, "temperature": 0}).encode())
        with urllib.request.urlopen(request, timeout=60) as response:
            out = json.loads(response.read())
        assert out["choices"][0]["text"] and out["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    err = proc.stderr.read()
    assert code == 0 and "POST /v1/completions: prompt" in err and "server stopped" in err, err
