"""The one table of GGUF/ggml tensor formats shared by the numpy references and the GPU kernels.

Input: a ggml type name ("Q4_K", "F16", ...). Output: its `QuantFormat`: elements and bytes per
block, the `gguf.GGMLQuantizationType` member and its integer id, the block layout (little-endian,
f16 = IEEE half; blocks are stored back to back along a row) and the kernel families that serve
it. Every per-kernel type table derives from `FORMATS` (`serving(family)`), and kernels branch on
the ids below by name (`FMT == Q4_K`), never on a literal. Adding a format: docs/quant.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as _T

QK_K = 256  # super-block length of the K-quants

# ggml type ids (gguf.GGMLQuantizationType) as plain ints: the compile-time `FMT` / `QTYPE`
# Consts of the kernels, compared by these names
F32, F16, BF16 = int(_T.F32), int(_T.F16), int(_T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1 = int(_T.Q4_0), int(_T.Q4_1), int(_T.Q5_0), int(_T.Q5_1)
Q8_0, Q8_1 = int(_T.Q8_0), int(_T.Q8_1)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = int(_T.Q2_K), int(_T.Q3_K), int(_T.Q4_K), int(_T.Q5_K), int(_T.Q6_K)
Q1_0 = int(_T.Q1_0)
MXFP4 = int(_T.MXFP4)

# Kernel families (what `QuantFormat.kernels` lists; the module that serves each):
DEQUANT = "dequant"        # dequant_kernels.py: device.dequantize, the runner's row gathers
QUANTIZE = "quantize"      # quantize_kernels.py, quantize_kquant_kernels.py: device.quantize
GEMV = "gemv"              # gemv_kernels.py with f32 activations (decode8.py); gemm.py (f16 mma)
GEMV_Q8 = "gemv_q8"        # gemv_kernels.py with Q8_1 activations: DP4A (dot_q8*.py), gemv_pair
GEMV_BULK = "gemv_bulk"    # gemv_bulk.py: rows by bulk copies (sm_90+)
GEMV_MMA = "gemv_mma"      # gemv_mma.py: int8 tensor-core GEMV, 5-16 tokens
GEMM_Q8 = "gemm_q8"        # gemm_q8.py: int8 tensor-core GEMM (the int8 prefill path)
GEMM_Q8_K = "gemm_q8_k"    # gemm_q8_k.py: its pipelined super-block kernel (K % 256 == 0)
GEMM_MOE = "gemm_moe"      # moe/grouped_gemm.py: the experts' int8 GEMM over tokens grouped by
                           # expert (GEMM_Q8_K's kernel parts, or gemm_q8.py's per 32-block)
EMBED = "embed"            # quant_blocks.py: one element at a time (embedding rows)
FAMILIES = (DEQUANT, QUANTIZE, GEMV, GEMV_Q8, GEMV_BULK, GEMV_MMA, GEMM_Q8, GEMM_Q8_K, GEMM_MOE,
            EMBED)


@dataclass(frozen=True)
class QuantFormat:
    name: str
    block_elems: int
    block_bytes: int
    ggml_type: _T
    layout: str                      # the block's fields in order
    kernels: frozenset[str] = frozenset()   # FAMILIES that serve it

    @property
    def id(self) -> int:
        """The ggml type id: the `FMT` / `QTYPE` Const of the kernels."""
        return int(self.ggml_type)

    @property
    def superblock_bytes(self) -> int:
        """Bytes of one row per QK_K values (a K step of the super-block kernels; 8 blocks of
        the 32-value formats)."""
        return self.block_bytes * QK_K // self.block_elems


_CODEC = frozenset({DEQUANT, QUANTIZE, GEMV})
_LEGACY = _CODEC | {GEMV_Q8, GEMM_Q8, GEMM_Q8_K, GEMM_MOE}     # the 32-value formats' common families
_KQUANT = _CODEC | {GEMV_Q8, GEMV_BULK, GEMM_Q8, GEMM_Q8_K, GEMM_MOE}   # Q4_K, Q5_K, Q6_K's common ones


def _fmt(name: str, block_elems: int, block_bytes: int, layout: str, kernels) -> QuantFormat:
    return QuantFormat(name, block_elems, block_bytes, _T[name], layout, frozenset(kernels))


FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    _fmt("F32", 1, 4, "f32", _CODEC),
    _fmt("F16", 1, 2, "f16", _CODEC),
    _fmt("BF16", 1, 2, "top 16 bits of the f32, rounded to nearest even", _CODEC),
    _fmt("Q4_0", 32, 18, "d:f16 | qs:16 B; x[j] = low nibble of qs[j], x[j+16] = high; (q-8)*d",
         _LEGACY | {GEMV_BULK, EMBED}),
    _fmt("Q4_1", 32, 20, "d:f16 | m:f16 | qs:16 B; q*d + m", _LEGACY | {GEMV_BULK, EMBED}),
    _fmt("Q5_0", 32, 22, "d:f16 | qh:u32 (5th bit of x[j] = bit j) | qs:16 B; (q-16)*d", _LEGACY),
    _fmt("Q5_1", 32, 24, "d:f16 | m:f16 | qh:u32 | qs:16 B; q*d + m", _LEGACY),
    _fmt("Q8_0", 32, 34, "d:f16 | qs:i8[32]; q*d", _LEGACY | {GEMV_BULK, EMBED}),
    # Activation format. s = d*sum(q) as ggml's CPU stores it (ours, q8_1.py says why;
    # llama.cpp's CUDA quantize_q8_1 stores sum(x)). gguf-py's size table still says 40 B.
    _fmt("Q8_1", 32, 36, "d:f16 | s:f16 | qs:i8[32]", ()),
    _fmt("Q2_K", QK_K, 84, "scales:16 B (low nibble scale, high nibble min) | qs:64 B (2 bits) "
         "| d:f16 | dmin:f16", _CODEC | {GEMV_Q8}),
    _fmt("Q3_K", QK_K, 110, "hmask:32 B (high bit, 0 means -4) | qs:64 B (2 bits) | scales:12 B "
         "(16 x 6 bits, -32) | d:f16", _CODEC | {GEMV_Q8, GEMV_BULK}),
    _fmt("Q4_K", QK_K, 144, "d:f16 | dmin:f16 | scales:12 B (8 x 6-bit scale + 8 x 6-bit min) | "
         "qs:128 B (4 bits)", _KQUANT | {GEMV_MMA, EMBED}),
    _fmt("Q5_K", QK_K, 176, "d:f16 | dmin:f16 | scales:12 B | qh:32 B (5th bits) | qs:128 B "
         "(low 4 bits)", _KQUANT),
    _fmt("Q6_K", QK_K, 210, "ql:128 B (low 4 bits) | qh:64 B (high 2 bits) | scales:i8[16] | "
         "d:f16; (q-32)*d*scale", _KQUANT | {GEMV_MMA, EMBED}),
    _fmt("Q1_0", 128, 18, "d:f16 | qs:16 B, bit j (byte j/8, bit j%8) set means +d, clear -d",
         _CODEC | {GEMV_Q8}),
    # No device quantizer (QUANTIZE): the published files come quantized; reference.py has
    # ggml's. Dense prefill takes the f16 GEMM (decode8 tiles); the MoE experts' grouped GEMM
    # reads the doubled e2m1 values as exact int8 (gemm_q8.weight_word).
    _fmt("MXFP4", 32, 17, "e:u8 (e8m0) | qs:16 B (e2m1 nibbles: x[j] low of qs[j], x[j+16] "
         "high); kvalues[q] * 2^(e-128), kvalues = e2m1 doubled {0,1,2,3,4,6,8,12,-0,..,-12}",
         {DEQUANT, GEMV, GEMV_Q8, GEMM_MOE}),
)}


def serving(family: str) -> tuple[QuantFormat, ...]:
    """The formats a kernel family serves, in FORMATS order."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; known: {', '.join(FAMILIES)}")
    return tuple(f for f in FORMATS.values() if family in f.kernels)


