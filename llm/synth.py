"""Synthetic GGUF models of real shapes, for benchmarks without downloads.

Input: a shape name (llama-8b, qwen2-1.5b, qwen3-8b, smollm2-135m, and the mixtures of experts
qwen3-30b-a3b, gpt-oss-20b, gpt-oss-120b), a file type (Q4_K_M, Q5_K_M, Q4_0, Q4_1, Q8_0, Q6_K,
MXFP4) and an output path. Output: a GGUF file that both this runner and
llama.cpp load: real hyperparameters, a synthetic byte-level BPE vocabulary of the real size
(256 byte tokens, merged tokens with their merges, two control tokens), and random weights
written directly as valid blocks of each tensor's quantization layout (random quant bytes;
scales chosen so that every weight matrix has mean 0 and a trained model's spread, so
activations stay finite through every layer). No float weights are generated or quantized. The
Q4_K_M (and Q5_K_M) per-tensor mix follows llama.cpp's rules: output (or a tied token_embd)
Q6_K; attn_v and ffn_down Q6_K in the `use_more_bits` layers (first and last eighth, every third
in between), the base K-quant (Q4_K / Q5_K) elsewhere. Q4_0 / Q4_1 / Q6_K: every matrix in
that type, output Q6_K; Q8_0: every matrix and the output Q8_0 (as llama.cpp's Q8_0 files).
A K-quant matrix whose rows are not whole 256-element blocks falls back as llama.cpp's does
(Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). MXFP4 (MoE shapes only): experts MXFP4, other
matrices Q8_0. Norms and biases are F32 (qwen3: also the per-head attn_q_norm / attn_k_norm).
The MoE tensors and keys are `llm/synth_moe.py`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q, TokenType

from llm.models.archs import ARCH_SPECS
from llm.synth_moe import (MoeShape, attention_extras, expert_type, moe_layer_plan,
                           moe_metadata, random_mxfp4)

# llama_ftype values (general.file_type)
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18,
              "MXFP4": 38}
MIXES = {"Q4_K_M": Q.Q4_K, "Q5_K_M": Q.Q5_K}   # K-quant mixes: their base type
# llama.cpp's type for a K-quant matrix whose rows are not whole 256-element blocks
K_QUANT_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


@dataclass(frozen=True)
class Shape:
    arch: str
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    n_ctx: int
    rope_base: float
    eps: float
    tied: bool
    qkv_bias: bool
    pre: str
    qk_norm: bool = False     # qwen3 / gemma3: per-head RMSNorm weights of q and k
    head_dim: int = 0         # 0: n_embd // n_head
    moe: MoeShape | None = None   # a mixture-of-experts FFN (synth_moe.py)

    @property
    def hd(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


SHAPES = {
    "llama-8b": Shape("llama", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0, 1e-5, False,
                      False, "llama-bpe"),
    "llama-70b": Shape("llama", 8192, 28672, 80, 64, 8, 128256, 8192, 500000.0, 1e-5, False,
                       False, "llama-bpe"),
    "qwen2-1.5b": Shape("qwen2", 1536, 8960, 28, 12, 2, 151936, 32768, 1000000.0, 1e-6, True,
                        True, "qwen2"),
    "qwen3-8b": Shape("qwen3", 4096, 12288, 36, 32, 8, 151936, 40960, 1000000.0, 1e-6, False,
                      False, "qwen2", qk_norm=True),
    "smollm2-135m": Shape("llama", 576, 1536, 30, 9, 3, 49152, 8192, 100000.0, 1e-5, True,
                          False, "smollm"),
    "qwen3-30b-a3b": Shape("qwen3moe", 2048, 6144, 48, 32, 4, 151936, 40960, 1000000.0, 1e-6,
                           False, False, "qwen2", qk_norm=True, head_dim=128,
                           moe=MoeShape(128, 8, 768)),
    "gpt-oss-20b": Shape("gpt-oss", 2880, 2880, 24, 64, 8, 201088, 131072, 150000.0, 1e-5,
                         False, True, "gpt-4o", head_dim=64, moe=MoeShape(
                             32, 4, 2880, mxfp4_experts=True, sliding_window=128,
                             yarn_factor=32.0, yarn_orig_ctx=4096, biases=True)),
    "gpt-oss-120b": Shape("gpt-oss", 2880, 2880, 36, 64, 8, 201088, 131072, 150000.0, 1e-5,
                          False, True, "gpt-4o", head_dim=64, moe=MoeShape(
                              128, 4, 2880, mxfp4_experts=True, sliding_window=128,
                              yarn_factor=32.0, yarn_orig_ctx=4096, biases=True)),
}

WEIGHT_STD = 0.02    # the spread of a trained model's weights (and of common inits)
# rms of the integer factor each block scale d multiplies, for random quant bytes: Q4_0 (q - 8)
# 4.61; Q8_0 int8 73.9; Q4_1 (q - 7.5) 4.61 with m = -7.5 d; Q4_K sc (q - 7.5) with the mins
# equal to the scales and dmin = 7.5 d: 36.4 * 4.61; Q5_K the same with 5-bit q and dmin = 15.5 d:
# 36.4 * 9.23; Q6_K int8 scale x (q - 32): 73.9 x 18.5
# 36.4 * 9.23; Q6_K int8 scale x (q - 32): 73.9 x 18.5; Q5_0 (q - 16) and Q5_1 (q - 15.5,
# m = -15.5 d) 9.23
_UNIT_RMS = {Q.Q4_0: 4.61, Q.Q8_0: 73.9, Q.Q4_1: 4.61, Q.Q4_K: 168.0, Q.Q5_K: 336.0,
             Q.Q6_K: 1367.0, Q.Q5_0: 9.23, Q.Q5_1: 9.23}
_D_OFFSET = {Q.Q4_0: 0, Q.Q8_0: 0, Q.Q4_1: 0, Q.Q4_K: 0, Q.Q5_K: 0, Q.Q6_K: 208, Q.Q5_0: 0,
             Q.Q5_1: 0}


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or \
        (i_layer - n_layer // 8) % 3 == 2


def tensor_type(name: str, il: int, n_layer: int, file_type: str, cols: int = 256) -> Q:
    """The GGUF type of a weight matrix in a `file_type` file (llama.cpp's choices; Q8_0 where
    rows are not whole 256-element K-quant blocks)."""
    if name in ("output", "token_embd_tied"):    # llama.cpp keeps a Q8_0 file's output Q8_0
        return Q.Q6_K if cols % 256 == 0 and file_type != "Q8_0" else Q.Q8_0
    if file_type == "MXFP4":                     # the experts' type; other matrices Q8_0
        return Q.Q8_0
    if file_type not in MIXES:
        qtype = Q[file_type]
    elif name in ("attn_v", "ffn_down") and use_more_bits(il, n_layer):
        qtype = Q.Q6_K
    else:
        qtype = MIXES[file_type]
    return K_QUANT_FALLBACK.get(qtype, qtype) if cols % 256 else qtype


def random_blocks(rng: np.random.Generator, qtype: Q, rows: int, cols: int) -> np.ndarray:
    """uint8 (rows, row_bytes): random quant bytes whose values have mean 0 and a spread of
    about WEIGHT_STD, like a trained model's. (Random scales alone would give every K-quant and
    Q4_1 block a positive mean: activations then grow layer by layer to inf and NaN, and the
    data-dependent parts of a forward, softmax rescaling and the greedy token, stop being
    representative.)"""
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // elems
    blocks = np.frombuffer(rng.bytes(n_blocks * nbytes), np.uint8).reshape(n_blocks, nbytes)
    blocks = blocks.copy()
    d = WEIGHT_STD / _UNIT_RMS[qtype] * (0.75 + 0.5 * rng.random(n_blocks, np.float32))
    _put_f16(blocks, _D_OFFSET[qtype], d)
    if qtype in (Q.Q4_1, Q.Q5_1):           # m = -7.5 d (-15.5 d): quants centred on zero
        _put_f16(blocks, 2, (-7.5 if qtype == Q.Q4_1 else -15.5) * d)
    elif qtype in (Q.Q4_K, Q.Q5_K):         # every sub-block's min equal to its scale
        sc = blocks[:, 4:16]
        sc[:, 4:8] = sc[:, 0:4]             # low 6 bits of mins 0-3 = scales 0-3, and the top
        sc[:, 8:12] = (sc[:, 8:12] & 0x0F) * 0x11   # bits of 4-7 match; 4-7's nibbles equal
        # dmin = 7.5 d (Q5_K: 15.5 d): d sc q - dmin m = d sc (q - 7.5), the quants' middle
        _put_f16(blocks, 2, (7.5 if qtype == Q.Q4_K else 15.5) * d)
    return blocks.reshape(rows, cols // elems * nbytes)


def _put_f16(blocks: np.ndarray, offset: int, values: np.ndarray) -> None:
    blocks[:, offset:offset + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _byte_tokens() -> list[str]:
    """GPT-2's byte -> printable unicode map, in byte order."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def synthetic_vocab(n_vocab: int, seed: int = 0) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): bytes, then merged pairs, then <|bos|> and <|eos|>."""
    rng = np.random.default_rng(seed)
    tokens = _byte_tokens()
    seen, merges = set(tokens), []
    letters = tokens[65:91] + tokens[97:123]          # merged tokens start from letters
    target = n_vocab - 2
    while len(tokens) < target:
        pool = letters if len(tokens) < 2048 else tokens
        for a, b in zip(rng.choice(len(pool), 4096), rng.choice(len(letters), 4096)):
            new = pool[a] + letters[b]
            if new not in seen and len(tokens) < target:
                seen.add(new)
                tokens.append(new)
                merges.append(f"{pool[a]} {letters[b]}")
    types = [int(TokenType.NORMAL)] * len(tokens) + [int(TokenType.CONTROL)] * 2
    return tokens + ["<|bos|>", "<|eos|>"], types, merges


