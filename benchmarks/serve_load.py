"""`pykernel serve` under load: C clients at once, each asking /v1/completions for T tokens
over real HTTP, against a server of N slots; aggregate generated tokens per second (the
scheduler, sampling, HTTP and JSON included, unlike batched_decode.py's bare steps).

Input: argv = SHAPE:TYPE (llm.synth; default llama-8b:Q4_K_M), env SYNTH_DIR (default /tmp),
CLIENTS (default 1,4,16), SLOTS (default: as many as clients), TOKENS (default 128),
DEVICE (default cuda), PROMPT_REPEAT (default 1: each client's prompt of ~14 tokens, repeated
that many times), STAGGER_MS (default 0: all at once; else client i starts i x STAGGER_MS
later and streams its answer, and the gaps between a stream's chunks are reported: how
long the running streams stall while new requests start), TEMPERATURE (default 0: greedy;
else each request samples with llama.cpp's default filters and seed = its index; SEEDED=0:
without a seed, as API clients mostly ask, which lets the device draw; PRESENCE: a
presence_penalty for every request; SEEDED_CLIENTS=N: with SEEDED=0, the first N clients
still send their seed; LOGPROBS_CLIENTS=N: the first N clients ask for logprobs 1: a step
of mixed requests), WARM_UP
(default 1; 0: servers start without warm-up, so the first run of a process compiles under
its requests and only later runs time the steady state). Output: a table per model, then
for each row where the server's worker spent the clients' run (llm/serve_metrics.py: prompts,
decode steps by batch size, sampling, slot moves, idle), from its counters before and after.

    python3 benchmarks/serve_load.py llama-8b:Q4_K_M
"""
import json
import os
import sys
import threading
import time
import urllib.request

import numpy as np

import llm
from llm.server import make_server
from llm.serve_metrics import PHASES, difference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batched_decode import model_file  # noqa: E402

PROMPT_REPEAT = int(os.environ.get("PROMPT_REPEAT", "1"))
STAGGER_MS = float(os.environ.get("STAGGER_MS", "0"))
TEMPERATURE = float(os.environ.get("TEMPERATURE", "0"))
WARM_UP = os.environ.get("WARM_UP", "1") != "0"
SEEDED = os.environ.get("SEEDED", "1") != "0"
PRESENCE = float(os.environ.get("PRESENCE", "0"))
SEEDED_CLIENTS = int(os.environ.get("SEEDED_CLIENTS", "0"))
LOGPROBS_CLIENTS = int(os.environ.get("LOGPROBS_CLIENTS", "0"))


def request_body(prompt: str, tokens: int, seed: int, **extra) -> bytes:
    """The completion request of client `seed` (its index)."""
    seeding = {"seed": seed} if SEEDED or seed < SEEDED_CLIENTS else {}
    penalty = {"presence_penalty": PRESENCE} if PRESENCE else {}
    logprobs = {"logprobs": 1} if seed < LOGPROBS_CLIENTS else {}
    return json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": TEMPERATURE,
                       **seeding, **penalty, **logprobs, **extra}).encode()


def ask(url: str, prompt: str, tokens: int, seed: int = 0) -> dict:
    body = request_body(prompt, tokens, seed)
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def ask_streaming(url: str, prompt: str, tokens: int, seed: int = 0) -> dict:
    """ask, streamed: the answer's usage, plus the gaps (seconds) between its text chunks."""
    body = request_body(prompt, tokens, seed, stream=True)
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    times, usage = [], None
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            times.append(time.perf_counter())
            usage = chunk.get("usage") or usage
    return {"usage": usage, "gaps": np.diff(times[:-1]).tolist()}   # the last: usage only


def run(model, clients: int, slots: int, tokens: int) -> tuple:
    """(generated tokens, seconds, start-up seconds, the scheduler's counters over the run) of
    `clients` requests at once on `slots` slots; start-up: the server's, whose warm-up
    compiles and captures batch sizes 2..slots (those this process has not compiled yet)."""
    t0 = time.perf_counter()
    server = make_server(model, "127.0.0.1", 0, parallel=slots, warm_up=WARM_UP)
    start_up = time.perf_counter() - t0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        ask(url, "warm up", 4)            # the prompt and decode graphs of one request
        answers = [None] * clients

        def client(i: int) -> None:
            prompt = f"Request {i}: tell me a story about the number {i}. " * PROMPT_REPEAT
            if STAGGER_MS:
                time.sleep(i * STAGGER_MS / 1e3)
                answers[i] = ask_streaming(url, prompt, tokens, seed=i)
            else:
                answers[i] = ask(url, prompt, tokens, seed=i)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        before = server.scheduler.metrics.snapshot()
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
        counters = difference(server.scheduler.metrics.snapshot(), before)
    finally:
        server.shutdown()
        server.server_close()
    if STAGGER_MS:
        gaps = np.array([g for a in answers for g in a["gaps"]]) * 1e3
        worst = sorted(max(a["gaps"], default=0.0) * 1e3 for a in answers)
        counters["gaps"] = (f"gaps between a stream's chunks: median {np.median(gaps):.1f} "
                            f"ms, p99 {np.percentile(gaps, 99):.1f} ms, each stream's longest: "
                            f"median {worst[len(worst) // 2]:.1f} ms, max {worst[-1]:.1f} ms")
    return sum(a["usage"]["completion_tokens"] for a in answers), seconds, start_up, counters


def breakdown(counters: dict, seconds: float) -> str:
    """One line: the worker's seconds per phase, then decode steps per batch size (count x
    mean ms)."""
    phases = ", ".join(f"{p} {counters[f'{p}_seconds_total']:.2f} s" for p in PHASES)
    steps = ", ".join(f"B{b}: {n} x {1e3 * s / n:.2f} ms"
                      for b, (n, s) in counters["steps_by_batch"].items())
    return (f"worker over {seconds:.2f} s: {phases}; {counters['prompt_tokens_total']} prompt "
            f"tokens in {counters.get('prompt_passes_total', '?')} passes; decode steps {steps}"
            + (f"; {counters['gaps']}" if "gaps" in counters else ""))


def main(item: str) -> None:
    clients_list = [int(c) for c in os.environ.get("CLIENTS", "1,4,16").split(",")]
    tokens = int(os.environ.get("TOKENS", "128"))
    path = model_file(item)
    model = llm.load(path, device=os.environ.get("DEVICE", "cuda"), progress=False,
                     n_ctx=max(clients_list) * 512)
    how = "greedy" if TEMPERATURE <= 0 else f"temperature {TEMPERATURE}, top-k 40, top-p 0.95"
    print(f"\n{item}: {tokens} tokens per request, {how}")
    print("| clients | slots | generated | seconds | tok/s (all clients) | server start-up s |")
    print("|---|---|---|---|---|---|")
    notes = []
    for clients in clients_list:
        slots = int(os.environ.get("SLOTS", clients))
        generated, seconds, start_up, counters = run(model, clients, slots, tokens)
        print(f"| {clients} | {slots} | {generated} | {seconds:.2f} | {generated / seconds:.0f} "
              f"| {start_up:.1f} |", flush=True)
        notes.append(f"{clients} clients: {breakdown(counters, seconds)}")
    print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "llama-8b:Q4_K_M")
