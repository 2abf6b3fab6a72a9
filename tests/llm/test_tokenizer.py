"""Tokenizer unit tests on small vocabularies: the tiny models' llama.cpp ids, BPE/SPM merge
order against naive references, special-token splitting, decoding and metadata errors."""
from __future__ import annotations

import json
import os

import pytest
import regex
from tests.llm.tokenizer_data import byte_level_vocab, golden_dir, write_vocab_gguf

from llm.tokenizer import Tokenizer
from llm.tokenizer.bpe import merge_symbols
from llm.tokenizer.pretokenize import FUSED, REGEXES, Splitter
from llm.tokenizer.spm import SpmEncoder
from llm.tokenizer.vocab import load_vocab

TINY = golden_dir() / "tiny"
ALPHABET = "ab c\n'1é漢😀"


def tiny_cases():
    path = TINY / "tiny-logits.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [(model, case["text"], case["tokens"]) for model, cases in data.items()
            for case in cases]


@pytest.mark.parametrize("model,text,expected", tiny_cases())
def test_tiny_models_match_llama_cpp_ids(model, text, expected):
    tok = Tokenizer.from_gguf(TINY / model)
    assert tok.encode(text) == expected
    assert tok.decode(expected[1:]) == text


def random_text(rng, n: int, alphabet: str = ALPHABET) -> str:
    return "".join(alphabet[i] for i in rng.integers(0, len(alphabet), n))


@pytest.fixture(scope="module")
def tiny_gpt2():
    return Tokenizer.from_gguf(TINY / "tiny-gpt2-f32.gguf")


def test_byte_level_round_trip_and_stream_decoder(tiny_gpt2, rng, seed):
    for _ in range(20):
        text = random_text(rng, int(rng.integers(1, 40)))
        ids = tiny_gpt2.encode(text, add_special=False)
        assert tiny_gpt2.decode(ids) == text, f"seed={seed} text={text!r}"
        stream = tiny_gpt2.stream_decoder()
        chunks = [stream.add(i) for i in ids] + [stream.flush()]
        assert "".join(chunks) == text, f"seed={seed} text={text!r}"
        assert "\ufffd" not in "".join(chunks)


def test_stream_decoder_holds_partial_utf8(tiny_gpt2):
    ids = tiny_gpt2.encode("😀!", add_special=False)
    assert [len(tiny_gpt2.token_to_piece(i)) for i in ids] == [1, 1, 1, 1, 1]
    stream = tiny_gpt2.stream_decoder()
    assert [stream.add(i) for i in ids] == ["", "", "", "😀", "!"]
    stream.add(ids[0])
    assert stream.flush() == "\ufffd"  # a truncated sequence is not dropped silently
    assert tiny_gpt2.pieces(ids[:1]) == ["\ufffd"]


def naive_bpe(symbols, ranks):
    """Reference: merge the lowest-rank adjacent pair, leftmost first, until none is left."""
    symbols = list(symbols)
    while True:
        found = [(ranks[(a, b)], i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))
                 if (a, b) in ranks]
        if not found:
            return symbols
        _, i = min(found)
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]


def test_bpe_merge_order_matches_naive_reference(rng, seed):
    letters = "abcd"
    pairs = {(a, b) for a in letters for b in letters}
    pairs |= {(a + b, c) for a in letters for b in letters for c in letters}
    for trial in range(50):
        chosen = [p for p in pairs if rng.random() < 0.3]
        ranks = {p: int(r) for p, r in zip(chosen, rng.permutation(len(chosen)))}
        word = list(random_text(rng, int(rng.integers(1, 16)), letters))
        assert merge_symbols(list(word), ranks) == naive_bpe(word, ranks), \
            f"seed={seed} trial={trial} word={''.join(word)!r}"


def naive_spm(text, scores):
    """Reference: merge the adjacent pair whose text scores highest (leftmost on ties)."""
    symbols = list(text)
    while True:
        found = [(-scores[a + b], i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))
                 if a + b in scores]
        if not found:
            return symbols
        _, i = min(found)
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]


def spm_vocab_file(tmp_path, pieces, scores, add_space_prefix=None):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 259 + [float(s) for s in scores],
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces)}
    if add_space_prefix is not None:
        meta["tokenizer.ggml.add_space_prefix"] = add_space_prefix
    return write_vocab_gguf(tmp_path / "spm.gguf", meta)


