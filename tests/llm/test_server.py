"""`pykernel serve` (llm/server.py): the OpenAI-compatible endpoints over real HTTP on a tiny
model: greedy completions equal the model's own generate(), streamed events add up to the
same text, chat answers use the template, bad requests get 400 errors and the server stays up."""
import contextlib
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import llm
from llm.server import make_server
from tests.llm.gguf_helpers import TINY_LLAMA, require_for_module

require_for_module(TINY_LLAMA)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def served(request):
    """The tiny model served on the numpy backend, and on the GPU's kernels backend."""
    if request.param == "cuda":
        import pykernel as pk
        if not pk.gpu_available():
            pytest.skip("no usable CUDA GPU (driver or device missing)")
    model = llm.load(TINY_LLAMA, device=request.param, progress=False)
    with serving(model, "tiny") as url:
        yield model, url


@contextlib.contextmanager
def serving(model, model_name: str, **options):
    """The URL of `model` served by make_server (with its options) on a free local port from
    a thread, for the with block; the server is shut down and its socket closed after it."""
    server = make_server(model, "127.0.0.1", 0, model_name=model_name, **options)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def call(url, path, body=None, raw: bytes | None = None):
    """(status, parsed JSON or the raw event text) of one request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url + path, data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            kind = response.headers.get("Content-Type", "")
            return response.status, (json.loads(text) if "json" in kind else text)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read().decode())


def events(text: str) -> list:
    chunks = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]", text[-200:]
    return [json.loads(c) for c in chunks[:-1]]


def test_health_and_models(served):
    _, url = served
    assert call(url, "/health") == (200, {"status": "ok"})
    status, models = call(url, "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "tiny"


def test_completion_matches_generate_and_streams_the_same_text(served):
    model, url = served
    body = {"prompt": "hello world", "max_tokens": 12, "temperature": 0}
    expected = "".join(model.generate("hello world", max_tokens=12, temperature=0))
    status, out = call(url, "/v1/completions", body)
    assert status == 200 and out["object"] == "text_completion" and out["model"] == "tiny"
    choice = out["choices"][0]
    assert choice["text"] == expected and choice["finish_reason"] in ("length", "stop")
    prompt_ids = model.tokenizer.encode("hello world", add_special=True, parse_special=False)
    assert out["usage"]["prompt_tokens"] == len(prompt_ids)
    assert out["usage"]["total_tokens"] == len(prompt_ids) + out["usage"]["completion_tokens"]
    status, text = call(url, "/v1/completions", {**body, "stream": True})
    chunks = events(text)
    assert status == 200 and "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert chunks[-1]["usage"] == out["usage"]


def test_a_burst_of_connections_is_queued_not_dropped():
    """64 clients connecting at once, before the server accepts any: every connection is
    established at once (the listen backlog holds them), none waits for a TCP retry."""
    import socket
    model = llm.load(TINY_LLAMA, device="cpu", progress=False)
    server = make_server(model, "127.0.0.1", 0, model_name="tiny")    # listening, not serving
    clients = []
    try:
        for _ in range(64):
            client = socket.socket()
            client.settimeout(0.5)
            client.connect(("127.0.0.1", server.server_port))   # times out if the SYN is dropped
            clients.append(client)
    finally:
        for client in clients:
            client.close()
        server.server_close()
    assert len(clients) == 64


def test_metrics_count_a_completion(served):
    """GET /metrics: Prometheus text whose counters move by one request's numbers."""
    model, url = served

    def metrics() -> dict:
        status, text = call(url, "/metrics")
        assert status == 200 and "# TYPE pykernel:requests_total counter" in text, text
        return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                if not line.startswith("#")}
    before = metrics()
    status, out = call(url, "/v1/completions", {"prompt": "hello there", "max_tokens": 5,
                                                "temperature": 0})
    after = metrics()
    usage = out["usage"]
    assert after["pykernel:requests_total"] - before["pykernel:requests_total"] == 1
    assert after["pykernel:requests_finished_total"] == after["pykernel:requests_total"]
    assert after["pykernel:prompt_tokens_total"] - before["pykernel:prompt_tokens_total"] \
        <= usage["prompt_tokens"]                 # a cached prefix is not run again
    generated = after["pykernel:tokens_generated_total"] - \
        before["pykernel:tokens_generated_total"]
    assert usage["completion_tokens"] <= generated <= usage["completion_tokens"] + 1
    assert after['pykernel:decode_steps_by_batch{batch="1"}'] >= generated - 1