def type_ids(family: str) -> dict[str, int]:
    """{type name: ggml id} of the formats a kernel family serves."""
    return {f.name: f.id for f in serving(family)}


def get_format(name: str) -> QuantFormat:
    """The format called `name` (a ggml type name); ValueError listing the known ones if absent."""
    try:
        return FORMATS[name]
    except KeyError:
        known = ", ".join(FORMATS)
        raise ValueError(f"unknown quantization type {name!r}; known types: {known}") from None


def check_byte_rows(raw, fmt: QuantFormat, n: int, per_row: int) -> None:
    """ValueError unless `raw` (a numpy or device array) is uint8 holding whole rows of
    `per_row` bytes (rows of n elements): the one check for both codecs' block input."""
    if raw.dtype != "uint8":
        raise ValueError(f"{fmt.name}: expected uint8 block bytes, got dtype {raw.dtype}")
    if raw.ndim == 2 and raw.shape[1] != per_row:
        raise ValueError(f"{fmt.name}: a row of {n} elements takes {per_row} bytes, got rows "
                         f"of {raw.shape[1]} bytes")
    if raw.ndim not in (1, 2) or raw.size == 0 or raw.size % per_row:
        raise ValueError(f"{fmt.name}: expected a whole number of {per_row}-byte rows ({n} "
                         f"elements each), got {raw.size} bytes in shape {raw.shape}")
