"""The CPU reference backend: `Backend` ops in float32 numpy.

Input: GGUF tensors, dequantized once at load to float32 (out_features, in_features) arrays, and
activations as float32 ndarrays. Output: float32 ndarrays. Matmuls go to BLAS (x @ w.T, a GEMV at
decode); the KV cache is one (n_head_kv, rows, head_dim) array per layer, rows growing up to
n_ctx as positions are written, so a decode step reads contiguous rows per head.
"""
from __future__ import annotations

import math
import os
import time
from typing import Sequence

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from llm.backends import numpy_moe
from llm.backends.act_quant import activation_kind, round_trip
from llm.options import RunnerOptions
from llm.backends.base import KV_CACHE_TYPES, Backend, KVCache
from llm.backends.blas_threads import ThreadChooser, set_threads
from llm.backends.dequant import dequantize
from llm.config import RopeParams
from llm.gguf_file import TensorInfo

GELU_COEF_A = 0.044715
# up to this many rows a matmul is one BLAS GEMV per row: OpenBLAS's GEMM with 2-4 rows read
# the weights ~4x slower than its GEMV (49152 x 576 f32 on this 2-core machine: 2 rows 16.7 ms
# as a GEMM, 6.5 ms as two GEMVs; 4 rows 14.5 / 11.7; 8 rows 14.7 / 24.2)
GEMV_ROWS = 4
SQRT_2_OVER_PI = 0.7978845608028654


def kv_round_trip(x: np.ndarray, kv_type: str) -> np.ndarray:
    """x (..., head_dim) float32 as a cache of `kv_type` stores it: f16 rounding, or ggml's Q8_0
    (gguf-py's quantizer, bit-exact with ggml's) and back to f16, the values GPU attention
    reads (llama.cpp's CUDA flash attention, and the kernels backend's prefill, convert a Q8_0
    cache to f16); the cache itself stays float32."""
    if kv_type == "q8_0":
        q8 = gguf_quants.quantize(np.ascontiguousarray(x, np.float32), GGMLQuantizationType.Q8_0)
        x = gguf_quants.dequantize(q8, GGMLQuantizationType.Q8_0).reshape(x.shape)
    if kv_type in ("f16", "q8_0"):
        return x.astype(np.float16).astype(np.float32)
    return x


class NumpyKVCache(KVCache):
    """Per layer K and V arrays (n_head_kv, rows, head_dim), rows growing on demand up to
    n_ctx (reserve): a cache preallocated whole had numpy's transparent huge pages (asked
    for on arrays of 4 MB or more) commit each head's 2 MB page of every layer at the first
    token: a 8192-token SmolLM2 cache (360 MiB) was zeroed under the first prompt, 0.4 s of
    its 0.55 s on a 2-core machine. Grown by doubling, the cache commits at most about twice
    the positions written; its arrays get huge pages again once they pass 4 MB (long
    contexts, where they pay: 4 KB pages read a 2048-token context's keys 8% slower)."""
    FIRST_ROWS = 256

    def __init__(self, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v, kv_type: str = "f32"):
        self.n_layer, self.n_ctx, self.n_head_kv = n_layer, n_ctx, n_head_kv
        self.head_dim, self.head_dim_v = head_dim, head_dim_v
        self.kv_type = kv_type   # the values stored are rounded as this type would hold them
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self._grow(min(n_ctx, self.FIRST_ROWS))

    @property
    def rows(self) -> int:
        """Positions the arrays hold now (reserve grows them)."""
        return self.k[0].shape[1] if self.k else 0

    @property
    def nbytes(self) -> int:
        """The cache's size at its full n_ctx."""
        return self.n_layer * self.n_head_kv * self.n_ctx * (self.head_dim + self.head_dim_v) * 4

    def reserve(self, rows: int) -> None:
        """Room for positions [0, rows) (at most n_ctx), the ones held kept."""
        if rows > self.rows:
            self._grow(min(self.n_ctx, max(rows, 2 * self.rows)))

    def _grow(self, rows: int) -> None:
        old_k, old_v, held = self.k, self.v, self.rows
        self.k = [np.zeros((self.n_head_kv, rows, self.head_dim), np.float32)
                  for _ in range(self.n_layer)]
        self.v = [np.zeros((self.n_head_kv, rows, self.head_dim_v), np.float32)
                  for _ in range(self.n_layer)]
        for new, old in zip(self.k + self.v, old_k + old_v):
            new[:, :held] = old

    def copy_from(self, other: "NumpyKVCache", n_rows: int) -> None:
        self.reserve(n_rows)
        for mine, theirs in zip(self.k + self.v, other.k + other.v):
            mine[:, :n_rows] = theirs[:, :n_rows]