def test_spm_merge_order_matches_naive_reference(tmp_path, rng, seed):
    letters = "ab▁"
    pieces = sorted({random_text(rng, int(rng.integers(1, 5)), letters) for _ in range(30)})
    scores = [float(s) for s in rng.integers(-5, 5, len(pieces))]  # many ties on purpose
    vocab = load_vocab(spm_vocab_file(tmp_path, pieces, scores))
    encoder = SpmEncoder(vocab)
    table = dict(zip(pieces, scores))
    for trial in range(50):
        text = random_text(rng, int(rng.integers(1, 20)), letters)
        assert encoder._merge(list(text)) == naive_spm(text, table), \
            f"seed={seed} trial={trial} text={text!r}"


def test_spm_byte_fallback_space_prefix_and_decode(tmp_path):
    path = spm_vocab_file(tmp_path, ["▁", "▁h", "i", "▁hi"], [-1.0, -2.0, -3.0, -0.5])
    tok = Tokenizer.from_gguf(path)
    hi, byte_e9 = tok.vocab.token_to_id["▁hi"], 3 + 0xE9
    assert tok.bos_id == 1 and tok.eos_id == 2 and tok.vocab.add_bos
    # "é" has no piece: its UTF-8 bytes C3 A9 become byte tokens <0xC3> <0xA9>.
    assert tok.encode("hi é") == [1, hi, tok.vocab.token_to_id["▁"], 3 + 0xC3, 3 + 0xA9]
    assert tok.decode(tok.encode("hi é", add_special=False)) == "hi é"
    assert tok.token_to_piece(byte_e9) == b"\xe9"
    no_prefix = Tokenizer.from_gguf(spm_vocab_file(tmp_path, ["▁", "▁h", "i", "▁hi"],
                                                   [-1.0, -2.0, -3.0, -0.5], False))
    # no "hi" piece without the prefix space: "h" falls back to its byte, "i" is a piece
    assert no_prefix.encode("hi", add_special=False) == [3 + ord("h"),
                                                         tok.vocab.token_to_id["i"]]


def bpe_vocab_file(tmp_path, merges, extra_tokens=(), extra_types=(), **meta):
    tokens = byte_level_vocab(merges, list(extra_tokens))
    types = [1] * (len(tokens) - len(extra_types)) + list(extra_types)
    data = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": types, **meta}
    return write_vocab_gguf(tmp_path / "bpe.gguf", data)


def test_special_tokens_split_longest_first_and_only_when_asked(tmp_path):
    path = bpe_vocab_file(tmp_path, ["h i"], ["<|im_start|>", "<|im_end|>", "<|im", "<u>"],
                          [3, 3, 3, 4], **{"tokenizer.ggml.bos_token_id": 257,
                                           "tokenizer.ggml.add_bos_token": True})
    tok = Tokenizer.from_gguf(path)
    ids = {t: tok.vocab.token_to_id[t] for t in ("<|im_start|>", "<|im_end|>", "<|im", "<u>")}
    text = "<|im_start|>hi<u><|im_end|>"
    assert tok.encode(text, add_special=False, parse_special=True) == [
        ids["<|im_start|>"], tok.vocab.token_to_id["hi"], ids["<u>"], ids["<|im_end|>"]]
    plain = tok.encode(text, add_special=False)
    assert ids["<u>"] in plain, "user-defined tokens split out even without parse_special"
    assert ids["<|im_start|>"] not in plain and ids["<|im"] not in plain
    assert tok.decode(plain) == text
    assert tok.encode("hi") == [ids["<|im_start|>"], tok.vocab.token_to_id["hi"]]  # add_bos
    assert tok.eot_id == ids["<|im_end|>"] and tok.is_eog(ids["<|im_end|>"])
    assert tok.decode([ids["<|im_end|>"]], skip_special=True) == ""


def test_missing_and_malformed_metadata_errors_name_file_and_key(tmp_path):
    cases = [
        ({"tokenizer.ggml.model": "gpt2"}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": ["a"]}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.model": "wordpiece", "tokenizer.ggml.tokens": ["a"]},
         "supported: gpt2, llama"),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre",
          "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": ["a a"]}, "qwen2"),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]},
         "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [1, 2]},
         "must be an array of STRING"),
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"],
          "tokenizer.ggml.scores": [0.5]}, "tokenizer.ggml.scores"),
        ({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "a"]}, "twice"),
    ]
    for i, (meta, expected) in enumerate(cases):
        path = write_vocab_gguf(tmp_path / f"bad{i}.gguf", meta)
        with pytest.raises(ValueError) as err:
            Tokenizer.from_gguf(path)
        assert str(path) in str(err.value) and expected in str(err.value), str(err.value)


