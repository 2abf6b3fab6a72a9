"""Quantized matmul entry point: GEMV for decode batches, tensor-core GEMM for prefill, and the
one rule that chooses between them (for quant.matmul and the runner alike).

    choose_matmul_path(type, tokens, q8_1, options) -> GEMV | GEMV_MMA | GEMM_Q8 | GEMM_F16
    matmul(raw, "Q4_K", x) -> y     raw uint8 (rows, row_bytes); x float32 (n,) or (tokens, n);
                                    y float32 (rows,) or (tokens, rows) on the current device
    matmul_into(w, type, x, y, rows, n, tokens, xq=None)   preallocated (runner): no allocation

Up to options.gemv_tokens (8) tokens use the DP4A GEMV (Q8_1 activations where the type has a
DP4A kernel, else f32 activations), except that the int8 GEMM's types (formats.GEMM_Q8) take it
from options.int8_gemm_tokens (6; the GEMV decodes each weight block once per token, so its
time grows with the tokens; the GEMM's 64 x 8 tiles are faster from 6). Q4_K and Q6_K take the
tensor-core GEMV (gemv_mma.py, mma_gemv_applies: 5-16 tokens, no shared-memory stages) instead
of either. More tokens use a tensor-core GEMM: the int8 one (gemm_q8.py, Q8_1 activations;
Q4_K / Q6_K through gemm_q8_k.py) for the GEMM_Q8 types, where it measured faster than the f16
one (benchmarks/RESULTS.md), when Q8_1 activations are at hand; else the f16 GEMM (gemm.py).

With options.hopper_quant_gemm (default off, not yet measured), every matmul of at least
options.int8_gemm_tokens tokens that would leave the DP4A GEMV runs gemm_hopper_quant instead
(GEMM_HOPPER_Q: wgmma on the weights dequantized to f16 in shared memory) where
hopper_quant_applies: sm_90 (or the CPU target, which emulates sm_90a), a format of
gemm_hopper_quant.SERVED and K it takes. Its activations are x rounded to f16 (one convert
launch), its result f32; a column offset or a residual goes through a second launch
(place_columns).

With options.dequant_f16_gemm (default: on for sm_90 GPUs, off on the CPU target), matmuls of at least
options.dequant_f16_tokens tokens that leave the GEMVs take GEMM_DEQUANT_F16 where
dequant_f16_applies (sm_90 or the CPU target, a format of dequant_f16.DEQUANT_F16_TYPES):
matmul_dequant_f16_into dequantizes the weights to f16 into a caller's scratch buffer (one
bandwidth-bound pass, ~2.6-3 bytes moved per weight) and multiplies on gemm_hopper's f16 wgmma;
it wins over the int8 route where M is large enough that the pass is a small part (prompts).
"""

from __future__ import annotations

import numpy as np

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, i64

from .. import _launch as L
from ..attention.decode_plan import cuda_sm
from ..elementwise import convert
from ..gemm_hopper import gemm_hopper
from ..gemm_hopper_quant import SERVED as HOPPER_SERVED
from ..gemm_hopper_quant import SLAB as HOPPER_SLAB
from ..gemm_hopper_quant import gemm_hopper_quant, slab_bytes
from ..options import GEMV_MAX_TOKENS, KernelOptions, env_options
from .formats import GEMM_Q8 as _INT8_FAMILY
from .dequant_f16 import DEQUANT_F16_TYPES, check_f16_rows, dequantize_f16_into
from .formats import get_format, type_ids
from .gemm import gemm, gemm_into, output_args
from .gemm_q8 import gemm_q8, gemm_q8_into
from .gemv import Q8_1_TYPES, gemv, gemv_f32_into, gemv_q8_into, weight_words
from .gemv_mma import gemv_mma, gemv_mma_into, mma_gemv_applies
from .q8_1 import quantize_q8_1_into

# the paths choose_matmul_path returns
GEMV, GEMV_MMA, GEMM_Q8, GEMM_F16 = "gemv", "gemv_mma", "gemm_q8", "gemm_f16"
GEMM_HOPPER_Q = "gemm_hopper_quant"
GEMM_DEQUANT_F16 = "gemm_dequant_f16"
INT8_GEMM_TOKENS = KernelOptions.int8_gemm_tokens   # the default (options.py has the numbers)
# int8 GEMM faster than f16 on the H200 at m=4096 n=512 k=14336 (benchmarks/RESULTS.md:
# Q4_0 701 vs 1064 us, Q8_0 517 vs 1093 us, Q4_K 442 vs 1132 us, Q6_K 494 vs 1069 us)
INT8_PREFILL_TYPES = frozenset(type_ids(_INT8_FAMILY))