def _kv_type(value) -> str:
    """"f32" (default), "f16" or "q8_0" from a name or a numpy dtype."""
    if value is None:
        return "f32"
    if isinstance(value, str) and value in KV_CACHE_TYPES:
        return value
    try:
        return {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}[np.dtype(value)]
    except (TypeError, KeyError):
        raise ValueError(f"unknown KV cache type {value!r} (expected one of "
                         f"{', '.join(KV_CACHE_TYPES)})") from None


class QuantActMatrix:
    """A float32 matrix whose inputs are rounded the way llama.cpp's CPU backend quantizes
    activations for the parts' GGUF types; `segments` are (first row, end row, kind).
    Token by token (one GEMV each): llama.cpp computes every output as its own dot product,
    while a BLAS GEMM's float32 rounding depends on the batch size, and near a quantization
    step that flips an activation's rounding (a 13-token prompt of the golden data drifted
    1e-2 at one position that way)."""

    def __init__(self, w: np.ndarray, segments: list[tuple[int, int, str | None]]):
        self.w, self.segments = w, segments

    def matmul(self, x: np.ndarray) -> np.ndarray:
        outs = [np.stack([self.w[lo:hi] @ row for row in round_trip(x, kind)])
                for lo, hi, kind in self.segments]
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=1)


