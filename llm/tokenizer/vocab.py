"""GGUF tokenizer metadata -> Vocab, with llama.cpp's defaults and special-token rules.

Input: a GGUF path or an open gguf.GGUFReader (vocab-only files work: no tensor is read).
Output: a Vocab holding token texts, scores, per-token attributes, BPE merge ranks, the special
ids (bos, eos, eot, unk, ...), the add_bos/add_eos/add_space_prefix flags and the set of
end-of-generation ids. Missing or malformed keys raise ValueError naming the file and key.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field

import numpy as np
from gguf import GGUFReader, GGUFValueType

from .gguf_meta import MetaValue, read_metadata
from .pretokenize import PRE_TOKENIZERS, PreTokenizer, supported_pre_tokenizers

SUPPORTED_MODELS = ("gpt2", "llama")


class TokenAttr(enum.IntFlag):
    """llama.cpp's token attributes (bit values as in llama.h)."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


# GGUF tokenizer.ggml.token_type values -> attributes (1 NORMAL .. 6 BYTE; others undefined).
# Stored as plain ints: IntFlag arithmetic is ~10x slower and vocabularies have 262k tokens.
_TYPE_TO_ATTR = {1: int(TokenAttr.NORMAL), 2: int(TokenAttr.UNKNOWN), 3: int(TokenAttr.CONTROL),
                 4: int(TokenAttr.USER_DEFINED), 5: int(TokenAttr.UNUSED), 6: int(TokenAttr.BYTE)}

# Texts llama.cpp recognizes as end-of-turn / fill-in-the-middle tokens when no id names them
# (in this priority order where a vocab holds several); each also becomes a control token.
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
             "<end_of_utterance>")
EOM_TEXTS = ("<|eom_id|>",)
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Texts that end generation whatever their id (llama.cpp's special_eog_ids by text).
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
             "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
             "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
# gpt-oss chat markers that llama.cpp always renders (and splits out) as user-defined tokens.
ALWAYS_RENDERED_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# Default special ids per tokenizer model before the metadata overrides them.
_DEFAULT_IDS = {"llama": {"bos": 1, "eos": 2, "unk": 0}, "gpt2": {"bos": 11, "eos": 11}}


@dataclass
class Vocab:
    path: str
    model: str                      # tokenizer.ggml.model: "gpt2" (BPE) or "llama" (SPM)
    pre: str                        # tokenizer.ggml.pre ("default" when absent)
    tokens: list[str]
    scores: np.ndarray              # float32 per token (0 when absent)
    attrs: list[int]                # TokenAttr bits per token
    token_to_id: dict[str, int]
    merges: dict[tuple[str, str], int] = field(default_factory=dict)
    pre_tokenizer: PreTokenizer | None = None
    special: dict[str, int | None] = field(default_factory=dict)  # bos, eos, eot, unk, ...
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    eog_ids: set[int] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.tokens)


class _Meta:
    """Typed access to a GGUF file's key/value metadata, with errors naming file and key."""

    def __init__(self, source: str | os.PathLike | GGUFReader):
        self.path, self.fields = read_metadata(source)

    def error(self, key: str, what: str) -> ValueError:
        return ValueError(f"{self.path}: tokenizer metadata key '{key}' {what}")

    def scalar(self, key: str, kind: type, default=None):
        entry = self.fields.get(key)
        if entry is None:
            return default
        is_string = entry.type == GGUFValueType.STRING
        if (kind is str) != is_string or entry.type == GGUFValueType.ARRAY:
            expected = {str: "a string", int: "an integer", bool: "a boolean"}[kind]
            raise self.error(key, f"must be {expected}, found {_type_name(entry)}")
        return kind(entry.value)

    def array(self, key: str, element_types: tuple, required: bool = False):
        """The array's elements (list of str for strings, numpy array otherwise) or None."""
        entry = self.fields.get(key)
        if entry is None:
            if required:
                raise self.error(key, "is missing (this file has no tokenizer vocabulary)")
            return None
        if entry.type != GGUFValueType.ARRAY or entry.element_type not in element_types:
            expected = " or ".join(t.name for t in element_types)
            raise self.error(key, f"must be an array of {expected}, found {_type_name(entry)}")
        return entry.value


