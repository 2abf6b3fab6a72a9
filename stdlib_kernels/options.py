"""Performance switches of the kernels' host code, in one frozen object.

Input: the environment (read once, by `env_options()`), or values a caller or a test sets.
Output: a `KernelOptions`, passed to the routing rule (`quant.matmul.choose_matmul_path`) and the
runner's weight matmuls; nothing else reads these variables.

    PYKERNEL_GEMV_TOKENS=n       gemv_tokens (at most GEMV_MAX_TOKENS)
    PYKERNEL_INT8_GEMM_TOKENS=n  int8_gemm_tokens
    PYKERNEL_MMA_GEMV=0          mma_gemv off (keep the int8 GEMM there, for comparisons)
    PYKERNEL_DECODE_MMA=0        decode_mma off (decode attention on the SIMT kernel)
    PYKERNEL_DECODE_BULK=1       decode_bulk on (split decode attention by bulk copies)
    PYKERNEL_PREFILL_WGMMA=1     prefill_wgmma on (prefill attention on wgmma, sm_90)
    PYKERNEL_HOPPER_QUANT_GEMM=1 hopper_quant_gemm on (GEMMs on gemm_hopper_quant, sm_90)
    PYKERNEL_DEQUANT_F16_GEMM=0/1  dequant_f16_gemm off / forced on (unset: on for sm_90 GPUs)
    PYKERNEL_DEQUANT_F16_TOKENS=n  dequant_f16_tokens
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Mapping

GEMV_MAX_TOKENS = 8   # tokens one GEMV launch takes (gemv_kernels.MAX_BATCH: its registers)


@dataclass(frozen=True)
class KernelOptions:
    # up to this many tokens the matmuls run the GEMV (MAX_BATCH tokens per launch) instead of
    # a GEMM (with its short-prompt tiles the GEMM is faster from 9 tokens: each GEMV launch
    # streams all the weights again; benchmarks/short_prompts.py)
    gemv_tokens: int = GEMV_MAX_TOKENS
    # ... except the int8 GEMM's formats (formats.GEMM_Q8), which take it from this many.
    # H100, llama-8B Q4_K_M's matmuls (benchmarks/RESULTS.md "Batched decode GEMVs"): at 8
    # tokens gate|up 64.6 us on the GEMV, 46.2 on the GEMM; a batched decode step of 5
    # sequences 5.68 ms with the GEMV, 5.78 with the GEMM; 6: 7.06 -> 6.10
    int8_gemm_tokens: int = 6
    # the tensor-core GEMV (gemv_mma.py) for its formats at 5-16 tokens, instead of the DP4A
    # GEMV or the int8 GEMM
    mma_gemv: bool = True
    # F32 weights keep the f32 GEMV at any token count, 8 tokens per launch (the f16 GEMM
    # would cost them ~1e-3 of precision): the runner's choice
    f32_weights_gemv: bool = False
    # whether tokens leave the GEMV for the int8 kernels' thresholds depends on the format
    # alone, not on Q8_1 activations being at hand (which then only pick int8 or f16 GEMM):
    # the runner's choice (it decides before it has the activations)
    route_by_format: bool = False
    # f16 caches decode on tensor cores (attention/decode_mma.py) where they can
    decode_mma: bool = True
    # split decode launches of f16 caches (head_dim <= 128, sm_90+) on decode_bulk: an option,
    # not the default (benchmarks/RESULTS.md "Decode by bulk copies")
    decode_bulk: bool = False
    # tensor-core prefill attention of f16 caches (head_dim 64 / 128) on prefill_wgmma
    # (FlashAttention-3's structure: TMA producer, wgmma consumers; sm_90 and the CPU target)
    # instead of prefill_flash's mma.sync: an option, off until measured on the GPU
    # (benchmarks/prefill_wgmma.py)
    prefill_wgmma: bool = False
    # the matmuls that leave the GEMVs (from int8_gemm_tokens) run gemm_hopper_quant (wgmma on
    # weights dequantized to f16 in shared memory, f16 activations) on sm_90 where it serves
    # the format and K (quant.matmul.hopper_quant_applies): an option for A/B runs, off until
    # measured against the int8 / f16 GEMMs
    hopper_quant_gemm: bool = False
    # matmuls of at least dequant_f16_tokens tokens that leave the GEMVs dequantize the whole
    # weight matrix to f16 into a scratch buffer (quant.dequant_f16, bandwidth-bound) and run
    # gemm_hopper's f16 wgmma on it (quant.matmul.matmul_dequant_f16_into) where it serves
    # the format (dequant_f16_applies). None (the default): on for CUDA GPUs of sm_90, where
    # it measured 1.46-1.73x today's prompt rates (benchmarks/RESULTS.md, session 35), off on
    # the CPU target (its wgmma emulation is slow, and its tests pin the int8 route); True
    # forces it wherever it applies (the CPU target included), False keeps the int8 route.
    # Below ~256 tokens the dequantization (a fixed cost per matrix, about a 100-token GEMM's)
    # outweighs the faster GEMM, so shorter prompts keep the int8 route
    dequant_f16_gemm: bool | None = None
    dequant_f16_tokens: int = 256

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **fields) -> KernelOptions:
        """The defaults overridden by the PYKERNEL_* variables (module docstring) and `fields`."""
        tokens = int(environ.get("PYKERNEL_GEMV_TOKENS", GEMV_MAX_TOKENS))
        values = dict(gemv_tokens=min(GEMV_MAX_TOKENS, tokens),
                      int8_gemm_tokens=int(environ.get("PYKERNEL_INT8_GEMM_TOKENS",
                                                       cls.int8_gemm_tokens)),
                      mma_gemv=environ.get("PYKERNEL_MMA_GEMV", "1") not in ("", "0"),
                      decode_mma=environ.get("PYKERNEL_DECODE_MMA", "1") != "0",
                      decode_bulk=environ.get("PYKERNEL_DECODE_BULK", "0") not in ("", "0"),
                      prefill_wgmma=environ.get("PYKERNEL_PREFILL_WGMMA", "0")
                      not in ("", "0"),
                      hopper_quant_gemm=environ.get("PYKERNEL_HOPPER_QUANT_GEMM", "0")
                      not in ("", "0"),
                      dequant_f16_gemm=_tristate(environ.get("PYKERNEL_DEQUANT_F16_GEMM")),
                      dequant_f16_tokens=int(environ.get("PYKERNEL_DEQUANT_F16_TOKENS",
                                                         cls.dequant_f16_tokens)))
        return cls(**{**values, **fields})


def _tristate(value: str | None) -> bool | None:
    """An unset or empty variable leaves the default (None: the option decides by device)."""
    return None if value in (None, "") else value != "0"


@functools.lru_cache(maxsize=None)
def env_options() -> KernelOptions:
    """KernelOptions.from_env() of this process's environment, read once."""
    return KernelOptions.from_env()


__all__ = ["KernelOptions", "env_options", "GEMV_MAX_TOKENS"]