class NumpyBackend(Backend):
    """float32 reference. `quantized_activations=True` emulates llama.cpp's CPU arithmetic
    (activations quantized per weight type) instead of computing in float32."""
    name = "numpy"
    rope_qk_together = True
    model_features = frozenset({"moe", "attn_sinks", "yarn"})

    def __init__(self, quantized_activations: bool = False, threads: int | None = None,
                 kv_dtype=None, options: RunnerOptions | None = None):
        self.options = options or RunnerOptions()
        self.quantized_activations = quantized_activations
        self.kv_type = _kv_type(kv_dtype)
        # BLAS threads: fixed when given (argument or PYKERNEL_THREADS), else chosen per forward
        # pass by measured seconds per token, separately for decode (1 token) and prefill; the
        # whole pass is timed because spinning BLAS workers slow what runs between matmuls too.
        env_threads = os.environ.get("PYKERNEL_THREADS")
        fixed = threads or (int(env_threads) if env_threads else None)
        candidates = (fixed,) if fixed else tuple(sorted({1, os.cpu_count() or 1}))
        self._choosers = {"decode": ThreadChooser(candidates, explore_every=48, trial=3),
                          "prefill": ThreadChooser(candidates, explore_every=12, trial=1,
                                                   warmup=1)}
        self._pass = None  # (chooser kind, threads, start time, tokens) of the running pass
        self._blas_threads = None
        self._dequantized: dict[str, np.ndarray] = {}
        self._rope_cache: tuple | None = None

    # --- weights -----------------------------------------------------------------------------
    def host_weight_bytes(self, tensors) -> int:
        return sum(4 * t.n_elements for t in tensors)   # every tensor dequantized to float32

    def _f32(self, t: TensorInfo) -> np.ndarray:
        if t.name not in self._dequantized:  # shared between a tied embedding and output
            self._dequantized[t.name] = dequantize(t.data, t.ggml_type, t.shape)
        return self._dequantized[t.name]

    def matrix(self, parts: Sequence[TensorInfo]):
        if len(parts) == 1:
            w = self._f32(parts[0])
        else:  # dequantize each part straight into its rows of the fused matrix
            w = np.empty((sum(t.shape[0] for t in parts), parts[0].shape[1]), np.float32)
            row = 0
            for t in parts:
                dequantize(t.data, t.ggml_type, t.shape, out=w[row:row + t.shape[0]])
                row += t.shape[0]
        if not self.quantized_activations:
            return w
        segments, row = [], 0
        for t in parts:
            kind = activation_kind(t.ggml_type)
            if segments and segments[-1][2] == kind:
                segments[-1] = (segments[-1][0], row + t.shape[0], kind)
            else:
                segments.append((row, row + t.shape[0], kind))
            row += t.shape[0]
        return QuantActMatrix(w, segments)

    def vector(self, parts: Sequence[TensorInfo]) -> np.ndarray:
        vecs = [self._f32(t).reshape(-1) for t in parts]
        return vecs[0] if len(vecs) == 1 else np.concatenate(vecs)

    def embedding(self, table: TensorInfo) -> np.ndarray:
        return self._f32(table)

    def expert_matrix(self, parts: Sequence[TensorInfo]) -> numpy_moe.NumpyExperts:
        w = self._f32(parts[0]) if len(parts) == 1 else np.concatenate(
            [self._f32(t) for t in parts], axis=1)   # (n_expert, sum of out, in)
        kinds = {activation_kind(t.ggml_type) for t in parts}
        if self.quantized_activations and len(kinds) > 1:
            raise ValueError(f"numpy backend: experts {', '.join(t.name for t in parts)} have "
                             f"types that quantize activations differently")
        return numpy_moe.NumpyExperts(w, kinds.pop() if self.quantized_activations else None)

    def expert_vector(self, parts: Sequence[TensorInfo]) -> np.ndarray:
        vecs = [self._f32(t) for t in parts]
        return vecs[0] if len(vecs) == 1 else np.concatenate(vecs, axis=1)

    def kv_cache(self, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v) -> NumpyKVCache:
        if self.kv_type == "q8_0" and (head_dim % 32 or head_dim_v % 32):
            raise ValueError(f"numpy backend: a q8_0 KV cache needs head sizes that are "
                             f"multiples of 32, got {head_dim} / {head_dim_v}")
        return NumpyKVCache(n_layer, n_ctx, n_head_kv, head_dim, head_dim_v, self.kv_type)

    # --- ops ---------------------------------------------------------------------------------
    def embed(self, table, ids, scale=1.0):
        x = table[np.asarray(ids, dtype=np.int64)]
        if scale != 1.0:
            x *= np.float32(scale)
        return x

    def _use_threads(self, n: int) -> None:
        if self._blas_threads != n:
            set_threads(n)
            self._blas_threads = n

    def begin_forward(self, step, caches):
        n_tokens = step.n
        kind = "decode" if n_tokens == 1 else "prefill"
        threads = self._choosers[kind].pick()
        self._use_threads(threads)
        self._pass = (kind, threads, time.perf_counter(), n_tokens)
        return step

    def end_forward(self, logits):
        if self._pass is not None:
            kind, threads, start, n_tokens = self._pass
            self._choosers[kind].record(threads, time.perf_counter() - start, n_tokens)
            self._pass = None
        return logits

    def matmul(self, x, w, bias=None):
        if isinstance(w, QuantActMatrix):
            y = w.matmul(x)
        elif x.shape[0] <= GEMV_ROWS:    # decode, a batched decode of a few sequences
            y = np.stack([w @ row for row in x])
        else:
            y = x @ w.T
        if bias is not None:
            y += bias
        return y

    def split(self, x, sizes):
        out, col = [], 0
        for size in sizes:
            out.append(x[:, col:col + size])
            col += size
        return out

    def add(self, a, b):
        a += b
        return a

    def rms_norm(self, x, w, eps, group=0):
        if not group and x.shape[0] == 1:  # decode: one dot product, one fused scale
            mean_sq = float(np.dot(x[0], x[0])) / x.shape[1]
            return x * (w * np.float32(1.0 / math.sqrt(mean_sq + eps)))
        rows = x.reshape(x.shape[0], -1, group) if group else x
        mean_sq = np.einsum("...i,...i->...", rows, rows)[..., None]
        mean_sq *= np.float32(1.0 / rows.shape[-1])
        mean_sq += np.float32(eps)
        out = rows / np.sqrt(mean_sq)
        out *= w
        return out.reshape(x.shape)

    def layer_norm(self, x, w, b, eps):
        centered = x - x.mean(axis=-1, keepdims=True)
        var = np.mean(np.square(centered), axis=-1, keepdims=True)
        out = centered / np.sqrt(var + np.float32(eps))
        out *= w
        out += b
        return out

    def _rope_tables(self, positions, params: RopeParams, freq_factors):
        key = (positions.tobytes(), params, id(freq_factors))
        if self._rope_cache is None or self._rope_cache[0] != key:
            half = params.n_rot // 2
            inv_freq = params.base ** (-np.arange(half, dtype=np.float64) * 2.0 / params.n_rot)
            if freq_factors is not None:
                inv_freq = inv_freq / freq_factors.astype(np.float64)
            theta, mscale = numpy_moe.rope_angles(positions, params, inv_freq)
            tables = ((np.cos(theta) * mscale).astype(np.float32)[:, None, :],
                      (np.sin(theta) * mscale).astype(np.float32)[:, None, :])
            self._rope_cache = (key, tables)
        return self._rope_cache[1]

    def rope(self, x, positions, head_dim, params, freq_factors=None):
        n = x.shape[0]
        heads = x.reshape(n, -1, head_dim)  # (n, n_heads, head_dim); rotated in place
        cos, sin = self._rope_tables(positions, params, freq_factors)
        half = params.n_rot // 2
        if params.neox:   # pairs (i, i + n_rot/2)
            a, b = heads[..., :half], heads[..., half:params.n_rot]
        else:             # pairs (2i, 2i+1)
            a, b = heads[..., 0:params.n_rot:2], heads[..., 1:params.n_rot:2]
        a_rot = a * cos - b * sin
        b[...] = a * sin + b * cos
        a[...] = a_rot
        return heads.reshape(n, -1)

    def attention(self, q, k, v, step, caches, layer, scale, window=0, sinks=None):
        """Per sequence of the step: its rows over its own cache (attention_rows)."""
        if len(caches) == 1:
            return self.attention_rows(q, k, v, caches[0], layer, step.starts[0], scale, window,
                                       sinks)
        ends = np.cumsum(step.counts)
        return np.concatenate([
            self.attention_rows(q[end - n:end], k[end - n:end], v[end - n:end], cache, layer,
                                int(start), scale, window, sinks)
            for cache, start, n, end in zip(caches, step.starts, step.counts, ends)], axis=0)

    def attention_rows(self, q, k, v, cache: NumpyKVCache, layer, start, scale, window=0,
                       sinks=None):
        """Rows of one sequence at positions start..: k, v written into its cache, then each
        q row's causal attention (within the window, with `sinks`: Backend.attention) over
        that cache."""
        n, end = q.shape[0], start + q.shape[0]
        n_kv, d, dv = cache.n_head_kv, cache.head_dim, cache.head_dim_v
        cache.reserve(end)
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        k_rows = kv_round_trip(k.reshape(n, n_kv, d), cache.kv_type)
        v_rows = kv_round_trip(v.reshape(n, n_kv, dv), cache.kv_type)
        k_cache[:, start:end] = k_rows.transpose(1, 0, 2)
        v_cache[:, start:end] = v_rows.transpose(1, 0, 2)
        group = q.shape[1] // d // n_kv
        first = max(0, start - window + 1) if window else 0  # oldest key any query here sees
        keys, values = k_cache[:, first:end], v_cache[:, first:end]
        if n == 1:  # decode: query heads h = kv * group + g, no mask needed
            scores = q.reshape(n_kv, group, d) @ keys.transpose(0, 2, 1)
        else:       # (n_kv, group * n, d): the query heads sharing one KV head batched together
            qh = q.reshape(n, n_kv, group, d).transpose(1, 2, 0, 3).reshape(n_kv, group * n, d)
            scores = qh @ keys.transpose(0, 2, 1)
        scores *= np.float32(scale)
        if n > 1:
            q_pos = np.arange(start, end)[:, None]
            k_pos = np.arange(first, end)[None, :]
            hidden = k_pos > q_pos
            if window:
                hidden |= q_pos - k_pos >= window
            scores.reshape(n_kv, group, n, -1)[:, :, hidden] = -np.inf
        numpy_moe.softmax_with_sinks(scores, sinks, n_kv, group)
        out = scores @ values  # (n_kv, group * n, dv)
        if n == 1:
            return out.reshape(1, -1)
        return out.reshape(n_kv, group, n, dv).transpose(2, 0, 1, 3).reshape(n, -1)

    def moe_route(self, scores, n_used, gating):
        return numpy_moe.route(scores, n_used, gating)

    def moe_experts(self, x, weights, ids, probs, activation):
        return numpy_moe.experts(x, weights, ids, probs, activation)

    def swiglu(self, gate, up):
        out = np.negative(gate)
        np.exp(out, out=out)
        out += 1.0
        np.divide(gate, out, out=out)
        out *= up
        return out

    def gelu(self, x):
        inner = x * x
        inner *= np.float32(GELU_COEF_A)
        inner += 1.0
        inner *= x
        inner *= np.float32(SQRT_2_OVER_PI)
        np.tanh(inner, out=inner)
        inner += 1.0
        inner *= x
        inner *= np.float32(0.5)
        return inner

    def geglu_tanh(self, gate, up):
        out = self.gelu(gate)
        out *= up
        return out

    def rows(self, x, indices):
        return x[np.asarray(indices, np.int64)]

    def last_row(self, x):
        return x[-1:]

    def to_host(self, x):
        return np.asarray(x, dtype=np.float32)
