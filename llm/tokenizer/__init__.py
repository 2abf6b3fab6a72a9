"""Tokenizers of GGUF vocabularies (byte-level BPE and SPM), matching llama.cpp's token ids.

    from llm.tokenizer import Tokenizer
    tok = Tokenizer.from_gguf("model.gguf")
    ids = tok.encode("Hello", add_special=True, parse_special=False)
    text = tok.decode(ids)
"""
from .core import StreamDecoder, Tokenizer
from .vocab import TokenAttr, Vocab, load_vocab

__all__ = ["Tokenizer", "StreamDecoder", "TokenAttr", "Vocab", "load_vocab"]