def _metadata(w: GGUFWriter, s: Shape, shape_name: str, file_type: str) -> None:
    a = s.arch
    w.add_name(f"synthetic {shape_name} {file_type}")
    w.add_uint32("general.file_type", FILE_TYPES[file_type])
    w.add_uint32(f"{a}.block_count", s.n_layer)
    w.add_uint32(f"{a}.context_length", s.n_ctx)
    w.add_uint32(f"{a}.embedding_length", s.n_embd)
    w.add_uint32(f"{a}.feed_forward_length", s.n_ff)
    w.add_uint32(f"{a}.attention.head_count", s.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", s.n_head_kv)
    w.add_float32(f"{a}.rope.freq_base", s.rope_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.eps)
    w.add_uint32(f"{a}.rope.dimension_count", s.hd)
    if s.head_dim:
        w.add_uint32(f"{a}.attention.key_length", s.hd)
        w.add_uint32(f"{a}.attention.value_length", s.hd)
    if s.moe is not None:
        moe_metadata(w, a, s.moe)
    w.add_uint32(f"{a}.vocab_size", s.n_vocab)
    tokens, types, merges = synthetic_vocab(s.n_vocab)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", s.pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", s.n_vocab - 2)
    w.add_uint32("tokenizer.ggml.eos_token_id", s.n_vocab - 1)
    w.add_bool("tokenizer.ggml.add_bos_token", False)