def _type_name(entry: MetaValue) -> str:
    if entry.type == GGUFValueType.ARRAY and entry.element_type is not None:
        return f"ARRAY of {entry.element_type.name}"
    return entry.type.name


def load_vocab(source: str | os.PathLike | GGUFReader) -> Vocab:
    meta = _Meta(source)
    model = meta.scalar("tokenizer.ggml.model", str)
    if model is None:
        raise meta.error("tokenizer.ggml.model", "is missing")
    if model not in SUPPORTED_MODELS:
        raise meta.error("tokenizer.ggml.model", f"is '{model}'; supported: "
                         f"{', '.join(SUPPORTED_MODELS)} (gpt2 = byte-level BPE, llama = SPM)")
    tokens = meta.array("tokenizer.ggml.tokens", (GGUFValueType.STRING,), required=True)
    n = len(tokens)
    vocab = Vocab(path=meta.path, model=model, pre="default", tokens=tokens,
                  scores=_per_token(meta, "tokenizer.ggml.scores",
                                    (GGUFValueType.FLOAT32, GGUFValueType.INT32), n, 0.0)
                  .astype(np.float32),
                  attrs=_token_attrs(meta, n), token_to_id=_token_ids(meta, tokens))
    if model == "gpt2":
        _load_bpe_settings(meta, vocab)
    else:
        vocab.add_bos, vocab.add_space_prefix = True, True
    vocab.add_space_prefix = meta.scalar("tokenizer.ggml.add_space_prefix", bool,
                                         vocab.add_space_prefix)
    _load_special_ids(meta, vocab)
    _mark_special_texts(vocab)
    _set_strip_attrs(meta, vocab)
    return vocab


def _per_token(meta: _Meta, key: str, types: tuple, n: int, default: float) -> np.ndarray:
    values = meta.array(key, types)
    if values is None:
        return np.full(n, default)
    if len(values) < n:
        raise meta.error(key, f"has {len(values)} entries for {n} tokens")
    return values[:n]


def _token_attrs(meta: _Meta, n: int) -> list[int]:
    types = _per_token(meta, "tokenizer.ggml.token_type", (GGUFValueType.INT32,), n, 1)
    return [_TYPE_TO_ATTR.get(t, 0) for t in types.tolist()]


def _token_ids(meta: _Meta, tokens: list[str]) -> dict[str, int]:
    ids = {}
    for i, text in enumerate(tokens):
        if not text:
            # llama.cpp renames empty tokens so that every text stays unique.
            text = tokens[i] = f"[EMPTY_{i}]"
        if text in ids:
            raise meta.error("tokenizer.ggml.tokens",
                             f"holds the text {text!r} twice (ids {ids[text]} and {i})")
        ids[text] = i
    return ids


def _load_bpe_settings(meta: _Meta, vocab: Vocab) -> None:
    pre = meta.scalar("tokenizer.ggml.pre", str) or "default"
    if pre not in PRE_TOKENIZERS:
        raise meta.error("tokenizer.ggml.pre", f"is '{pre}', an unknown pre-tokenizer; "
                         f"supported: {', '.join(supported_pre_tokenizers())}")
    vocab.pre = pre
    vocab.pre_tokenizer = PRE_TOKENIZERS[pre]
    vocab.add_bos = vocab.pre_tokenizer.add_bos
    merges = meta.array("tokenizer.ggml.merges", (GGUFValueType.STRING,))
    if merges is None:
        raise meta.error("tokenizer.ggml.merges", "is missing (a gpt2/BPE vocab needs merges)")
    for rank, merge in enumerate(merges):
        # The separator is the first space after the first character ("Ġ Ġ" is a valid merge).
        cut = merge.find(" ", 1)
        pair = (merge[:cut], merge[cut + 1:]) if cut >= 0 else ("", "")
        vocab.merges.setdefault(pair, rank)


