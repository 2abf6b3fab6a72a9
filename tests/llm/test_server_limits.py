"""`pykernel serve` against bad clients (issue 45, item 9): every malformed field, a deeply
nested body, a body too large, clients that stall (dropped after the I/O timeout) or hang up
anywhere (one log line each, no traceback, no thread left), and a request whose generation
fails mid-batch (HTTP 500 for it alone, the concurrent request answered as if alone)."""
import json
import socket
import threading
import time

import numpy as np
import pytest

import llm
from llm import sampling
from llm.server import make_server
from llm.server_wire import ServerLimits
from tests.llm.gguf_helpers import TINY_LLAMA, require_for_module
from tests.llm.test_server import call

require_for_module(TINY_LLAMA)

USER = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def model():
    return llm.load(TINY_LLAMA, device="cpu", progress=False, n_ctx=256)


def serve(model, **options):
    """(server, url) of a fresh server running in a thread; the caller closes it."""
    server = make_server(model, "127.0.0.1", 0, model_name="tiny", **options)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def stop(server) -> None:
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def url(model):
    server, address = serve(model)
    yield address
    stop(server)


@pytest.mark.parametrize("path, body, field", [
    ("/v1/completions", {"prompt": "x", "stream": "false"}, "'stream'"),
    ("/v1/chat/completions", {"messages": USER, "stream": 1}, "'stream'"),
    ("/v1/completions", {"prompt": "x", "echo": "true"}, "'echo'"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, "'max_tokens' must be an integer"),
    ("/v1/completions", {"prompt": "x", "max_tokens": True}, "'max_tokens'"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "'temperature' must be at least"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, "'top_p' must be at most 1"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "'top_p' must be at least"),
    ("/v1/completions", {"prompt": "x", "min_p": 2}, "'min_p'"),
    ("/v1/completions", {"prompt": "x", "top_k": "5"}, "'top_k' must be an integer"),
    ("/v1/completions", {"prompt": "x", "top_k": 10 ** 30}, "'top_k' must be at most"),
    ("/v1/completions", {"prompt": "x", "seed": -1}, "'seed' must be at least 0"),
    ("/v1/completions", {"prompt": "x", "seed": 2 ** 64}, "'seed' must be at most"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 3}, "'presence_penalty'"),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": [1]}, "'frequency_penalty'"),
    ("/v1/completions", {"prompt": "x", "repeat_penalty": 0}, "'repeat_penalty'"),
    ("/v1/completions", {"prompt": "x", "repeat_last_n": -2}, "'repeat_last_n'"),
    ("/v1/completions", {"prompt": "x", "stop": {"a": 1}}, "'stop'"),
    ("/v1/completions", {"prompt": "x", "model": 3}, "'model'"),
    ("/v1/completions", {"prompt": "x", "n": "2"}, "'n'"),
    ("/v1/chat/completions", {"messages": "hi"}, "'messages'"),
    ("/v1/chat/completions", {"messages": ["hi"]}, "'messages[0]'"),
    ("/v1/chat/completions", {"messages": [{"role": "root", "content": "x"}]},
     "'messages[0].role' must be one of"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "user", "content": 5}]},
     "'messages[1].content'"),
    ("/v1/chat/completions", {"messages": USER, "top_logprobs": 2, "logprobs": True,
                              "temperature": {}}, "'temperature'"),
    ("/tokenize", {"content": "x", "with_pieces": "yes"}, "'with_pieces'"),
])
def test_each_field_is_checked_and_named(url, path, body, field):
    status, out = call(url, path, body)
    assert status == 400 and field in out["error"]["message"], out
    assert "\n" not in out["error"]["message"]


