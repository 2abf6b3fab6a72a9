"""The "kernels" backend: the `Backend` ops run as pykernel kernels, on the GPU or the CPU target.

Input: GGUF tensors (uploaded once in their block format), token ids and positions of a step.
Output: device activations; `to_host` is the only device->host copy of activations.
Activations live in a per-forward arena (the same buffers every step of a given size, so a
decode step captured as a graph replays on them); the KV cache is preallocated per layer as
(n_head_kv, n_ctx, head_dim) in f16 (cuda) or f32 (cpu). Fusions: RoPE + KV-cache write (one
launch for q and k; the attention op is kernels_attention's), residual add and bias in the GEMV
epilogue, gate/up GEMV with SwiGLU/GeGLU in its epilogue, RMSNorm + the Q8_1 quantization of its
GEMV's input in one launch (see kernels_lazy). The step's inputs arrive as arguments:
`begin_forward` returns the `Step` with its ids and positions on the device (a graph's step has
them there already), embed / rope / attention read them from what they are given; the backend
keeps nothing of a step but the arena the pass allocates from. Decode graphs: kernels_graph (a
step's `direct` plan: decode attention in one split, no combine launch).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

import pykernel as pk
from llm.backends import kernels_extra as X
from llm.backends import kernels_moe as M
from llm.backends import kernels_weights as W
from llm.backends.base import Backend
from llm.backends.attention_args import prompt_tables
from llm.backends.kernels_attention import KernelsAttention
from llm.backends.kernels_lazy import (Cols, GluHalf, HeadNormed, Normed, PendingGlu,
                                       PendingMatmul, Quantized, Roped)
from llm.backends.kernels_readback_ops import ReadbackOps
from llm.backends.kernels_memory import (Arena, DeviceMemory, KernelsKVCache, KVPool,
                                         cache_dtype)
from llm.backends.logits_readback import LogitsReadback
from llm.options import RunnerOptions
from llm.config import RopeParams
from llm.gguf_file import TensorInfo
from llm.step import Step
from stdlib_kernels import activation as activation_rows
from stdlib_kernels import embedding as embedding_rows
from stdlib_kernels import glu as glu_rows
from stdlib_kernels import layernorm, rmsnorm
from stdlib_kernels.attention import kv_q8
from stdlib_kernels.attention.decode import HEAD_DIMS
from stdlib_kernels.attention.kv_q8 import DTYPE as Q8_DTYPE
from stdlib_kernels.quant.gemm_q8_k import split_workspace_bytes
from stdlib_kernels.quant.rmsnorm_q8_1 import rmsnorm_q8_1_into


class KernelsBackend(ReadbackOps, Backend):
    name = "kernels"
    logits_on_device = True
    # qwen3moe / gpt-oss (kernels_moe.py: experts, router, sinks, YaRN)
    model_features = frozenset({"moe", "attn_sinks", "yarn"})

    def __init__(self, device: str = "cuda", activations: str = "q8_1", kv_dtype=None,
                 graphs: bool = True, gemv: bool | None = None,
                 options: RunnerOptions | None = None):
        self.options = options or RunnerOptions()
        if activations not in ("q8_1", "f32"):
            raise ValueError(f"activations must be 'q8_1' or 'f32', got {activations!r}")
        self.device = pk.set_device(device) if device == "cuda" else pk.get_device("cpu")
        pk.set_device(self.device)
        self.activations = activations
        default_kv = np.float16 if self.device.kind == "cuda" else np.float32
        self.kv_dtype = cache_dtype(kv_dtype or default_kv)
        self.memory = DeviceMemory(self.device)
        self.weights = W.WeightStore(self.memory.upload)
        self.use_graphs = graphs
        self.argmax_scratch = None    # the decode graphs' greedy argmax (kernels_graph), per stream
        self.weights16 = None         # KernelOptions.dequant_f16_gemm's f16 weights (_weights16)
        # stdlib's warp-per-row GEMV on the GPU; on the CPU target kernels_extra.matmul, whose
        # threads never synchronise (same arithmetic, ~100x faster there)
        self.gemv = self.device.kind == "cuda" if gemv is None else gemv
        self.prefill_arena = Arena(self.memory)
        self.decode_arena = Arena(self.memory, keep_replaced=True)
        self.graph_prefill_arena = Arena(self.memory, keep_replaced=True)  # prefill graphs
        self.batch_arena = Arena(self.memory, keep_replaced=True)   # batched decode graphs
        self.arena = self.prefill_arena   # the running pass's (begin_forward picks it)
        self.stream = pk.Stream(self.device) if self.device.kind == "cuda" else None
        self.readback = LogitsReadback(self.device)   # logits rows, greedy ids, top-k lists
        self.rope_tables = {}   # scaled RoPE's freq_factors per (params, file factors)
        self.attention_ops = KernelsAttention(self)   # attention: kernels_attention.py

    def kv_device_budget(self) -> int | None:
        """Device bytes a default context's KV cache may take (model.choose_context): half of
        what is free once the weights are loaded, the rest left to activations, the decode
        graphs and other processes; None on the CPU target."""
        free = self.memory.free_bytes()
        return None if free is None else free // 2

    @property
    def kv_value_bytes(self) -> float:
        """Device bytes per cached K/V value (model.choose_context sizes the context with it)."""
        return kv_q8.BYTES_PER_VALUE if self.kv_dtype == Q8_DTYPE else self.kv_dtype.itemsize

    # --- weights -----------------------------------------------------------------------------
    def matrix(self, parts: Sequence[TensorInfo]):
        return self.weights.matrix(parts)

    def vector(self, parts: Sequence[TensorInfo]):
        host = np.concatenate([W.f32_vector(t) for t in parts])
        return self.memory.upload(host, "+".join(t.name for t in parts))

    def embedding(self, table: TensorInfo):
        return W.DeviceTable(self.weights.raw(table), table.ggml_type.name, table.shape[-1])

    def expert_matrix(self, parts: Sequence[TensorInfo]):
        return M.expert_matrix(self, parts)

    def expert_vector(self, parts: Sequence[TensorInfo]):
        return M.expert_vector(self, parts)

    def kv_cache(self, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v) -> KernelsKVCache:
        return self.kv_caches(1, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v)[0]

    def kv_caches(self, n_slots, n_layer, n_ctx, n_head_kv, head_dim, head_dim_v) -> list:
        """n_slots caches in one KVPool: a batched decode over consecutive ones reads them in
        one attention launch."""
        if head_dim_v != head_dim:
            raise ValueError(f"kernels backend: value head size {head_dim_v} != key head size "
                             f"{head_dim} is not supported")
        if self.kv_dtype == Q8_DTYPE and (head_dim % 32 or head_dim not in HEAD_DIMS):
            raise ValueError(f"kernels backend: a q8_0 KV cache needs a head size that is a "
                             f"multiple of 32 among {HEAD_DIMS}; this model's is {head_dim} "
                             f"(use --cache-type f16)")
        shape = (n_layer, n_ctx, n_head_kv, head_dim, self.kv_dtype, self.weights.nbytes)
        pool = KVPool(self.memory, n_slots, *shape)
        return [KernelsKVCache(self.memory, *shape, pool=pool, slot=s) for s in range(n_slots)]

    # --- step inputs -------------------------------------------------------------------------
    def begin_forward(self, step: Step, caches) -> Step:
        """The step as the ops read it: host ids and positions uploaded together (one copy), or
        a graph's step as it is (its inputs are slices of the graph's device buffer); a prompts
        step also carries its slot tables (attention_args.prompt_tables). Picks the pass's
        arena: a graph's steps each keep their own, so a replay finds its activations where the
        capture left them."""
        self.arena = self._arena_for(step)
        self.arena.reset()
        if step.on_host:
            n = step.n
            host = np.concatenate([np.asarray(step.ids, np.int32).reshape(-1),
                                   np.asarray(step.positions, np.int32).reshape(-1)])
            buf = self.arena.take((2 * n,), np.int32)
            buf.copy_from(host)
            step = step.with_inputs(buf[0:n], buf[n:2 * n])
        if step.kind == "prompts":
            step = dataclasses.replace(step, tables=prompt_tables(caches, step))
        return step

    def _arena_for(self, step: Step) -> Arena:
        if step.on_host:
            return self.prefill_arena
        if step.kind == "batch":
            return self.batch_arena
        return self.decode_arena if step.n == 1 else self.graph_prefill_arena

    def end_forward(self, logits):
        return self.materialize(logits)

    def begin_layer(self, layer: int) -> None:
        self.arena.begin_layer(layer)

    def end_layers(self) -> None:
        self.arena.end_layers()

    def device_ints(self, values):
        """int32 values on the device: a device array as it is, host ones copied into the
        arena (ops called outside a forward, by tests)."""
        if not isinstance(values, np.ndarray):
            return values
        buf = self.arena.take((len(values),), np.int32)
        buf.copy_from(np.asarray(values, np.int32).reshape(-1))
        return buf

    # --- ops ---------------------------------------------------------------------------------
    def embed(self, table: W.DeviceTable, ids, scale=1.0):
        dev_ids = self.device_ints(ids)
        n = dev_ids.shape[0]
        out = self.arena.take((n, table.n), np.float32)
        t = table.type_name
        if t in ("F32", "F16"):
            typed = table.raw.reshape(-1).view(np.float32 if t == "F32" else np.float16)
            embedding_rows(typed.reshape(-1, table.n), dev_ids, scale=scale, out=out)
        else:  # quantized rows: dequantized on the fly (one row per token, any GGUF type)
            X.embed_rows(table.raw, t, dev_ids, out, scale)
        return out

    def matmul(self, x, w, bias=None):
        xq = None
        if isinstance(x, Normed):
            x, xq = self._norm_for(x, w)
        elif isinstance(x, Quantized):
            x, xq = x.x, (x.xq if W.needs_q8_1(w, self.activations) else None)
        x = self.materialize(x)
        if bias is None and self.gemv and w.is_glu_pair():
            return PendingGlu(x, w, xq)
        return PendingMatmul(x, w, bias, xq)

    def all_reduce(self, x):
        """x summed over the tensor-parallel ranks, in place, on the stream the launches go to
        (captured with them inside a graph); a pending matmul runs first, so with one rank
        the residual add stays fused into the GEMV's store."""
        if self.communicator is None:
            return x
        x = self.materialize(x)
        stream = self.device.launch_stream_handle if self.device.kind == "cuda" else None
        self.communicator.all_reduce_sum(x, stream=stream)
        return x

    def _norm_for(self, p: Normed, w):
        """(f32 input, Q8_1 input or None) of a GEMV reading RMSNorm(p.x): one fused launch
        when w reads Q8_1 activations. The f32 values are written only when a row group or the
        prefill GEMM reads them; otherwise the returned f32 array is p.x, for its shape only
        (every Q8_1 path reads xq alone)."""
        if not W.needs_q8_1(w, self.activations) or p.x.shape[-1] % 32:
            return self._rms_norm_now(p), None
        n = p.x.shape[0]
        xq = self.arena.take(W.q8_buffer_shape(n, p.x.shape[1]), np.uint8)
        keep_f32 = not W.all_q8_1(w, self.activations) or \
            (self.gemv and n > self.options.kernel_options.gemv_tokens)
        out = self.arena.take(p.x.shape, np.float32) if keep_f32 else None
        rmsnorm_q8_1_into(p.x, p.weight, p.eps, xq, out)
        return (out if keep_f32 else p.x), xq

    def _run_matmul(self, p: PendingMatmul, res=None):
        x, w = p.x, p.w
        n = x.shape[0]
        one_launch_per_group = self.gemv and (n == 1 or (len(w.groups) == 1 and W.gemv_launch(
            w.groups[0], n, self.options.kernel_options)))
        in_place = one_launch_per_group and res is not None
        out = res if in_place else self.arena.take((n, w.n_out), np.float32)  # y may alias res
        # one token: the bias is the GEMV epilogue's "residual" (y = W x + bias, no launch)
        fold_bias = p.bias is not None and res is None and n == 1 and self.gemv
        if fold_bias:
            res = p.bias.reshape(1, w.n_out)
        W.matmul(x, w, out, self._q8(x, w, p.xq), self._scratch, self.options.kernel_options,
                 res=res, gemv=self.gemv, weights16=self._weights16)
        if p.bias is not None and not fold_bias:
            X.bias(out, p.bias)
        return out

    def _q8(self, x, w, xq=None):
        if xq is not None or not W.needs_q8_1(w, self.activations):
            return xq
        xq = self.arena.take(W.q8_buffer_shape(x.shape[0], x.shape[1]), np.uint8)
        W.quantize_activations(x, xq)
        return xq

    def _scratch(self, shape):
        return self.arena.take(shape, np.float32)

    def _weights16(self):
        """The f16 weight scratch of KernelOptions.dequant_f16_gemm: one per model, allocated at
        its first use (a prompt's eager pass, before any graph captures it) with room for the
        largest layer row group (WeightStore.f16_values: 235 MB for an 8B)."""
        if self.weights16 is None:
            self.weights16 = self.memory.allocate(
                (max(1, self.weights.f16_values()),), np.float16, "the f16 weight scratch",
                "prompts dequantize each matrix to f16 there (PYKERNEL_DEQUANT_F16_GEMM=0 "
                "turns that route off)")
        return self.weights16

    def split(self, x, sizes):
        if isinstance(x, PendingGlu) and tuple(sizes) == x.w.part_rows:
            return [GluHalf(x, 0), GluHalf(x, 1)]
        x = self.materialize(x)
        n, out, off = x.shape[0], [], 0
        for width in sizes:
            if n == 1:
                out.append(x.reshape(-1)[off:off + width].reshape(1, width))
            else:
                out.append(Cols(x, off, width))
            off += width
        return out

    def add(self, a, b):
        a = self.materialize(a)
        if isinstance(b, PendingMatmul) and b.bias is None:
            return self._run_matmul(b, res=a)
        if isinstance(b, M.PendingMoe):     # the experts' weighted sum stored onto a
            return M.run_experts(self, b, res=a)
        X.add(a, self.materialize(b))
        return a

    def rms_norm(self, x, w, eps, group=0):
        if group:       # deferred: RoPE + KV-cache write fuses q / k head norms
            return HeadNormed(x, w, eps, group)
        # deferred: a Q8_1 GEMV consumer fuses it with the quantization
        return Normed(self.materialize(x), w, eps)

    def _head_norm_now(self, p: HeadNormed):
        x = self.materialize(p.x)
        n = x.shape[0]
        out = self.arena.take(x.shape, np.float32)
        rmsnorm(x.reshape(n, -1, p.group), p.weight, p.eps, out=out.reshape(n, -1, p.group))
        return out

    def _rms_norm_now(self, p: Normed):
        out = self.arena.take(p.x.shape, np.float32)
        return rmsnorm(p.x, p.weight, p.eps, out=out)

    def layer_norm(self, x, w, b, eps):
        x = self.materialize(x)
        out = self.arena.take(x.shape, np.float32)
        return layernorm(x, w, b, eps, out=out)

    def rope(self, x, positions, head_dim, params: RopeParams, freq_factors=None):
        # linear / YaRN scaling: a factor per pair folded into freq_factors (kernels_moe)
        return Roped(x, head_dim, params, M.rope_freq_factors(self, params, freq_factors),
                     positions)

    def attention(self, q, k, v, step: Step, caches, layer, scale, window=0, sinks=None):
        return self.attention_ops.attention(q, k, v, step, caches, layer, scale, window, sinks)

    def batch_splits(self, caches, positions, window, n_head: int, forced=None) -> int:
        """The split count of a batched step's attention launch (kernels_attention)."""
        return self.attention_ops.batch_splits(caches, positions, window, n_head, forced)

    def batch_split_choices(self, caches, n_head: int) -> list[int]:
        """Every split count batch_splits can give these caches (kernels_attention)."""
        return self.attention_ops.batch_split_choices(caches, n_head)

    def moe_route(self, scores, n_used, gating):
        return M.moe_route(self, scores, n_used, gating)

    def moe_experts(self, x, weights, ids, probs, activation):
        return M.PendingMoe(x, weights, ids, probs, activation)

    def _glu(self, gate, up, act: str):
        if isinstance(gate, GluHalf) and isinstance(up, GluHalf) and gate.pending is up.pending \
                and (gate.index, up.index) == (0, 1):
            p = gate.pending
            out = self.arena.take((p.x.shape[0], p.w.part_rows[0]), np.float32)
            W.glu(p.x, p.w, out, self._q8(p.x, p.w, p.xq), "swiglu" if act == "silu" else "geglu",
                  self._scratch, self.options.kernel_options, weights16=self._weights16)
            return out
        g, u = self.contiguous(gate), self.contiguous(up)
        out = self.arena.take(g.shape, np.float32)
        return glu_rows(g, u, act, out=out)

    def swiglu(self, gate, up):
        return self._glu(gate, up, "silu")

    def geglu_tanh(self, gate, up):
        return self._glu(gate, up, "gelu_tanh")

    def gelu(self, x):
        x = self.materialize(x)
        return activation_rows(x, "gelu_tanh", out=self.arena.take(x.shape, np.float32))

    def synchronize(self) -> None:
        pk.synchronize(self.device)

    # --- deferred values -----------------------------------------------------------------------
    def materialize(self, x):
        """A contiguous f32 device array for any activation (launching what was deferred)."""
        if isinstance(x, PendingMatmul):
            return self._run_matmul(x)
        if isinstance(x, PendingGlu):
            return self._run_matmul(PendingMatmul(x.x, x.w, None, x.xq))
        if isinstance(x, Normed):
            return self._rms_norm_now(x)
        if isinstance(x, HeadNormed):
            return self._head_norm_now(x)
        if isinstance(x, Quantized):
            return x.x
        if isinstance(x, GluHalf):
            full = self.materialize(x.pending)
            half = x.pending.w.part_rows[0]
            return self.contiguous(Cols(full, half * x.index, half)
                                    if full.shape[0] > 1 else
                                    full.reshape(-1)[half * x.index:half * (x.index + 1)]
                                    .reshape(1, half))
        if isinstance(x, Roped):
            return self.attention_ops.apply_rope(x)
        if isinstance(x, M.PendingMoe):
            return M.run_experts(self, x)
        return self.contiguous(x)

    def contiguous(self, x):
        if isinstance(x, Cols):
            n = x.src.shape[0]
            out = self.arena.take((n, x.width), np.float32)
            X.columns(x.src, out, n, x.width, x.off, 0)
            return out
        if isinstance(x, (PendingMatmul, PendingGlu, GluHalf, Roped, Normed, HeadNormed,
                          M.PendingMoe)):
            return self.materialize(x)
        return x

    def memory_report(self) -> dict:
        return self.memory.report(self.weights.nbytes, sum(
            a.nbytes for a in (self.prefill_arena, self.decode_arena, self.graph_prefill_arena,
                               self.batch_arena)),
            split_workspace_bytes(self.device)
            + (0 if self.weights16 is None else self.weights16.nbytes))


def create(device: str = "cuda", **options) -> KernelsBackend:
    return KernelsBackend(device=device, **options)