def _load_special_ids(meta: _Meta, vocab: Vocab) -> None:
    n = len(vocab)
    special = {name: None for name in ("bos", "eos", "eot", "eom", "unk", "sep", "pad")}
    special.update({name: None for name in FIM_TEXTS})
    special.update(_DEFAULT_IDS[vocab.model])
    if vocab.pre_tokenizer is not None and vocab.pre_tokenizer.no_bos:
        special["bos"] = None
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "eot": "eot_token_id",
            "eom": "eom_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
            "pad": "padding_token_id"}
    for name in special:
        if special[name] is not None and special[name] >= n:
            special[name] = None
        value = meta.scalar(f"tokenizer.ggml.{keys.get(name, name + '_token_id')}", int)
        if value is not None and 0 <= value < n:
            special[name] = value
    vocab.special = special
    vocab.add_bos = meta.scalar("tokenizer.ggml.add_bos_token", bool, vocab.add_bos)
    vocab.add_eos = meta.scalar("tokenizer.ggml.add_eos_token", bool, vocab.add_eos)


def _mark_special_texts(vocab: Vocab) -> None:
    """llama.cpp finds eot/eom/fim and end-of-generation tokens by text and makes them control."""
    lookup = vocab.token_to_id
    for name, texts in [("eot", EOT_TEXTS), ("eom", EOM_TEXTS), *FIM_TEXTS.items()]:
        if vocab.special[name] is not None:
            continue
        found = next((lookup[t] for t in texts if t in lookup), None)
        if found is not None:
            vocab.special[name] = found
            vocab.attrs[found] |= int(TokenAttr.CONTROL)
    eog = {lookup[t] for t in EOG_TEXTS if t in lookup}
    for token_id in eog:
        vocab.attrs[token_id] |= int(TokenAttr.CONTROL)
    for text in ALWAYS_RENDERED_TEXTS:
        if text in lookup:
            vocab.attrs[lookup[text]] = int(TokenAttr.USER_DEFINED)
    for name in ("fim_pad", "fim_rep", "fim_sep", "eos", "eot", "eom"):
        if vocab.special[name] is not None:
            eog.add(vocab.special[name])
    _drop_false_eog(vocab, eog)
    vocab.eog_ids = eog


def _drop_false_eog(vocab: Vocab, eog: set[int]) -> None:
    """llama.cpp's two exceptions: gpt-oss-like vocabs (<|call|> or <|calls|>, with <|return|>
    or <|flush|>) use <|end|> mid-answer; Gemma-4/PLaMo-like ones have an ordinary </s>."""
    texts = {vocab.tokens[i]: i for i in eog}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        vocab.attrs[texts["<|end|>"]] = int(TokenAttr.USER_DEFINED)
    if "</s>" in texts and texts.keys() & {"<|tool_response>", "<|plamo:eos|>"}:
        eog.discard(texts["</s>"])
        vocab.attrs[texts["</s>"]] = int(TokenAttr.NORMAL)


def _set_strip_attrs(meta: _Meta, vocab: Vocab) -> None:
    """The few per-model whitespace-stripping rules llama.cpp hard-codes (GGUF has no field)."""
    name = (meta.scalar("general.name", str) or "").lower()
    if vocab.pre in ("jina-v2-de", "jina-v2-es", "jina-v2-code") and "<mask>" in vocab.token_to_id:
        vocab.attrs[vocab.token_to_id["<mask>"]] |= int(TokenAttr.LSTRIP)
    elif "phi-3" in name or "phi3" in name:
        special_mask = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
        rstrip = int(TokenAttr.RSTRIP)
        for i, attr in enumerate(vocab.attrs):
            if attr & special_mask:
                vocab.attrs[i] = attr | rstrip
        if "</s>" in vocab.token_to_id:
            vocab.attrs[vocab.token_to_id["</s>"]] |= int(TokenAttr.RSTRIP)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            if text in vocab.token_to_id:
                vocab.attrs[vocab.token_to_id[text]] &= ~int(TokenAttr.RSTRIP)