def test_chat_content_as_text_parts(url, model):
    """OpenAI's list-of-parts content is the parts' text joined."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi "},
                                          {"type": "text", "text": "there"}]}]
    body = {"max_tokens": 4, "temperature": 0}
    _, joined = call(url, "/v1/chat/completions", {**body, "messages": parts})
    _, plain = call(url, "/v1/chat/completions",
                    {**body, "messages": [{"role": "user", "content": "hi there"}]})
    assert joined["choices"][0]["message"] == plain["choices"][0]["message"]


@pytest.mark.parametrize("raw, message", [
    (b"[" * 100000 + b"]" * 100000, "nests deeper"),
    (b'{"prompt": "x", "a": ' + b"{\"a\": " * 50000 + b"1" + b"}" * 50001, "nests deeper"),
    (b'{"prompt": "x", "temperature": NaN}', "NaN"),
    (b'{"prompt": "x", "temperature": Infinity}', "Infinity"),
    (b'{"prompt": "x", "temperature": 1e400}', "too large"),
    (b'{"prompt": "\xff"}', "not JSON"),
])
def test_bodies_that_are_not_plain_json_are_400(url, raw, message):
    status, out = call(url, "/v1/completions", raw=raw)
    assert status == 400 and message in out["error"]["message"], out
    assert call(url, "/health")[0] == 200


def test_a_body_over_the_limit_is_413_and_unread(model):
    server, url = serve(model, limits=ServerLimits(max_body_bytes=1000))
    try:
        status, out = call(url, "/v1/completions", {"prompt": "x" * 2000})
        assert status == 413 and "at most 1000" in out["error"]["message"]
        status, out = call(url, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert status == 200
    finally:
        stop(server)


def connect(url: str) -> socket.socket:
    host, port = url.rsplit("/", 1)[-1].split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_stalled_clients_are_dropped_after_the_timeout_with_one_line_each(model, capsys):
    """A slowloris: 12 connections stop mid-headers, mid-body, or idle before sending
    anything. Each is closed by the server once the timeout passes, each costs one line of
    log at most and no traceback, and no handler thread is left behind."""
    before = threading.active_count()
    server, url = serve(model, limits=ServerLimits(io_timeout_s=0.5))
    stalls = [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
              b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"prompt\""]
    try:
        clients = [connect(url) for _ in range(12)]
        for i, client in enumerate(clients):
            if stalls[i % 3]:
                client.sendall(stalls[i % 3])
        start = time.monotonic()
        for client in clients:       # the server closes each (else recv times out)
            while client.recv(4096):
                pass
        assert time.monotonic() - start < 5
        assert call(url, "/health")[0] == 200
    finally:
        for client in clients:
            client.close()
        stop(server)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("client ")]) <= 12, err
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before


def test_clients_hanging_up_anywhere_print_one_line_each_and_no_traceback(url, capsys):
    body = json.dumps({"prompt": "once upon", "max_tokens": 30, "temperature": 0,
                       "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " +
               str(len(body)).encode() + b"\r\n\r\n" + body)
    # cut: after nothing, mid-request-line, mid-headers, mid-body, after the whole request
    cuts = [0, 10, 40, len(request) - 10, len(request)]
    for _ in range(4):
        for cut in cuts:
            client = connect(url)
            if cut:
                client.sendall(request[:cut])
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            client.close()                   # linger 0: a reset, as a killed client sends
    time.sleep(1.0)
    assert call(url, "/health")[0] == 200
    status, out = call(url, "/v1/completions", {"prompt": "once upon", "max_tokens": 5})
    assert status == 200
    err = capsys.readouterr().err
    assert "Traceback" not in err and "During handling" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("client ")]) <= 20, err


FAIL_SEED = 666


def failing_sample(real):
    """Sampler.sample wrapped: a request seeded with FAIL_SEED raises on its 3rd token (as the
    sampler does on non-finite logits), mid-batch."""
    def sample(sampler, logits, history=()):
        time.sleep(0.003)            # the other request runs long enough for the two to meet
        if sampler.params.seed == FAIL_SEED:
            # counted on the sampler itself: an id() of a freed one would be reused
            sampler.test_calls = n = getattr(sampler, "test_calls", 0) + 1
            if n == 3:
                raise ValueError("logits hold NaN\n(a second line the client must not see)")
        return real(sampler, logits, history)
    return sample


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_generation_is_500_alone_and_the_others_go_on(model, monkeypatch, stream):
    monkeypatch.setattr(sampling.Sampler, "sample", failing_sample(sampling.Sampler.sample))
    server, url = serve(model, parallel=2)
    good = {"prompt": "once upon a time", "max_tokens": 100, "temperature": 0.5, "seed": 1}
    bad = {"prompt": "hello there", "max_tokens": 24, "temperature": 0.5,
           "seed": FAIL_SEED, "stream": stream}
    expected = "".join(model.generate(good["prompt"], max_tokens=100, temperature=0.5, seed=1))
    answers = {}
    try:
        threads = [threading.Thread(target=lambda k=k, b=b: answers.__setitem__(
            k, call(url, "/v1/completions", b))) for k, b in (("good", good), ("bad", bad))]
        for t in threads:
            t.start()
            time.sleep(0.1)          # the good request decoding when the bad one comes
        for t in threads:
            t.join(60)
        assert answers["good"][0] == 200
        assert answers["good"][1]["choices"][0]["text"] == expected
        if stream:        # the events began: the error is the last event, no [DONE]
            status, text = answers["bad"]
            last = json.loads(text.strip().split("\n\n")[-1][len("data: "):])
            assert status == 200 and "[DONE]" not in text
            assert last["error"]["type"] == "server_error"
            message = last["error"]["message"]
        else:
            status, out = answers["bad"]
            assert status == 500 and out["error"]["type"] == "server_error"
            message = out["error"]["message"]
        assert "logits hold NaN" in message and "second line" not in message
        _, metrics = call(url, "/metrics")
        assert "pykernel:requests_failed_total 1" in metrics
        assert 'decode_steps_by_batch{batch="2"}' in metrics      # they met mid-batch
        status, again = call(url, "/v1/completions", good)       # still serving, same slots
        assert status == 200 and again["choices"][0]["text"] == expected
    finally:
        stop(server)


def test_chat_messages_cannot_write_control_tokens(model, url):
    """A message's <|eos|> is text (several tokens), unless the server is told otherwise."""
    hostile = {"messages": [{"role": "user", "content": "x<|eos|>"}], "max_tokens": 1}
    _, out = call(url, "/v1/chat/completions", hostile)
    safe = model.chat_ids(hostile["messages"])
    assert out["usage"]["prompt_tokens"] == len(safe)
    assert model.tokenizer.eos_id not in safe
    server, old_url = serve(model, parse_special_in_messages=True)
    try:
        _, out = call(old_url, "/v1/chat/completions", hostile)
        assert out["usage"]["prompt_tokens"] == len(
            model.chat_ids(hostile["messages"], parse_special_in_messages=True)) < len(safe)
    finally:
        stop(server)


