"""SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M against llama.cpp (golden/*.json) and the
f32 oracle (golden/*.f32-logits.npz): prompt ids exact, teacher-forced logits within 1e-2
relative L2, argmax equal to llama.cpp's greedy token wherever its own top-2 margin is >= 0.35,
and greedy generation reproducing llama.cpp's tokens up to its first near-tie."""
import json

import numpy as np
import pytest

import llm
from tests.llm.gguf_helpers import GOLDEN, require_for_module

require_for_module(GOLDEN / "smollm2-135m-instruct-q4_1.json")

MODELS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3-270m": "gemma-3-270m-q4_k_m"}
LOGITS_TOL = 1e-2     # measured 2.3e-4..5.1e-4 (SmolLM2), 2.7e-4..4.2e-4 (Gemma 3)
NEAR_TIE = 0.35       # llama.cpp's quantized activations move logits by up to ~2


@pytest.fixture(scope="module", params=sorted(MODELS))
def loaded(request):
    try:
        path = llm.resolve_model(request.param, progress=False)
    except llm.ModelFileError as exc:
        pytest.skip(f"model {request.param} unavailable (no cache and no network): {exc}")
    golden = GOLDEN / MODELS[request.param]
    return (llm.load(path, n_ctx=256), json.loads(golden.with_suffix(".json").read_text()),
            np.load(golden.with_suffix(".f32-logits.npz")))


def test_prompt_tokens_exact(loaded):
    model, gold, _ = loaded
    for case in gold["cases"]:
        assert model.tokenizer.encode(case["prompt"]) == case["prompt_tokens"], case["prompt"]


def test_teacher_forced_logits_and_greedy_picks(loaded):
    model, gold, oracle = loaded
    errors = []
    for i, case in enumerate(gold["cases"]):
        tokens = oracle[f"tokens_{i}"]
        n_prompt = len(case["prompt_tokens"])
        assert tokens[:n_prompt].tolist() == case["prompt_tokens"]
        greedy = [s["token"] for s in case["greedy"]]
        assert tokens[n_prompt:].tolist() == greedy[:len(tokens) - n_prompt]
        logits = model.logits(tokens)
        ids = oracle[f"ids_{i}"]
        err = float(np.linalg.norm(logits[:, ids] - oracle[f"logits_{i}"])
                    / np.linalg.norm(oracle[f"logits_{i}"]))
        errors.append(err)
        assert err < LOGITS_TOL, f"case {i}: relative L2 {err:.2e}"
        for step, want in enumerate(case["greedy"]):
            top = want["top5"]
            if top[0][1] - top[1][1] < NEAR_TIE:
                continue
            got = int(np.argmax(logits[n_prompt - 1 + step]))
            assert got == want["token"], f"case {i} step {step}: argmax {got} != {want['token']}"
    print(f"{gold['model']}: relative L2 per case {[f'{e:.1e}' for e in errors]}")


def test_greedy_generation_follows_llama_cpp(loaded):
    model, gold, _ = loaded
    for case in gold["cases"][:2]:
        expected = []
        for want in case["greedy"]:
            top = want["top5"]
            if top[0][1] - top[1][1] < NEAR_TIE:
                break
            expected.append(want["token"])
        session = model.session()
        session.reset()
        logits, _ = session.prefill(case["prompt_tokens"])
        got = []
        for _ in expected:
            got.append(int(np.argmax(logits)))
            logits = session.step(got[-1])
        assert got == expected, case["prompt"]


def test_chat_prompt_and_reply(loaded):
    model, gold, _ = loaded
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = model.chat_prompt(messages)
    if model.config.arch == "llama":  # SmolLM2's own template, with its default system prompt
        assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                          "trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the "
                          "capital of France?<|im_end|>\n<|im_start|>assistant\n")
        ids = model.chat_ids(messages)
        assert ids[0] == model.tokenizer.encode("<|im_start|>", parse_special=True)[0]
        reply = model.chat(messages, max_tokens=24, temperature=0)
        assert "Paris" in reply and model.last_stats.stop_reason == "eog"
    else:  # the Gemma file has no template: the built-in Gemma turn format
        assert prompt.startswith("<bos><start_of_turn>user\nWhat is")
        assert prompt.endswith("<end_of_turn>\n<start_of_turn>model\n")
        ids = model.chat_ids(messages)
        assert ids.count(model.tokenizer.bos_id) == 1
