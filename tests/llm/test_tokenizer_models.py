"""Tokenizers of real vocabularies against llama.cpp: the golden prompts of SmolLM2 and Gemma 3,
and llama.cpp's own tokenizer test vectors (models/ggml-vocab-*.gguf.inp/.out)."""
from __future__ import annotations

import json

import pytest
from tests.llm import tokenizer_data
from tests.llm.tokenizer_data import golden_dir, llama_vocab_dir, read_vocab_tests

from llm.tokenizer import Tokenizer

# Vocab files of llama.cpp's test set that we support (all of its BPE and SPM ones with
# vectors); bert-bge (WordPiece) and gemma-4 (its own "gemma4" model) are rejected below.
SUPPORTED_VECTORS = ["command-r", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2",
                     "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact",
                     "starcoder"]
GOLDEN_MODELS = {"smollm2-135m-instruct-q4_1.json": "smollm2_path",
                 "gemma-3-270m-q4_k_m.json": "gemma3_path"}


@pytest.fixture(scope="module", params=sorted(GOLDEN_MODELS))
def golden_model(request):
    model_path = getattr(tokenizer_data, GOLDEN_MODELS[request.param])()
    cases = json.loads((golden_dir() / request.param).read_text())["cases"]
    return Tokenizer.from_gguf(model_path), cases


def test_golden_prompt_ids_and_continuations(golden_model):
    tok, cases = golden_model
    for case in cases:
        assert tok.encode(case["prompt"]) == case["prompt_tokens"], case["prompt"]
        greedy = [step["token"] for step in case["greedy"]]
        assert tok.decode(greedy) == case["greedy_text"]
        stream = tok.stream_decoder()
        assert "".join(stream.add(t) for t in greedy) + stream.flush() == case["greedy_text"]


def test_smollm2_special_tokens():
    tok = Tokenizer.from_gguf(tokenizer_data.smollm2_path())
    chat = "<|im_start|>user\nHi there<|im_end|>\n"
    ids = tok.encode(chat, parse_special=True)
    assert ids[0] == tok.vocab.token_to_id["<|im_start|>"] == tok.bos_id
    assert tok.vocab.token_to_id["<|im_end|>"] in ids
    plain = tok.encode(chat)
    assert not set(plain) & {0, 1, 2}, "control tokens are plain text without parse_special"
    assert tok.decode(plain) == tok.decode(ids) == chat
    assert tok.decode(ids, skip_special=True) == "user\nHi there\n"
    assert {0, 2} <= tok.eog_ids and tok.eot_id == 2 and not tok.vocab.add_bos
    assert tok.token_to_piece(tok.encode(" Paris")[0]) == b" Paris"


def test_gemma3_spm_details():
    tok = Tokenizer.from_gguf(tokenizer_data.gemma3_path())
    assert not tok.vocab.add_space_prefix and tok.vocab.add_bos
    assert tok.bos_id == 2 and tok.eos_id == 1
    end_of_turn = tok.vocab.token_to_id["<end_of_turn>"]
    assert tok.eot_id == end_of_turn and tok.eog_ids >= {1, end_of_turn}
    turn = "<start_of_turn>user\nHi<end_of_turn>\n"
    ids = tok.encode(turn, add_special=False, parse_special=True)
    assert ids[0] == tok.vocab.token_to_id["<start_of_turn>"] and end_of_turn in ids
    assert tok.decode(ids) == turn
    # A character outside the vocab falls back to byte tokens, decoded back exactly.
    text = "x\U0001d11e\U000e0100y"
    assert tok.decode(tok.encode(text, add_special=False)) == text


@pytest.fixture(scope="module")
def vocab_dir():
    return llama_vocab_dir()


@pytest.mark.parametrize("name", SUPPORTED_VECTORS)
def test_llama_cpp_vocab_vectors(vocab_dir, name):
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    tok = Tokenizer.from_gguf(path)
    cases = read_vocab_tests(path)
    assert len(cases) >= 40
    failures = [(text, expected, tok.encode(text, add_special=False))
                for text, expected in cases if tok.encode(text, add_special=False) != expected]
    assert not failures, f"{name}: {len(failures)} of {len(cases)} differ, first: {failures[0]}"
    for text, expected in cases:
        assert tok.decode(expected) == text, f"{name}: decode of {text!r}"


@pytest.mark.parametrize("name,model", [("bert-bge", "bert"), ("gemma-4", "gemma4")])
def test_unsupported_vocab_types_are_rejected_clearly(vocab_dir, name, model):
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    with pytest.raises(ValueError, match=f"tokenizer.ggml.model' is '{model}'; supported"):
        Tokenizer.from_gguf(path)


def test_phi3_rstrip_swallows_whitespace_after_special_tokens(vocab_dir):
    tok = Tokenizer.from_gguf(vocab_dir / "ggml-vocab-phi-3.gguf")
    spaced = tok.encode("Hi<|end|>  \n there", parse_special=True)
    assert spaced == tok.encode("Hi<|end|>there", parse_special=True)
    assert tok.vocab.token_to_id["<|end|>"] in spaced


def test_spm_prefixes_a_space_after_special_tokens(vocab_dir):
    tok = Tokenizer.from_gguf(vocab_dir / "ggml-vocab-llama-spm.gguf")
    hello = tok.encode("Hello", add_special=False)
    assert tok.pieces(hello) == [" Hello"]
    assert tok.encode("<s>Hello", add_special=False, parse_special=True) == [1] + hello
    assert tok.encode("Hello") == [1] + hello
    assert tok.decode(hello) == "Hello" and tok.decode([1] + hello) == "<s> Hello"