def test_nan_weights_fail_their_request_alone(tmp_path, monkeypatch):
    """A model whose embedding row of one token is NaN: a prompt holding that token gets
    NaN logits, which the sampler cannot draw from (HTTP 500, at its first token); the
    request decoding meanwhile gets the answer it gets alone. (Failing mid-batch, after
    decode steps together: test_a_failing_generation_is_500_alone_and_the_others_go_on.)"""
    nan_model = llm.load(_nan_row_model(tmp_path), device="cpu", progress=False, n_ctx=256)
    real = sampling.Sampler.sample

    def slowed(sampler, logits, history=()):
        time.sleep(0.003)            # the good request runs long enough for the two to meet
        return real(sampler, logits, history)
    good = {"prompt": [5, 6, 7, 8], "max_tokens": 100, "temperature": 0.5, "seed": 1}
    expected = "".join(nan_model.generate(good["prompt"], max_tokens=100, temperature=0.5,
                                          seed=1))
    monkeypatch.setattr(sampling.Sampler, "sample", slowed)
    server, url = serve(nan_model, parallel=2)
    answers = {}
    try:
        bad = dict(good, prompt=[5, POISONED_ID, 7], max_tokens=10)
        _good_beside_bad(url, good, bad, expected)
    finally:
        stop(server)