def test_chat_completion_and_stream(served):
    model, url = served
    messages = [{"role": "user", "content": "hi there"}]
    expected = "".join(model.generate(model.chat_ids(messages), max_tokens=8, temperature=0))
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "seed": 3}
    status, out = call(url, "/v1/chat/completions", body)
    assert status == 200 and out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": expected}
    status, text = call(url, "/v1/chat/completions", {**body, "stream": True})
    chunks = events(text)
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected


@pytest.mark.parametrize("path, body, message", [
    ("/v1/completions", {"prompt": 3}, "'prompt' must be a string"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "at least 1"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "'temperature' must be a number"),
    ("/v1/completions", {"prompt": "x", "stop": [1]}, "'stop' must be a string"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "'n' must be a positive integer"),
    ("/v1/completions", {"prompt": ["x", "y"], "n": 9}, "at most 16 choices"),
    ("/v1/completions", {"prompt": "x", "n": 2, "stream": True}, "one choice"),
    ("/v1/completions", {"prompt": "hello " * 400}, "context"),
    ("/v1/chat/completions", {"messages": []}, "non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "string 'content'"),
    ("/v1/completions", [1, 2], "JSON object"),
])
def test_bad_requests_are_400_and_the_server_stays_up(served, path, body, message):
    _, url = served
    status, out = call(url, path, body)
    assert status == 400 and message in out["error"]["message"], out
    assert out["error"]["type"] == "invalid_request_error"
    assert call(url, "/health")[0] == 200


def test_unparsable_and_unknown(served):
    _, url = served
    status, out = call(url, "/v1/completions", raw=b"{not json")
    assert status == 400 and "not JSON" in out["error"]["message"]
    status, out = call(url, "/v1/embeddings", {"input": "x"})
    assert status == 404 and out["error"]["type"] == "not_found_error"
    assert call(url, "/nothing")[0] == 404


def test_a_client_leaving_mid_stream_leaves_the_model_usable(served):
    """Closing the connection after the first event abandons that generation; the next
    request (same prompt, greedy) gets the full, unchanged answer."""
    import socket
    from urllib.parse import urlparse
    model, url = served
    body = json.dumps({"prompt": "once upon", "max_tokens": 40, "temperature": 0,
                       "stream": True}).encode()
    where = urlparse(url)
    with socket.create_connection((where.hostname, where.port), timeout=60) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        received = b""
        while b"data: " not in received:          # headers, then the first event
            chunk = conn.recv(4096)
            assert chunk, received
            received += chunk
    status, out = call(url, "/v1/completions", {"prompt": "once upon", "max_tokens": 40,
                                                "temperature": 0})
    expected = "".join(model.generate("once upon", max_tokens=40, temperature=0))
    assert status == 200 and out["choices"][0]["text"] == expected


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_parallel_slots_answer_concurrent_requests_like_one_at_a_time(device):
    """`serve --parallel 3`: four concurrent greedy requests (one waits for a slot) get the
    answers the model gives each prompt alone."""
    if device == "cuda":
        import pykernel as pk
        if not pk.gpu_available():
            pytest.skip("no usable CUDA GPU (driver or device missing)")
    model = llm.load(TINY_LLAMA, device=device, progress=False, n_ctx=384)
    prompts = ["once upon a time", "hello there", "the quick brown", "one two three"]
    expected = ["".join(model.generate(p, max_tokens=16, temperature=0)) for p in prompts]
    answers = ask_at_once(model, "/v1/completions", [
        {"prompt": p, "max_tokens": 16, "temperature": 0} for p in prompts], warm_up=True)
    assert [a[0] for a in answers] == [200] * len(prompts)
    assert [a[1]["choices"][0]["text"] for a in answers] == expected
    # chat requests at once: their templates render through one worker process, in turn
    chats = [[{"role": "user", "content": p}] for p in prompts]
    expected = ["".join(model.generate(model.chat_ids(m), max_tokens=8, temperature=0))
                for m in chats]
    answers = ask_at_once(model, "/v1/chat/completions", [
        {"messages": m, "max_tokens": 8, "temperature": 0} for m in chats])
    assert [a[0] for a in answers] == [200] * len(chats), answers
    assert [a[1]["choices"][0]["message"]["content"] for a in answers] == expected


def ask_at_once(model, path: str, bodies: list, warm_up: bool = False) -> list:
    """(status, answer) of each body, all sent at once to a fresh server of 3 slots."""
    answers = [None] * len(bodies)
    with serving(model, "tiny", parallel=3, warm_up=warm_up) as url:
        def ask(i):
            answers[i] = call(url, path, bodies[i])
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    return answers


def test_logprobs_in_completions_and_chat(served):
    """OpenAI's logprobs objects: completions (tokens, token_logprobs, top_logprobs,
    text_offset), chat (content entries with bytes and top_logprobs); streamed chunks carry
    the same entries as the whole answer."""
    model, url = served
    body = {"prompt": "hello world", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    status, out = call(url, "/v1/completions", body)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert status == 200 and len(lp["tokens"]) == out["usage"]["completion_tokens"]
    # (this random model's tokens are bytes of no whole character: no join to compare)
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    assert all(x <= 0 for x in lp["token_logprobs"]) and choice["text"]
    assert all(len(top) == 2 and tok in top for tok, top in zip(lp["tokens"],
                                                                 lp["top_logprobs"]))
    _, text = call(url, "/v1/completions", dict(body, stream=True))
    streamed = [c["choices"][0]["logprobs"] for c in events(text)]
    # (the second request reuses the cached prompt: float rounding differs, ~1e-6)
    assert sum((c["token_logprobs"] for c in streamed), []) == pytest.approx(
        lp["token_logprobs"], abs=1e-4)
    assert [c["text_offset"] for c in streamed if c["text_offset"]][0][0] == 0

    messages = [{"role": "user", "content": "Hi"}]
    chat = {"messages": messages, "max_tokens": 5, "temperature": 0, "logprobs": True,
            "top_logprobs": 3}
    status, out = call(url, "/v1/chat/completions", chat)
    content = out["choices"][0]["logprobs"]["content"]
    assert status == 200 and len(content) == out["usage"]["completion_tokens"]
    for entry in content:
        assert len(entry["top_logprobs"]) == 3 and entry["logprob"] <= 0
        assert bytes(entry["bytes"]).decode("utf-8", "replace") == entry["token"]
    status, plain = call(url, "/v1/chat/completions", dict(chat, logprobs=False,
                                                           top_logprobs=None))
    assert status == 200 and plain["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("path, body, message", [
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "'logprobs' must be an integer"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "'logprobs' must be an integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "logprobs": 2}, "'logprobs' must be true or false"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 2}, "needs"),
])
def test_bad_logprobs_are_400(served, path, body, message):
    _, url = served
    status, out = call(url, path, body)
    assert status == 400 and message in out["error"]["message"], out


def test_prompts_as_token_ids_and_several_prompts(served):
    model, url = served
    ids = model.tokenizer.encode("hello world")
    body = {"max_tokens": 6, "temperature": 0}
    _, by_text = call(url, "/v1/completions", dict(body, prompt="hello world"))
    status, by_ids = call(url, "/v1/completions", dict(body, prompt=ids))
    assert status == 200 and by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    prompts = ["once upon", ids, "the quick brown"]
    status, out = call(url, "/v1/completions", dict(body, prompt=prompts))
    assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1, 2]
    alone = [call(url, "/v1/completions", dict(body, prompt=p))[1] for p in prompts]
    assert [c["text"] for c in out["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert out["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"]
                                                    for a in alone)


def test_echo_with_logprobs_scores_the_prompt(served):
    """lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs=1,
    max_tokens=1: the prompt's tokens come back with their log-probabilities under the model
    (the first with none), then the generated token's."""
    model, url = served
    ids = model.tokenizer.encode("the quick brown fox jumps")
    status, out = call(url, "/v1/completions", {"prompt": ids, "max_tokens": 1,
                                                "temperature": 0, "echo": True,
                                                "logprobs": 1})
    lp = out["choices"][0]["logprobs"]
    assert status == 200 and len(lp["token_logprobs"]) == len(ids) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    logits = model.logits(ids).astype(np.float64)
    peak = logits.max(axis=1, keepdims=True)
    reference = logits - peak - np.log(np.exp(logits - peak).sum(axis=1, keepdims=True))
    expected = [reference[j, ids[j + 1]] for j in range(len(ids) - 1)]
    assert lp["token_logprobs"][1:len(ids)] == pytest.approx(expected, abs=2e-3)
    assert all(len(top) == 1 for top in lp["top_logprobs"][1:])
    assert out["choices"][0]["text"].startswith(model.tokenizer.decode(ids))
    # lm_eval 0.4.13's local-completions loglikelihood payload, parsed as it parses it
    ctxlen = 3
    status, out = call(url, "/v1/completions", {"model": "tiny", "prompt": [ids],
                                                "temperature": 0, "max_tokens": 1,
                                                "logprobs": 1, "seed": 1234, "echo": True})
    choice = out["choices"][0]["logprobs"]
    total = sum(choice["token_logprobs"][ctxlen:-1])
    greedy = all(t == max(top.values()) for t, top in zip(choice["token_logprobs"][ctxlen:-1],
                                                          choice["top_logprobs"][ctxlen:-1]))
    assert status == 200 and total == pytest.approx(sum(expected[ctxlen - 1:]), abs=1e-2)
    assert greedy == all(reference[j].argmax() == ids[j + 1] for j in range(ctxlen - 1,
                                                                           len(ids) - 1))
    _, text = call(url, "/v1/completions", {"prompt": "hello", "max_tokens": 2,
                                            "temperature": 0, "echo": True, "stream": True})
    assert events(text)[0]["choices"][0]["text"] == "hello"


@pytest.mark.parametrize("body, message", [
    ({"prompt": [1, 2, 10 ** 9]}, "outside the vocabulary"),
    ({"prompt": [[1, 2], "x", 3]}, "'prompt' must be"),
    ({"prompt": ["a"] * 17}, "1 to 16"),
    ({"prompt": ["a", "b"], "stream": True}, "one choice"),
    ({"prompt": "a", "echo": "yes"}, "'echo' must be true or false"),
])
def test_bad_prompts_are_400(served, body, message):
    _, url = served
    status, out = call(url, "/v1/completions", body)
    assert status == 400 and message in out["error"]["message"], out


def test_n_choices_sample_with_consecutive_seeds(served):
    """n = 3 with a seed: choice j is what a request with seed + j gives alone; chat too."""
    model, url = served
    body = {"prompt": "once upon", "max_tokens": 8, "temperature": 1.0, "seed": 11, "n": 3}
    status, out = call(url, "/v1/completions", body)
    assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1, 2]
    alone = [call(url, "/v1/completions", dict(body, n=1, seed=11 + j))[1]["choices"][0]["text"]
             for j in range(3)]
    assert [c["text"] for c in out["choices"]] == alone
    assert out["usage"]["prompt_tokens"] == len(model.tokenizer.encode("once upon"))
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2,
            "temperature": 0}
    status, out = call(url, "/v1/chat/completions", chat)
    texts = [c["message"]["content"] for c in out["choices"]]
    assert status == 200 and len(texts) == 2 and texts[0] == texts[1]    # greedy: the same


def test_tokenize_and_detokenize(served):
    """llama.cpp server's /tokenize and /detokenize."""
    model, url = served
    status, out = call(url, "/tokenize", {"content": "hello world"})
    assert status == 200 and out["tokens"] == model.tokenizer.encode("hello world",
                                                                     add_special=False)
    _, special = call(url, "/tokenize", {"content": "hello world", "add_special": True,
                                         "with_pieces": True})
    ids = [t["id"] for t in special["tokens"]]
    assert ids == model.tokenizer.encode("hello world")
    assert all(isinstance(t["piece"], str) for t in special["tokens"])
    status, out = call(url, "/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and out["content"] == "hello world"
    assert call(url, "/detokenize", {"tokens": []}) == (200, {"content": ""})
    for path, body in (("/tokenize", {"content": 3}), ("/detokenize", {"tokens": [10 ** 9]}),
                       ("/detokenize", {"tokens": "abc"})):
        assert call(url, path, body)[0] == 400