def hopper_quant_applies(type_name: str, k: int | None, device=None) -> bool:
    """gemm_hopper_quant takes `type_name` rows of k values on `device` (None: the current
    one): a served format, k a whole number of 256-value slabs whose bytes are whole 16 bytes
    per row (TMA's row pitch), and sm_90 (wgmma; sm_90a) or the CPU target (emulated)."""
    if type_name not in HOPPER_SERVED or k is None or k <= 0 or k % HOPPER_SLAB \
            or (k // HOPPER_SLAB * slab_bytes(type_name)) % 16:
        return False
    device = device or pk.current_device()
    return device.kind == "cpu" or cuda_sm(device) == 90


def dequant_f16_applies(type_name: str, k: int | None, device=None) -> bool:
    """matmul_dequant_f16_into takes `type_name` rows of k values on `device` (None: the
    current one): a quantized format dequant_f16 decodes, k whole blocks (and a multiple of
    8: gemm_hopper's TMA row pitch), and sm_90 (wgmma) or the CPU target (emulated)."""
    if type_name not in DEQUANT_F16_TYPES or k is None:
        return False
    try:
        check_f16_rows(type_name, k)
    except ValueError:
        return False
    device = device or pk.current_device()
    return device.kind == "cpu" or cuda_sm(device) == 90


def _dequant_f16_on(options: KernelOptions, device) -> bool:
    """options.dequant_f16_gemm, its default (None) meaning: on CUDA GPUs only."""
    if options.dequant_f16_gemm is not None:
        return options.dequant_f16_gemm
    return (device or pk.current_device()).kind == "cuda"


def choose_matmul_path(type_name: str, tokens: int, q8_1: bool,
                       options: KernelOptions | None = None, *, k: int | None = None,
                       device=None) -> str:
    """The kernel for `tokens` rows of x against `type_name` weights (module docstring).
    q8_1: Q8_1 activations at hand that the int8 kernels can read (rows of a multiple of 32
    values). options None: env_options(); the runner's adds f32_weights_gemv and
    route_by_format (options.py). k (row length) and device (None: the current one) matter
    only with options.hopper_quant_gemm / dequant_f16_gemm; without k those routes are not
    taken (dequant_f16_gemm first where both are on)."""
    o = options or env_options()
    path = _default_path(type_name, tokens, q8_1, o)
    if path != GEMV and tokens >= o.dequant_f16_tokens and _dequant_f16_on(o, device) \
            and dequant_f16_applies(type_name, k, device):
        return GEMM_DEQUANT_F16
    if o.hopper_quant_gemm and path != GEMV and tokens >= o.int8_gemm_tokens \
            and hopper_quant_applies(type_name, k, device):
        return GEMM_HOPPER_Q
    return path


def _default_path(type_name: str, tokens: int, q8_1: bool, o: KernelOptions) -> str:
    int8_type = _INT8_FAMILY in get_format(type_name).kernels
    int8 = int8_type and q8_1
    mma = mma_gemv_applies(type_name, tokens, o)
    if type_name == "F32" and o.f32_weights_gemv:
        return GEMV
    early = int8_type if o.route_by_format else int8    # leaves the GEMV before gemv_tokens
    if tokens <= o.gemv_tokens and not (early and (tokens >= o.int8_gemm_tokens or mma)):
        return GEMV
    if int8:
        return GEMV_MMA if mma else GEMM_Q8
    return GEMM_F16


@pk.kernel
def place_columns(src: Ptr[f32, "ro"], y: Ptr[f32], res: Ptr[f32], width: i32, ldy: i32,
                  col0: i32, HAS_RES: Const[bool]):
    # grid (tokens): y[t, col0 + c] = src[t, c] (+ res[t, col0 + c]) for c < width; each
    # element's res is read by the thread that writes it, so y may alias res
    t = i64(pk.block_idx.x)
    for c in range(pk.thread_idx.x, width, pk.block_dim.x):
        at = t * i64(ldy) + i64(col0 + c)
        v = src[t * i64(width) + i64(c)]
        if HAS_RES:
            v += res[at]
        y[at] = v


def hopper_quant_into(w, type_name: str, x, y, rows: int, K: int, tokens: int, stream=None,
                      *, ldy=None, col0: int = 0, res=None, scratch=None) -> None:
    """y (tokens, rows) = f16(x) (tokens, K) @ W^T on gemm_hopper_quant, w from
    gemv.weight_words. ldy / col0 / res as gemm.gemm_into's (C into columns col0.. of y
    (tokens, ldy), plus res; then through place_columns). scratch(shape) -> an f32 array
    (the runner's arena, so graphs keep their buffers); None: allocated here."""
    ldy, res_or_y, has_res = output_args(y, rows, tokens, ldy, col0, res, "hopper_quant")
    take = scratch or (lambda shape: pk.empty(shape, np.float32))
    x16 = take((tokens, K // 2)).view_as((tokens, K), np.float16)
    convert(x.view_as((tokens, K), np.float32), np.float16, out=x16, stream=stream)
    raw = w.view_as((rows, K // HOPPER_SLAB * slab_bytes(type_name)), np.uint8)
    if ldy == rows and not has_res:          # C is all of y: written in place
        gemm_hopper_quant(x16, raw, type_name, out=y.view_as((tokens, rows), np.float32),
                          stream=stream)
        return
    tmp = gemm_hopper_quant(x16, raw, type_name, out=take((tokens, rows)), stream=stream)
    L.launch(place_columns, tokens, L.threads_for(rows, 256),
             (tmp, y, res_or_y, rows, ldy, col0), (("HAS_RES", has_res),), stream)


def _f16_activations(x, tokens: int, K: int, take, stream):
    """x (tokens, K) as f16: x itself if f16, else converted into a buffer from take."""
    if np.dtype(x.dtype) == np.float16:
        return x.view_as((tokens, K), np.float16)
    if np.dtype(x.dtype) != np.float32:
        raise ValueError(f"matmul_dequant_f16: activations must be float32 or float16, got "
                         f"{x.dtype}")
    x16 = take((tokens, -(-K // 2))).view_as((tokens, K), np.float16)
    convert(x.view_as((tokens, K), np.float32), np.float16, out=x16, stream=stream)
    return x16


def matmul_dequant_f16_into(w, type_name: str, x, y, rows: int, K: int, tokens: int, weights16,
                            stream=None, *, ldy=None, col0: int = 0, res=None,
                            scratch=None) -> None:
    """y (tokens, rows) = f16(x) (tokens, K) @ f16(W)^T on gemm_hopper: the weights (w from
    gemv.weight_words) are first dequantized to f16 into weights16, a caller's f16 device
    buffer reused by every matmul (dequant_f16; at least K values). Where W has more values
    than weights16 holds, it goes in chunks of len(weights16) // K rows, each through a
    temporary C and place_columns. x: f32 (converted here, one launch) or f16. ldy / col0 /
    res as gemm.gemm_into's. scratch(shape) -> an f32 array for the f16 activations and the
    chunks' C (the runner's arena); None: allocated here. No host synchronisation, so it
    runs inside graph captures when the buffers come from the caller."""
    ldy, res_or_y, has_res = output_args(y, rows, tokens, ldy, col0, res, "dequant_f16")
    chunk = min(rows, weights16.size // K)
    if chunk <= 0:
        raise ValueError(f"matmul_dequant_f16 {type_name}: the f16 weight buffer holds "
                         f"{weights16.size} values, less than one row of {K}")
    take = scratch or (lambda shape: pk.empty(shape, np.float32))
    x16 = _f16_activations(x, tokens, K, take, stream)
    fmt = get_format(type_name)
    row_words = K // fmt.block_elems * fmt.block_bytes // w.itemsize
    if chunk == rows and ldy == rows and not has_res:       # C is all of y: written in place
        dequantize_f16_into(w, type_name, weights16, rows, K, stream)
        gemm_hopper(x16, weights16.view_as((rows, K), np.float16),
                    out=y.view_as((tokens, rows), np.float32), stream=stream)
        return
    tmp = take((tokens, chunk))
    for r0 in range(0, rows, chunk):
        n_rows = min(chunk, rows - r0)
        dequantize_f16_into(w[r0 * row_words:], type_name, weights16, n_rows, K, stream)
        c = tmp.view_as((tokens, n_rows), np.float32)
        gemm_hopper(x16, weights16.view_as((n_rows, K), np.float16), out=c, stream=stream)
        L.launch(place_columns, tokens, L.threads_for(n_rows, 256),
                 (c, y, res_or_y, n_rows, ldy, col0 + r0), (("HAS_RES", has_res),), stream)


def prefill_path(type_name: str, n: int, xq=None) -> str:
    """"int8" or "f16": the GEMM that matmul / matmul_into use for more than 8 tokens."""
    return "int8" if type_name in INT8_PREFILL_TYPES and n % 32 == 0 and xq is not None \
        else "f16"


def uses_gemm(type_name: str, n: int, tokens: int, xq=None,
              options: KernelOptions | None = None) -> bool:
    """Whether `tokens` rows of x (n values) leave the DP4A GEMV (choose_matmul_path)."""
    return choose_matmul_path(type_name, tokens, xq is not None and n % 32 == 0,
                              options) != GEMV


def matmul(raw, type_name: str, x, options: KernelOptions | None = None):
    """y = x @ dequantize(raw)^T on the kernel choose_matmul_path picks (Q8_1 at hand)."""
    tokens = 1 if np.ndim(x) == 1 or getattr(x, "ndim", 1) == 1 else x.shape[0]
    path = choose_matmul_path(type_name, tokens, x.shape[-1] % 32 == 0, options, k=x.shape[-1])
    if path == GEMV:
        return gemv(raw, type_name, x)
    if path in (GEMM_HOPPER_Q, GEMM_DEQUANT_F16):
        x32 = x if isinstance(x, pk.Array) else pk.to_device(np.ascontiguousarray(x, np.float32))
        K = x32.shape[-1]
        words, rows = weight_words(raw, type_name, K)
        y = pk.empty((tokens, rows), np.float32)
        if path == GEMM_HOPPER_Q:
            hopper_quant_into(words, type_name, x32, y, rows, K, tokens)
        else:
            matmul_dequant_f16_into(words, type_name, x32, y, rows, K, tokens,
                                    pk.empty((rows * K,), np.float16))
        return y
    return {GEMV_MMA: gemv_mma, GEMM_Q8: gemm_q8, GEMM_F16: gemm}[path](raw, type_name, x)


def matmul_into(w, type_name: str, x, y, rows: int, n: int, tokens: int, xq=None,
                stream=None, options: KernelOptions | None = None, weights16=None) -> None:
    """y (tokens, rows) = x (tokens, n) @ W^T with w from gemv.weight_words. xq: a Q8_1
    workspace (tokens, n//32*36 bytes) for the DP4A GEMV and the int8 GEMM; quantized here.
    weights16: the f16 weight buffer of GEMM_DEQUANT_F16 (None: allocated here, rows x n)."""
    path = choose_matmul_path(type_name, tokens, xq is not None and n % 32 == 0, options, k=n)
    if path == GEMV:
        if type_name in Q8_1_TYPES and xq is not None:
            quantize_q8_1_into(x, xq, stream=stream)
            gemv_q8_into(w, type_name, xq, y, rows, n, tokens, stream=stream)
        else:
            gemv_f32_into(w, type_name, x, y, rows, n, tokens, stream=stream)
    elif path == GEMM_F16:
        gemm_into(w, type_name, x, y, rows, n, tokens, stream=stream)
    elif path == GEMM_HOPPER_Q:
        hopper_quant_into(w, type_name, x, y, rows, n, tokens, stream=stream)
    elif path == GEMM_DEQUANT_F16:
        if weights16 is None:
            weights16 = pk.empty((rows * n,), np.float16)
        matmul_dequant_f16_into(w, type_name, x, y, rows, n, tokens, weights16, stream=stream)
    else:
        quantize_q8_1_into(x, xq, stream=stream)
        launch = gemv_mma_into if path == GEMV_MMA else gemm_q8_into
        launch(w, type_name, xq, y, rows, n, tokens, stream=stream)


__all__ = ["matmul", "matmul_into", "choose_matmul_path", "prefill_path", "uses_gemm",
           "hopper_quant_applies", "hopper_quant_into", "place_columns",
           "dequant_f16_applies", "matmul_dequant_f16_into",
           "GEMV", "GEMV_MMA", "GEMM_Q8", "GEMM_F16", "GEMM_HOPPER_Q", "GEMM_DEQUANT_F16",
           "GEMV_MAX_TOKENS", "INT8_GEMM_TOKENS",
           "INT8_PREFILL_TYPES"]
