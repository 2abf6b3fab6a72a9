"""GGUF weights on the device in their own block format, and the matmul that reads them.

Input: `TensorInfo`s (raw GGUF bytes, ggml type, numpy-order shape). Output: `DeviceMatrix`
(row groups of one GGUF type each, uploaded once as uint8 (rows, row_bytes), no f32 expansion)
and `matmul(x, w, out)` = x @ W.T written into a preallocated `out`, through stdlib_kernels'
quantized GEMV for up to 8 tokens (DP4A on Q8_1 activations for the formats of the GEMV_Q8
family, float32 activations for the others) and their tensor-core GEMV / GEMMs above, as
stdlib's choose_matmul_path decides with the `KernelOptions` the caller passes (the kernels
backend's RunnerOptions.kernel_options: the routing switches plus the runner's two choices).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

import pykernel as pk
from llm.gguf_file import TensorInfo
from stdlib_kernels import glu_fused
from stdlib_kernels.quant.gemm import gemm_into
from stdlib_kernels.quant.gemm_q8 import gemm_q8_into
from stdlib_kernels.quant.gemv import Q8_1_TYPES, gemv_f32_into, gemv_q8_into, weight_words
from stdlib_kernels.quant.gemv_kernels import MAX_BATCH
from stdlib_kernels.quant.gemv_mma import gemv_mma_into
from stdlib_kernels.quant.gemv_pair import GemvPart, gemv_q8_pair_into, pair_eligible
from stdlib_kernels.quant.matmul import (GEMM_DEQUANT_F16, GEMM_F16, GEMM_HOPPER_Q, GEMV,
                                         GEMV_MMA, choose_matmul_path, hopper_quant_into,
                                         matmul_dequant_f16_into)
from stdlib_kernels.quant.q8_1 import q8_1_bytes, quantize_q8_1_into
from stdlib_kernels.options import KernelOptions

from llm.backends import kernels_extra as X

# up to this many tokens the GEMM adds the residual in its store (no add launch: short prompts
# are bound by the host's launches); above, a separate add is as fast or faster (H200, 8B, 512
# tokens: the fused add cost 6-15 us per GEMM in scattered reads, an add_into launch 11 us;
# benchmarks/RESULTS.md "Prefill with fewer launches")
GEMM_RESIDUAL_TOKENS = 64


@dataclass
class RowGroup:
    """Consecutive output rows stored in one GGUF type: raw (rows, row_bytes) uint8."""
    type_name: str
    rows: int
    row_off: int
    raw: pk.Array
    words: pk.Array = field(repr=False)


@dataclass
class DeviceMatrix:
    n_in: int
    n_out: int
    groups: list[RowGroup]
    part_names: tuple[str, ...]
    part_rows: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(g.raw.nbytes for g in self.groups)

    def is_glu_pair(self) -> bool:
        """gate|up of one type: the GEMV can apply SwiGLU/GeGLU in its epilogue."""
        names = self.part_names
        return (len(names) == 2 and names[0].endswith("ffn_gate.weight")
                and names[1].endswith("ffn_up.weight") and len(self.groups) == 1)


class WeightStore:
    """Uploads tensors once (a tied output projection shares the embedding's bytes) and counts
    the device bytes they take. `upload` is the device's allocation + copy."""

    def __init__(self, upload: Callable[[np.ndarray, str], pk.Array]):
        self.upload = upload
        self.by_name: dict[str, pk.Array] = {}
        self.nbytes = 0
        # values of the largest row group of a layer's matrices (blk.*) and of any matrix:
        # the size of the f16 weight scratch of KernelOptions.dequant_f16_gemm (f16_values)
        self.largest_layer_group = 0
        self.largest_group = 0

    def raw(self, t: TensorInfo) -> pk.Array:
        if t.name not in self.by_name:
            rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1
            host = np.asarray(t.data).reshape(rows, -1)
            self.by_name[t.name] = self.upload(host, t.name)
            self.nbytes += host.nbytes
        return self.by_name[t.name]

    def f16_values(self) -> int:
        """Values of the f16 weight scratch: the largest layer row group (an 8B's gate|up,
        2 x 14336 x 4096: 235 MB of f16), so each layer matmul dequantizes in one pass; the
        output projection (128256 x 4096: 1.05 GB), only multiplied by many tokens in
        perplexity runs, then goes in chunks (matmul_dequant_f16_into). Without layer
        matrices: the largest of all."""
        return self.largest_layer_group or self.largest_group

    def matrix(self, parts: Sequence[TensorInfo]) -> DeviceMatrix:
        n_in = parts[0].shape[-1]
        groups: list[list[TensorInfo]] = []
        for t in parts:
            if t.shape[-1] != n_in:
                raise ValueError(f"tensor {t.name!r}: {t.shape[-1]} columns, expected {n_in} "
                                 f"like {parts[0].name!r}")
            if groups and groups[-1][0].ggml_type == t.ggml_type:
                groups[-1].append(t)
            else:
                groups.append([t])
        out, row = [], 0
        for group in groups:
            type_name = group[0].ggml_type.name
            if len(group) == 1:
                raw = self.raw(group[0])
            else:  # stacked rows of one type: one buffer, so one GEMV covers them
                host = np.concatenate([np.asarray(t.data).reshape(t.shape[0], -1) for t in group])
                raw = self.upload(host, "+".join(t.name for t in group))
                self.nbytes += host.nbytes
            words, rows = weight_words(raw, type_name, n_in)
            out.append(RowGroup(type_name, rows, row, raw, words))
            row += rows
            self.largest_group = max(self.largest_group, rows * n_in)
            if all(t.name.startswith("blk.") for t in parts):
                self.largest_layer_group = max(self.largest_layer_group, rows * n_in)
        return DeviceMatrix(n_in, row, out, tuple(t.name for t in parts),
                            tuple(t.shape[0] for t in parts))


def uses_q8_1(type_name: str, n_in: int, activations: str) -> bool:
    return activations == "q8_1" and type_name in Q8_1_TYPES and n_in % 32 == 0


def needs_q8_1(w: DeviceMatrix, activations: str) -> bool:
    """Whether any row group of w reads Q8_1 activations."""
    return any(uses_q8_1(g.type_name, w.n_in, activations) for g in w.groups)


def all_q8_1(w: DeviceMatrix, activations: str) -> bool:
    """Whether every row group of w reads Q8_1 activations (none reads the f32 ones)."""
    return all(uses_q8_1(g.type_name, w.n_in, activations) for g in w.groups)


def quantize_activations(x, xq) -> None:
    """x (n, k) f32 -> xq (n, q8_1_bytes(k)) uint8."""
    quantize_q8_1_into(x, xq)


def q8_buffer_shape(n: int, k: int) -> tuple[int, int]:
    return (n, q8_1_bytes(k))


def gemv_rows(g: RowGroup, n_in: int, x, xq, y, mode=None, w2: RowGroup | None = None,
              res=None) -> None:
    """y (n, g.rows) = x @ W_g.T (epilogue `mode`), n <= 8 tokens in one GEMV launch."""
    n = x.shape[0]
    w2w = None if w2 is None else w2.words
    if xq is not None:
        gemv_q8_into(g.words, g.type_name, xq, y, g.rows, n_in, n, w2=w2w, res=res, mode=mode)
    else:
        gemv_f32_into(g.words, g.type_name, x, y, g.rows, n_in, n, w2=w2w, res=res, mode=mode)


def gemv_launch(g: RowGroup, n: int, options: KernelOptions) -> bool:
    """n tokens of group g run one GEMV launch (at most MAX_BATCH tokens, no GEMM)."""
    return n <= options.gemv_tokens and not uses_gemm(g, n, options)


def uses_gemm(g: RowGroup, n: int, options: KernelOptions) -> bool:
    """n tokens of group g leave the DP4A GEMV for a GEMM (stdlib's choose_matmul_path; with
    the runner's route_by_format, by the format alone, so whether Q8_1 activations come does
    not matter here)."""
    return choose_matmul_path(g.type_name, n, True, options) != GEMV


def group_matmul(g: RowGroup, n_in: int, x, xq, y, options: KernelOptions, ldy=None,
                 col0: int = 0, res=None, scratch: Callable | None = None,
                 weights16: Callable | None = None) -> None:
    """y (n, g.rows) = x @ W_g.T on stdlib's choice (choose_matmul_path with options): the GEMV
    (8 tokens per launch), the tensor-core GEMV or the int8 tensor-core GEMM on the Q8_1
    activations xq, the f16 tensor-core GEMM, or (options.hopper_quant_gemm) the wgmma GEMM
    on f16 activations, its workspaces from scratch, or (options.dequant_f16_gemm) gemm_hopper
    on the weights dequantized into weights16() (the model's f16 weight scratch; None: one
    allocated for this call). ldy / col0 / res (GEMM only): the result
    goes to columns col0.. of y (n, ldy), plus res (stdlib's gemm.output_args), with no copy or
    add launch (the wgmma GEMM: one placing launch)."""
    n = x.shape[0]
    path = choose_matmul_path(g.type_name, n, xq is not None and n_in % 32 == 0, options,
                              k=n_in)
    if path == GEMV:
        assert ldy is None and res is None, "strided output / residual: GEMM paths only"
        for t0 in range(0, n, MAX_BATCH):
            t1 = min(n, t0 + MAX_BATCH)
            gemv_rows(g, n_in, x[t0:t1], None if xq is None else xq[t0:t1], y[t0:t1])
    elif path == GEMM_F16:
        gemm_into(g.words, g.type_name, x, y, g.rows, n_in, n, ldy=ldy, col0=col0, res=res)
    elif path == GEMM_HOPPER_Q:
        hopper_quant_into(g.words, g.type_name, x, y, g.rows, n_in, n, ldy=ldy, col0=col0,
                          res=res, scratch=scratch)
    elif path == GEMM_DEQUANT_F16:
        buffer = weights16() if weights16 is not None else pk.empty((g.rows * n_in,),
                                                                     np.float16)
        matmul_dequant_f16_into(g.words, g.type_name, x, y, g.rows, n_in, n, buffer, ldy=ldy,
                                col0=col0, res=res, scratch=scratch)
    else:
        launch = gemv_mma_into if path == GEMV_MMA else gemm_q8_into
        launch(g.words, g.type_name, xq, y, g.rows, n_in, n, ldy=ldy, col0=col0, res=res)


def matmul(x, w: DeviceMatrix, out, xq, scratch: Callable, options: KernelOptions, res=None,
           gemv=True, weights16: Callable | None = None) -> None:
    """out (n, w.n_out) = x @ W.T (+ res). With the GEMV, res is added in its store (one launch
    per row group) when n == 1, or W has one row group and its n tokens run one GEMV launch
    (gemv_launch); `out` may then be `res`. Where every group takes the GEMM (uses_gemm)
    the GEMMs write each group's columns of `out` (no copy launches) and, up to
    GEMM_RESIDUAL_TOKENS, add res in their store.
    xq: x as Q8_1, or None.
    scratch(shape) -> a preallocated f32 array. weights16() -> the f16 weight scratch
    (options.dequant_f16_gemm). options: the routing switches. gemv=False:
    kernels_extra's one-thread-per-output matmul (the fast choice on the CPU target), same
    activations."""
    n = x.shape[0]
    if not gemv:
        for g in w.groups:
            X.matmul(g.raw, g.type_name, x, xq if xq is not None and _q8(g, w) else None, out,
                     g.rows, g.row_off)
    elif len(w.groups) == 1 and gemv_launch(w.groups[0], n, options):
        g = w.groups[0]
        gemv_rows(g, w.n_in, x, xq if xq is not None and _q8(g, w) else None, out,
                  None if res is None else "residual", res=res)
        return
    elif all(uses_gemm(g, n, options) for g in w.groups):   # each group writes its columns
        fused = res if n <= GEMM_RESIDUAL_TOKENS else None
        for g in w.groups:
            group_matmul(g, w.n_in, x, xq if xq is not None and _q8(g, w) else None, out,
                         options, ldy=w.n_out, col0=g.row_off, res=fused, scratch=scratch,
                         weights16=weights16)
        if res is not None and fused is None:
            X.add(out, res)
        return
    elif n == 1 and _pair_gemv(w, out, xq, res):
        return
    else:
        for g in w.groups:
            gq = xq if xq is not None and _q8(g, w) else None
            if len(w.groups) == 1:
                group_matmul(g, w.n_in, x, gq, out, options, scratch=scratch,
                             weights16=weights16)
            elif n == 1:  # one row: the group's columns are contiguous
                cols = slice(g.row_off, g.row_off + g.rows)
                flat = out.reshape(-1)[cols].reshape(1, g.rows)
                flat_res = None if res is None else res.reshape(-1)[cols].reshape(1, g.rows)
                gemv_rows(g, w.n_in, x, gq, flat, None if res is None else "residual",
                          res=flat_res)
            else:
                tmp = scratch((n, g.rows))
                group_matmul(g, w.n_in, x, gq, tmp, options, scratch=scratch,
                             weights16=weights16)
                X.columns(tmp, out, n, g.rows, 0, g.row_off)
    if res is not None and not (gemv and n == 1):
        X.add(out, res)


def glu(x, w: DeviceMatrix, out, xq, act: str, scratch: Callable,
        options: KernelOptions, weights16: Callable | None = None) -> None:
    """out (n, n_ff) = act(x @ W_gate.T) * (x @ W_up.T): one GEMV with the activation in its
    epilogue up to 8 tokens; above, the GEMM of gate|up then one activation launch."""
    g = w.groups[0]
    half = w.part_rows[0]
    gq = xq if xq is not None and _q8(g, w) else None
    if not gemv_launch(g, x.shape[0], options):   # the GEMM (or F32's GEMV, 8-token launches)
        both = scratch((x.shape[0], 2 * half))
        group_matmul(g, w.n_in, x, gq, both, options, scratch=scratch, weights16=weights16)
        glu_fused(both, "silu" if act == "swiglu" else "gelu_tanh", out=out)
        return
    per_row = g.raw.shape[1] * g.raw.itemsize // g.words.itemsize
    gate = RowGroup(g.type_name, half, 0, g.raw, g.words[:half * per_row])
    up = RowGroup(g.type_name, half, half, g.raw, g.words[half * per_row:])
    gemv_rows(gate, w.n_in, x, gq, out, act, w2=up)


def _pair_gemv(w: DeviceMatrix, out, xq, res) -> bool:
    """One token, two row groups of different types (q|k Q4_K + v Q6_K of Q4_K_M files), both
    on the register DP4A GEMV: one launch for both (stdlib's gemv_pair); False if not."""
    if len(w.groups) != 2 or xq is None or not all(_q8(g, w) for g in w.groups):
        return False
    a, b = w.groups
    if not pair_eligible(a.type_name, a.rows, b.type_name, b.rows, w.n_in, xq):
        return False
    flat, flat_res = out.reshape(-1), None if res is None else res.reshape(-1)
    parts = [GemvPart(g.words, g.type_name, g.rows, flat[g.row_off:g.row_off + g.rows],
                      None if res is None else flat_res[g.row_off:g.row_off + g.rows])
             for g in w.groups]
    gemv_q8_pair_into(parts, xq, w.n_in, None if res is None else "residual")
    return True


def _q8(g: RowGroup, w: DeviceMatrix) -> bool:
    return uses_q8_1(g.type_name, w.n_in, "q8_1")


class DeviceTable:
    """An embedding table: raw GGUF rows (vocab, row_bytes) uint8 of `type_name`."""

    def __init__(self, raw, type_name: str, n: int):
        self.raw, self.type_name, self.n = raw, type_name, n


def f32_vector(t: TensorInfo) -> np.ndarray:
    """A GGUF vector (norm weights, biases) as f32 values, any type dequantized on the host."""
    from llm.backends.dequant import dequantize
    return dequantize(t.data, t.ggml_type, t.shape).reshape(-1).astype(np.float32)