@pytest.mark.parametrize("backend,bad_sampling", [
    ("kernels", dict(temperature=0)),                          # the step's argmax_rows
    ("kernels", dict(temperature=0.8, top_k=40, min_p=0.99)),  # sample_rows: device draws
    ("numpy", dict(temperature=0)),                            # argmax_rows on the host
], ids=["kernels-greedy", "kernels-device-drawn", "numpy-greedy"])
def test_nan_logits_in_a_shared_step_fail_their_request_alone(tmp_path, monkeypatch, backend,
                                                               bad_sampling):
    """A step's tokens picked for all its rows at once (on the kernels backend, CPU target,
    on the device): the bad request's first token (from its prompt's finite logits; min_p
    0.99 leaves only the top one) has a NaN embedding row, so its NaN logits come in decode
    steps it shares with the good request. Its row is flagged, that request alone gets a 500
    (NonFiniteLogitsError), the good one the text it gets alone, and the server goes on
    answering."""
    bad_prompt, good_prompt = [9, 10, 11], [5, 6, 7, 8]
    clean = llm.load(TINY_LLAMA, device="cpu", progress=False, n_ctx=256)
    first = int(np.argmax(clean.logits(bad_prompt)[-1]))
    nan_model = llm.load(_nan_row_model(tmp_path, first), device="cpu", backend=backend,
                         progress=False, n_ctx=256)
    good = {"prompt": good_prompt, "max_tokens": 100, "temperature": 0}
    expected = "".join(nan_model.generate(good_prompt, max_tokens=100, temperature=0))
    failed_rows = []
    for name in ("argmax_rows", "sample_rows"):
        real = getattr(nan_model.backend, name)

        def spy(x, *args, real=real):
            time.sleep(0.003)        # the good request runs long enough for the two to meet
            try:
                return real(x, *args)
            except sampling.NonFiniteLogitsError:
                failed_rows.append(x.shape[0])
                raise
        monkeypatch.setattr(nan_model.backend, name, spy)
    server, url = serve(nan_model, parallel=2)
    try:
        bad = dict(bad_sampling, prompt=bad_prompt, max_tokens=10)
        _good_beside_bad(url, good, bad, expected)
        assert 2 in failed_rows, failed_rows       # the bad row failed in a shared step
        status, out = call(url, "/v1/completions", bad)              # alone now
        assert status == 500 and "NonFiniteLogitsError" in out["error"]["message"], out
    finally:
        stop(server)


POISONED_ID = 200


def _nan_row_model(tmp_path, poisoned: int = POISONED_ID):
    """tiny-llama with the embedding row of token `poisoned` all NaN: a path."""
    from llm.gguf_file import GGUFFile
    from tests.llm.gguf_helpers import rewrite
    embd = GGUFFile(TINY_LLAMA).tensors["token_embd.weight"]
    table = embd.data.view(np.float32).reshape(embd.shape).copy()
    table[poisoned] = np.nan
    return rewrite(TINY_LLAMA, tmp_path / "nan.gguf",
                   tensors={"token_embd.weight": (table, None)})


def _good_beside_bad(url, good, bad, expected) -> None:
    """The good request sent, then the bad one while it decodes: the bad one is a 500, the
    good one answers `expected`, and so does it again afterwards."""
    answers = {}
    threads = [threading.Thread(target=lambda k=k, b=b: answers.__setitem__(
        k, call(url, "/v1/completions", b))) for k, b in (("good", good), ("bad", bad))]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(60)
    status, out = answers["bad"]
    assert status == 500 and out["error"]["type"] == "server_error", out
    assert answers["good"][0] == 200
    assert answers["good"][1]["choices"][0]["text"] == expected
    assert call(url, "/v1/completions", good)[1]["choices"][0]["text"] == expected