def test_truncated_or_foreign_files_raise_value_error(tmp_path):
    good = bpe_vocab_file(tmp_path, ["h i"])
    data = good.read_bytes()
    for name, blob in [("truncated.gguf", data[: len(data) // 2]), ("text.gguf", b"hello" * 9),
                       ("empty.gguf", b"")]:
        path = tmp_path / name
        path.write_bytes(blob)
        with pytest.raises(ValueError, match=str(path)):
            Tokenizer.from_gguf(path)
    with pytest.raises(ValueError, match="out of range"):
        Tokenizer.from_gguf(good).decode([10**6])


def staged_reference(exprs, text):
    """llama.cpp's splitting, written plainly: each regex splits every piece into its matches
    and the gaps between them, seeing one piece at a time."""
    pieces = [text]
    for expr in exprs:
        out = []
        for piece in pieces:
            pos = 0
            for match in regex.finditer(expr, piece):
                if match.start() > pos:
                    out.append(piece[pos:match.start()])
                out.append(match.group())
                pos = match.end()
            if pos < len(piece):
                out.append(piece[pos:])
        pieces = out
    return pieces


@pytest.mark.parametrize("regex_set", sorted(REGEXES))
def test_fast_splitting_paths_match_the_staged_regexes(regex_set, rng, seed):
    """The fused single regexes and the ASCII stdlib-re path against the plain staged split."""
    ascii_alphabet = "aZ 09'sSl\t\n\r\x0b.,!?$+<=>^~|`-_\x1c"
    unicode_alphabet = ascii_alphabet + "é漢٣\u00a0\u3000\u2028🙂\u0301"
    fast = Splitter(regex_set)
    for trial in range(150):
        # (DeepSeek's regexes read non-ASCII whitespace differently on purpose: next test)
        alphabet = ascii_alphabet if trial % 2 or "deepseek" in regex_set else unicode_alphabet
        text = random_text(rng, int(rng.integers(1, 30)), alphabet)
        assert fast.split(text) == staged_reference(REGEXES[regex_set], text), \
            f"seed={seed} set={regex_set} text={text!r} fused={regex_set in FUSED}"


def test_deepseek_cjk_range_does_not_take_non_ascii_whitespace():
    # llama.cpp's regexes see U+3000 as U+000B, so the CJK range U+0800-U+4E00 stops at it.
    assert Splitter("deepseek-coder").split("\u2192\u3000\u2192") == ["\u2192", "\u3000", "\u2192"]


def test_end_of_generation_tokens_found_by_text(tmp_path):
    extras = ["<|im_end|>", "</s>", "<|end|>", "<|return|>", "<|call|>", "<|channel|>"]
    # (without an eos id, llama.cpp's BPE default eos 11 = "," would end generation too)
    tok = Tokenizer.from_gguf(bpe_vocab_file(tmp_path, ["h i"], extras, [1] * len(extras),
                                             **{"tokenizer.ggml.eos_token_id": 258}))
    ids = {t: tok.vocab.token_to_id[t] for t in extras}
    assert tok.eos_id == ids["</s>"]
    assert tok.eot_id == ids["<|im_end|>"]
    assert tok.eog_ids == {ids["<|im_end|>"], ids["</s>"], ids["<|return|>"], ids["<|call|>"]}
    # normal-typed end tokens become control tokens: hidden with skip_special
    assert tok.decode([ids["<|im_end|>"]], skip_special=True) == ""
    # <|end|> is mid-answer in gpt-oss-like vocabs and, like <|channel|>, always split out
    for text in ("<|end|>", "<|channel|>"):
        assert tok.encode(f"hi{text}hi", add_special=False) == [256, ids[text], 256]


def test_own_metadata_parser_agrees_with_gguf_reader(tmp_path):
    from gguf import GGUFReader

    for path in (TINY / "tiny-gpt2-f32.gguf",
                 spm_vocab_file(tmp_path, ["▁", "▁h", "i"], [-1.0, -2.5, -3.0], False)):
        ours, theirs = load_vocab(path), load_vocab(GGUFReader(path))
        # the same file, whichever spelling (symlinks) each route keeps
        assert os.path.realpath(str(ours.path)) == os.path.realpath(str(theirs.path))
        for name in ("model", "pre", "tokens", "attrs", "token_to_id", "merges",
                     "special", "add_bos", "add_eos", "add_space_prefix", "eog_ids"):
            assert getattr(ours, name) == getattr(theirs, name), f"{path}: {name}"
        assert (ours.scores == theirs.scores).all()