def tensor_plan(s: Shape, file_type: str) -> list[tuple[str, Q, tuple[int, ...]]]:
    """(name, type, numpy shape) of every tensor, in file order: (rows, cols) with rows 1 for
    a vector, (n_expert, rows, cols) for stacked experts."""
    q, kv, e = s.n_head * s.hd, s.n_head_kv * s.hd, s.n_embd
    embd_type = tensor_type("token_embd_tied" if s.tied else "token_embd", 0, s.n_layer,
                            file_type, e)
    plan = [("token_embd.weight", embd_type, (s.n_vocab, e)),
            ("output_norm.weight", Q.F32, (1, e))]
    if not s.tied:
        plan.append(("output.weight", tensor_type("output", 0, s.n_layer, file_type, e),
                     (s.n_vocab, e)))
    for il in range(s.n_layer):
        p = f"blk.{il}."

        def dense_type(name, cols, il=il):
            return tensor_type(name, il, s.n_layer, file_type, cols)

        def mat(name, rows, cols, p=p):
            return (p + name + ".weight", dense_type(name, cols), (rows, cols))
        plan += [(p + "attn_norm.weight", Q.F32, (1, e)), mat("attn_q", q, e),
                 mat("attn_k", kv, e), mat("attn_v", kv, e), mat("attn_output", e, q),
                 (p + ARCH_SPECS[s.arch].ffn_norm + ".weight", Q.F32, (1, e))]
        if s.moe is None:
            plan += [mat("ffn_gate", s.n_ff, e), mat("ffn_up", s.n_ff, e),
                     mat("ffn_down", e, s.n_ff)]
        else:
            plan += moe_layer_plan(s.moe, p, e, lambda name, cols, il=il: expert_type(
                s.moe, dense_type(name, cols, il), file_type))
        if s.qk_norm:
            plan += [(p + "attn_q_norm.weight", Q.F32, (1, s.hd)),
                     (p + "attn_k_norm.weight", Q.F32, (1, s.hd))]
        if s.qkv_bias:
            plan += [(p + "attn_q.bias", Q.F32, (1, q)), (p + "attn_k.bias", Q.F32, (1, kv)),
                     (p + "attn_v.bias", Q.F32, (1, kv))]
        if s.moe is not None:
            plan += attention_extras(s.moe, p, e, s.n_head)
    return plan


