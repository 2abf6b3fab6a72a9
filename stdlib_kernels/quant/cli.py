"""`pykernel quantize IN.gguf OUT.gguf --type Q6_K|Q4_K_M|Q8_0|...`: re-quantize a GGUF model.

Input: a GGUF file (F32/F16/BF16 weights, or quantized ones, which are dequantized first).
Output: a GGUF file with the same metadata (general.file_type updated) and tensor order, whose
2-D weight matrices are re-quantized on the current device (the GPU when there is one, else the
CPU: the numpy reference codecs there, which beat the CPU target's interpreter-like speed).

Which tensors change, following llama.cpp's llama_tensor_get_type (our own code):
- only tensors named `*.weight` with 2 or more dimensions; norms, biases, position embeddings
  (`position_embd`) and MoE routers (`ffn_gate_inp`) keep their type;
- output.weight (or token_embd.weight when the model ties it as the output) becomes Q6_K unless
  the target is Q8_0, F16, BF16 or F32;
- _M mixes (Q4_K_M, Q5_K_M): attn_v and ffn_down get Q6_K on "more bits" layers
  (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2), attn_qkv gets Q5_K (Q4_K_M) / Q6_K (Q5_K_M);
- a row length that is not a multiple of the type's block falls back as llama.cpp does
  (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0 as we lack IQ4_NL), and a tensor
  that fits no 32-element block either stays F16.
"""
from __future__ import annotations

import re
import sys

from .formats import get_format

PLAIN_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
               "Q1_0", "F16", "BF16", "F32")
MIXES = {"Q4_K_M": ("Q4_K", "Q5_K"), "Q5_K_M": ("Q5_K", "Q6_K")}  # base, attn_qkv type
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}
_LAYER = re.compile(r"^blk\.(\d+)\.")
_KEEP_TYPES = ("Q8_0", "F16", "BF16", "F32")  # targets whose output.weight is not raised to Q6_K


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's rule for the layers of an _M mix that get the higher type."""
    return (layer < n_layers // 8 or layer >= 7 * n_layers // 8
            or (layer - n_layers // 8) % 3 == 2)


def is_quantizable(name: str, n_dims: int) -> bool:
    return (name.endswith(".weight") and n_dims >= 2 and "_norm" not in name
            and "position_embd" not in name and "ffn_gate_inp" not in name)


def choose_type(name: str, target: str, n_layers: int, has_output: bool) -> str:
    """The ggml type tensor `name` gets under `target` (a plain type or an _M mix)."""
    base, qkv_type = MIXES.get(target, (target, target))
    is_output = name == "output.weight" or (not has_output and name == "token_embd.weight")
    if is_output:
        return target if target in _KEEP_TYPES else "Q6_K"
    layer = _LAYER.match(name)
    if target in MIXES and layer:
        i = int(layer.group(1))
        if (".attn_v." in name or ".ffn_down." in name) and use_more_bits(i, n_layers):
            return "Q6_K"
        if ".attn_qkv." in name:
            return qkv_type
    return base


def fit_to_row(type_name: str, n: int) -> str:
    """type_name, or its fallback when rows of n elements are not whole blocks of it."""
    if n % get_format(type_name).block_elems == 0:
        return type_name
    fallback = _FALLBACK.get(type_name, "F16")
    return fallback if n % get_format(fallback).block_elems == 0 else "F16"


def register(subparsers) -> None:
    p = subparsers.add_parser("quantize", help="re-quantize a GGUF model's weight matrices",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("input", help="source GGUF file")
    p.add_argument("output", help="GGUF file to write")
    p.add_argument("--type", required=True, choices=PLAIN_TYPES + tuple(MIXES),
                   help="target type, or an _M mix as llama-quantize names them")
    p.add_argument("--backend", choices=("auto", "device", "numpy"), default="auto",
                   help="device kernels, the numpy reference, or auto: device on a GPU, "
                        "numpy otherwise (default)")
    p.set_defaults(func=cmd_quantize)


def cmd_quantize(args) -> int:
    from .quantize_file import quantize_file  # heavy imports only when the command runs
    try:
        quantize_file(args.input, args.output, args.type, args.backend)
    except (OSError, ValueError) as err:
        where = "" if args.input in str(err) else f"{args.input}: "
        print(f"pykernel quantize: error: {where}{err}", file=sys.stderr)
        return 1
    return 0