def _file_shape(qtype: Q, shape: tuple[int, ...]) -> tuple[tuple[int, ...], np.dtype]:
    """How GGUFWriter is told a tensor's shape: F32 values (a vector for rows 1), or the bytes
    of its blocks per row."""
    if qtype == Q.F32:
        return (shape[1],) if len(shape) == 2 and shape[0] == 1 else shape, np.dtype(np.float32)
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    return (*shape[:-1], shape[-1] // elems * nbytes), np.dtype(np.uint8)


def _tensor_bytes(rng, qtype: Q, shape: tuple[int, ...], name: str) -> np.ndarray:
    count = int(np.prod(shape))
    if qtype == Q.F32:
        base = 1.0 if name.endswith("norm.weight") else 0.0
        return (base + 0.02 * rng.standard_normal(count)).astype(np.float32)
    if qtype == Q.MXFP4:
        return random_mxfp4(rng, count, WEIGHT_STD)
    return random_blocks(rng, qtype, count // shape[-1], shape[-1])


def write_synthetic(shape_name: str, file_type: str, path, seed: int = 0) -> Path:
    """Write the synthetic model; returns its path. Streams tensors (peak memory ~ one tensor)."""
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r} (expected one of {', '.join(SHAPES)})")
    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown type {file_type!r} (expected one of {', '.join(FILE_TYPES)})")
    s, path = SHAPES[shape_name], Path(path)
    if file_type == "MXFP4" and s.moe is None:
        raise ValueError(f"{shape_name} has no experts: MXFP4 files are for the MoE shapes")
    plan = tensor_plan(s, file_type)
    w = GGUFWriter(path, s.arch)
    _metadata(w, s, shape_name, file_type)
    for name, qtype, shape in plan:
        file_shape, dtype = _file_shape(qtype, shape)
        size = int(np.prod(file_shape)) * dtype.itemsize
        w.add_tensor_info(name, file_shape, dtype, size,
                          raw_dtype=None if qtype == Q.F32 else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, qtype, shape in plan:
        w.write_tensor_data(_tensor_bytes(rng, qtype, shape, name))
    w.close()
    return path
