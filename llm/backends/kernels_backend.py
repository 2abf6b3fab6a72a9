"""The "kernels" backend: the `Backend` ops run as pykernel kernels, on the GPU or the CPU target.

Input: GGUF tensors (uploaded once in their block format), token ids and positions of a step.
Output: device activations; `to_host` is the only device->host copy of activations.
Activations live in a per-forward arena (the same buffers every step of a given size, so a
decode step captured as a graph replays on them); the KV cache is preallocated per layer as
(n_head_kv, n_ctx, head_dim) in f16 (cuda) or f32 (cpu). Fusions: RoPE + KV-cache write (one
launch for q and k), residual add and bias in the GEMV epilogue, gate/up GEMV with SwiGLU/GeGLU
in its epilogue, RMSNorm + the Q8_1 quantization of its GEMV's input in one launch (see
kernels_lazy). The step's inputs arrive as arguments: `begin_forward` returns the `Step` with its
ids and positions on the device (a graph's step has them there already), embed / rope / attention
read them from what they are given; the backend keeps nothing of a step but the arena the pass
allocates from. Decode graphs: kernels_graph (a step's `direct` plan: decode attention in one
split, no combine launch).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

import pykernel as pk
from llm.backends import kernels_extra as X
from llm.backends import kernels_moe as M
from llm.backends import kernels_weights as W
from llm.backends.base import KV_CACHE_TYPES, Backend
from llm.backends.kernels_lazy import (Cols, GluHalf, HeadNormed, Normed, PendingGlu,
                                       PendingMatmul, Quantized, Roped)
from llm.backends.kernels_memory import Arena, DeviceMemory, KernelsKVCache, KVPool
from llm.backends.logits_readback import LogitsReadback
from llm.options import RunnerOptions
from llm.config import RopeParams
from llm.gguf_file import TensorInfo
from llm.step import Step
from stdlib_kernels import activation as activation_rows
from stdlib_kernels import embedding as embedding_rows
from stdlib_kernels import glu as glu_rows
from stdlib_kernels import layernorm, rmsnorm, rope_kv_cache
from stdlib_kernels.rotary import HeadNorms, RopeSpec, rope_kv_cache_cols
from stdlib_kernels import rope as rope_rows
from stdlib_kernels.attention import kv_q8
from stdlib_kernels.attention.decode import HEAD_DIMS, KeyRange, launch_decode
from stdlib_kernels.attention.decode_plan import (batch_splits, config_splits, default_config,
                                                  direct_config, gpu_config)
from stdlib_kernels.attention.kv_q8 import DTYPE as Q8_DTYPE, Q8Cache
from stdlib_kernels.attention.prefill import (launch_prefill, launch_prefill_seqs,
                                              mma_available)
from stdlib_kernels.quant.gemm_q8_k import split_workspace_bytes
from stdlib_kernels.quant.rmsnorm_q8_1 import rmsnorm_q8_1_into

# options.early_kv (launch_decode(early_kv=) in the decode graphs) was off for a while: ptxas
# had scheduled the attention kernel's Q loads (ld.global.nc) above its late PDL wait, so
# pipelined greedy decode sometimes picked different tokens; Q is a plain pointer now, and
# tests/kernels/test_pdl_load_order.py checks the SASS (benchmarks/RESULTS.md, "early_kv again").


CACHE_TYPES = dict(zip(KV_CACHE_TYPES, (np.dtype(np.float16), np.dtype(np.float32),
                                         Q8_DTYPE)))


def cache_dtype(value):
    """A KV cache element type from a name ("f16", "f32", "q8_0", as llama.cpp's --cache-type-k
    spells them) or a numpy dtype: np.dtype, or "q8_0" for a Q8_0 cache."""
    if isinstance(value, str) and value in CACHE_TYPES:
        return CACHE_TYPES[value]
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype not in (np.float16, np.float32):
        raise ValueError(f"unknown KV cache type {value!r} (expected one of "
                         f"{', '.join(CACHE_TYPES)})")
    return dtype


class DeviceTable:
    """An embedding table: raw GGUF rows (vocab, row_bytes) uint8 of `type_name`."""

    def __init__(self, raw, type_name: str, n: int):
        self.raw, self.type_name, self.n = raw, type_name, n


class KernelsBackend(Backend):
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
        host = np.concatenate([_f32_vector(t) for t in parts])
        return self.memory.upload(host, "+".join(t.name for t in parts))

    def embedding(self, table: TensorInfo):
        return DeviceTable(self.weights.raw(table), table.ggml_type.name, table.shape[-1])

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
        step also carries its slot tables (_prompt_tables). Picks the pass's arena: a graph's
        steps each keep their own, so a replay finds its activations where the capture left
        them."""
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
            step = dataclasses.replace(step, tables=self._prompt_tables(caches, step))
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

    def _device_ints(self, values):
        """int32 values on the device: a device array as it is, host ones copied into the
        arena (ops called outside a forward, by tests)."""
        if not isinstance(values, np.ndarray):
            return values
        buf = self.arena.take((len(values),), np.int32)
        buf.copy_from(np.asarray(values, np.int32).reshape(-1))
        return buf

    # --- ops ---------------------------------------------------------------------------------
    def embed(self, table: DeviceTable, ids, scale=1.0):
        dev_ids = self._device_ints(ids)
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
                 res=res, gemv=self.gemv)
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

    def _apply_rope(self, r: Roped):
        x = self._contiguous(r.x)
        n = x.shape[0]
        pos = self._device_ints(r.positions)
        p = r.params
        x3 = x.reshape(n, -1, r.head_dim)
        rope_rows(x3, pos, p.base, _rope_style(p), rot_dim=p.n_rot,
                  freq_factors=r.freq_factors, mscale=M.rope_mscale(p), out=x3)
        return x

    def attention(self, q, k, v, step: Step, caches, layer, scale, window=0, sinks=None):
        # sinks (gpt-oss): (n_head,) f32 on the device, passed to every attention launch
        if step.kind == "batch":
            return self._attention_batch(q, k, v, step, caches, layer, scale, window, sinks)
        if step.kind == "prompts":
            return self._attention_prompts(q, k, v, step, caches, layer, scale, window, sinks)
        return self._attention_tokens(q, k, v, step, caches[0], layer, scale, window, sinks)

    def _attention_tokens(self, q, k, v, step: Step, cache: KernelsKVCache, layer, scale,
                          window, sinks=None):
        """Rows start.. of one sequence (start on the host, or None: a graph's, on the device
        in step.positions)."""
        start = step.starts[0] if step.starts is not None else None
        positions, start_dev = step.positions, step.positions[0:1]
        d = cache.head_dim
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        fused, q_src, k_src, norms = _rope_sources(q, k, d)
        if fused and d in HEAD_DIMS and self._tensor_core_prefill(k_cache) and \
                _qkv_in_place(q_src, k_src, v):
            qkv = q_src.src
            n = qkv.shape[0]
            out = self.arena.take((n, q_src.width), np.float32)
            self._prefill_in_place(q, q_src, k_src, norms, qkv, cache, layer, start, positions,
                                   out, scale, window, sinks)
            return out
        qa = self._contiguous(q_src if fused else self.materialize(q))
        ka = self._contiguous(k_src if fused else self.materialize(k))
        va = self._contiguous(v)
        n = qa.shape[0]
        q3 = qa.reshape(n, -1, d)
        if fused:
            p = q.params
            rope_kv_cache(ka.reshape(n, -1, d), va.reshape(n, -1, d), k_cache, v_cache,
                          positions, _rope_spec(p, q.freq_factors), q=q3,
                          norms=_rope_norms(norms))
        else:
            _store_rows(ka, va, cache, layer, start_dev)
        if cache.q8 and n > 1:     # prefill reads the rows as f16 (decode reads Q8_0 itself)
            k_cache, v_cache = self._dequantized(cache, layer, start + n)
        out = self.arena.take((n, qa.shape[1]), np.float32)
        if d in HEAD_DIMS:
            xq = self._stdlib_attention(q3, k_cache, v_cache, start, start_dev,
                                        out.reshape(n, -1, d), scale, window, cache,
                                        direct=step.direct, sinks=sinks)
            if xq is not None:
                return Quantized(out, xq)
        else:
            X.attention(qa, k_cache, v_cache, out, start_dev, q3.shape[1], scale, window,
                        sinks=sinks)
        return out

    def _attention_batch(self, q, k, v, step: Step, caches, layer, scale, window, sinks=None):
        """Row i: RoPE'd q/k, k/v stored at positions[i] of caches[i], decode attention over
        that cache, lengths read from the step's positions. Consecutive slots of one f16/f32
        KVPool (what BatchScheduler steps) take one launch for RoPE and the cache writes of
        all rows (on the fused q|k|v projection's columns in place: rope_kv_cache_cols into
        the slots' caches, q into a contiguous buffer; else a RoPE launch each for q and k,
        column copies and one store) and one attention launch (plus a split's combine); other
        caches two or three launches per row."""
        d, first, n = caches[0].head_dim, caches[0], len(caches)
        positions, positions_dev = np.asarray(step.starts), step.positions   # host, device
        if d in HEAD_DIMS and not first.q8 and all(
                c.pool is first.pool and c.slot == first.slot + i for i, c in enumerate(caches)):
            k_all = first.pool.k[layer][first.slot:first.slot + n]
            v_all = first.pool.v[layer][first.slot:first.slot + n]
            qa = self._rope_into_slots(q, k, v, k_all, v_all, positions_dev)
            if qa is None:
                qa, ka, va = (self._contiguous(self.materialize(a)) for a in (q, k, v))
                X.store_kv(ka, va, k_all, v_all, positions_dev)
            q3 = qa.reshape(n, -1, d)
            out = self.arena.take((n, qa.shape[1]), np.float32)
            config = self._decode_config(q3.shape[1], k_all)
            splits = self.batch_splits(caches, positions, window, q3.shape[1], step.splits)
            launch_decode(q3, k_all, v_all, KeyRange(positions_dev, add=1, window=window or None),
                          out.reshape(n, -1, d), scale, config=config,
                          early_kv=self.options.early_kv,
                          workspace=first.pool.workspace(n, q3.shape[1], config, splits),
                          sinks=sinks)
            return out
        qa, ka, va = (self._contiguous(self.materialize(a)) for a in (q, k, v))
        out = self.arena.take((n, qa.shape[1]), np.float32)
        q3, out3 = qa.reshape(n, -1, d), out.reshape(n, -1, d)
        for i, cache in enumerate(caches):
            k_cache, v_cache = cache.k[layer], cache.v[layer]
            pos_dev = positions_dev[i:i + 1]
            _store_rows(ka[i:i + 1], va[i:i + 1], cache, layer, pos_dev)
            if d in HEAD_DIMS:
                self._stdlib_attention(q3[i:i + 1], k_cache, v_cache, int(positions[i]),
                                       pos_dev, out3[i:i + 1], scale, window, cache,
                                       quantize_out=False, sinks=sinks)
            else:
                X.attention(qa[i:i + 1], k_cache, v_cache, out[i:i + 1], pos_dev, q3.shape[1],
                            scale, window, sinks=sinks)
        return out

    def _attention_prompts(self, q, k, v, step: Step, caches, layer, scale, window,
                           sinks=None):
        """Prompt i's rows (after those of prompts 0..i-1) over its own cache, the outputs in
        one buffer. On the fused q|k|v columns in place with f16 caches of one KVPool: one
        launch for every prompt's RoPE + K/V writes (rope_kv_cache_cols with a slot per
        token) and one tensor-core prefill over them all (launch_prefill_seqs, a row per
        prompt); caches apart: those two launches per prompt on its rows; otherwise on
        contiguous q, k, v (RoPE applied first) with a K/V store and an attention launch per
        prompt."""
        d, pool = caches[0].head_dim, caches[0].pool
        starts, counts = step.starts, step.counts
        ends = np.cumsum(counts)
        positions_dev = step.positions            # the step's positions, prompt by prompt
        fused, q_src, k_src, norms = _rope_sources(q, k, d)
        in_place = fused and d in HEAD_DIMS and _qkv_in_place(q_src, k_src, v) and all(
            self._tensor_core_prefill(c.k[layer]) for c in caches)
        if in_place and step.tables is not None:
            qkv, p = q_src.src, q.params
            slots, slots_dev, seqs, seqs_dev = step.tables
            out = self.arena.take((qkv.shape[0], q_src.width), np.float32)
            rope_kv_cache_cols(qkv, q_src.width // d, k_src.width // d, d, pool.k[layer],
                               pool.v[layer], positions_dev, _rope_spec(p, q.freq_factors),
                               slots=slots, slots_dev=slots_dev, norms=_rope_norms(norms))
            launch_prefill_seqs(qkv, pool.k[layer], pool.v[layer],
                                out.reshape(qkv.shape[0], -1, d), seqs, scale,
                                seqs_dev=seqs_dev, window=window or None,
                                n_head=q_src.width // d, sinks=sinks)
            return out
        if in_place:
            qkv = q_src.src
            out = self.arena.take((qkv.shape[0], q_src.width), np.float32)
            for cache, start, n, end in zip(caches, starts, counts, ends):
                self._prefill_in_place(q, q_src, k_src, norms, qkv[end - n:end], cache, layer,
                                       int(start), positions_dev[end - n:end],
                                       out[end - n:end], scale, window, sinks)
            return out
        qa, ka, va = (self._contiguous(self.materialize(a)) for a in (q, k, v))
        out = self.arena.take((qa.shape[0], qa.shape[1]), np.float32)
        for cache, start, n, end in zip(caches, starts, counts, ends):
            rows, start_dev = slice(end - n, end), positions_dev[end - n:end - n + 1]
            _store_rows(ka[rows], va[rows], cache, layer, start_dev)
            k_cache, v_cache = cache.k[layer], cache.v[layer]
            if cache.q8 and n > 1:
                k_cache, v_cache = self._dequantized(cache, layer, int(start) + n)
            if d in HEAD_DIMS:
                self._stdlib_attention(qa[rows].reshape(n, -1, d), k_cache, v_cache, int(start),
                                       start_dev, out[rows].reshape(n, -1, d), scale, window,
                                       cache, quantize_out=False, sinks=sinks)
            else:
                X.attention(qa[rows], k_cache, v_cache, out[rows], start_dev,
                            qa.shape[1] // d, scale, window, sinks=sinks)
        return out

    def _prompt_tables(self, caches, step: Step) -> tuple | None:
        """A prompts step's tables over one KVPool, made once per forward (on the device for
        every layer): a slot per token (host, device) and a row per prompt (first row, tokens,
        start, slot; host, device); None where the caches are not of one f16/f32 pool."""
        pool = caches[0].pool
        if pool.q8 or not all(c.pool is pool for c in caches):
            return None
        counts = np.asarray(step.counts)
        slot_of = np.array([c.slot for c in caches], np.int32)
        slots = np.repeat(slot_of, counts)
        first = np.cumsum(counts) - counts
        seqs = np.stack([first, counts, np.asarray(step.starts), slot_of],
                        axis=1).astype(np.int32)
        return slots, pk.to_device(slots), seqs, pk.to_device(seqs)

    def _rope_into_slots(self, q, k, v, k_all, v_all, positions_dev):
        """The batched step's q / k RoPE and K / V writes in one launch, when q, k, v are
        the fused projection's columns (rope_kv_cache_cols with a cache per row: row i into
        k_all[i] / v_all[i] at its position); the rotated q in a new contiguous buffer (the
        decode's input), or None where the columns are not fused."""
        d = k_all.shape[-1]
        fused, q_src, k_src, norms = _rope_sources(q, k, d)
        if not fused or not _qkv_in_place(q_src, k_src, v):
            return None
        qkv, p = q_src.src, q.params
        qa = self.arena.take((qkv.shape[0], q_src.width), np.float32)
        rope_kv_cache_cols(qkv, q_src.width // d, k_src.width // d, d, k_all, v_all,
                           positions_dev, _rope_spec(p, q.freq_factors), q_out=qa,
                           norms=_rope_norms(norms))
        return qa

    def batch_splits(self, caches, positions, window, n_head: int, forced=None) -> int:
        """The split count of a batched step's one attention launch over consecutive pool
        slots, from the step's host positions (each row's keys: position + 1, within the
        window), or `forced` (a step's planned splits: graph warm-up): the batched graphs are
        keyed by it (kernels_graph), since it is fixed in a capture."""
        first = caches[0]
        if first.q8:
            return 0          # per-row launches (the pool path takes f16 / f32 caches)
        if forced:
            return forced
        lens = np.asarray(positions, np.int64) + 1
        if window:
            lens = np.minimum(lens, window)
        config = self._decode_config(n_head, first.pool.k[0])
        return batch_splits(lens, config, n_head, first.n_head_kv, first.head_dim,
                            np.dtype(first.dtype).itemsize, self.device)

    def batch_split_choices(self, caches, n_head: int) -> list[int]:
        """Every split count batch_splits can give these caches' slots (powers of two up to
        one full slot's plan): what the scheduler's warm-up captures a graph for."""
        first = caches[0]
        if first.q8:
            return [0]
        config = self._decode_config(n_head, first.pool.k[0])
        most = config_splits(config, n_head, first.n_head_kv, first.n_ctx, self.device)
        return [1 << i for i in range(most.bit_length()) if 1 << i <= most]

    def _prefill_in_place(self, q, q_src, k_src, norms, rows, cache, layer, start: int,
                          positions, out, scale, window, sinks=None) -> None:
        """Prefill on rows of the fused q|k|v projection's output itself (all of them, or one
        prompt's): (head norms and) RoPE of q in place, of k into the cache, v into the cache,
        then the tensor-core attention reading q's columns into out (no copies of the three
        column blocks). q: the deferred RoPE; q_src, k_src, norms: _rope_sources'."""
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        d, n, p = cache.head_dim, rows.shape[0], q.params
        rope_kv_cache_cols(rows, q_src.width // d, k_src.width // d, d, k_cache, v_cache,
                           positions, _rope_spec(p, q.freq_factors), norms=_rope_norms(norms))
        if cache.q8:
            k_cache, v_cache = self._dequantized(cache, layer, start + n)
        first, first_dev = self._prefill_start(start, positions[0:1])
        launch_prefill(rows, k_cache, v_cache, out.reshape(n, -1, d), first, scale,
                       window=window or None, n_head=q_src.width // d, start_dev=first_dev,
                       sinks=sinks)

    @staticmethod
    def _prefill_start(start, start_dev) -> tuple:
        """launch_prefill's (start, start_dev): a host start, or (start None: a prefill graph's)
        the one on the device."""
        if start is not None:
            return start, None
        return 0, start_dev

    def _dequantized(self, cache: KernelsKVCache, layer: int, n_rows: int):
        """A q8_0 cache's first n_rows rows of `layer` as f16 (K, V) buffers, what a prefill's
        attention reads: llama.cpp's CUDA flash attention also converts a quantized cache to
        f16 for a batch of queries. Per layer and prefill chunk ~3 bytes per cached value."""
        k16, v16 = cache.f16_rows()
        kv_q8.dequantize_into(cache.k[layer], k16, n_rows)
        kv_q8.dequantize_into(cache.v[layer], v16, n_rows)
        return k16, v16

    def _stdlib_attention(self, q3, k_cache, v_cache, start, start_dev, out3, scale, window,
                          cache, quantize_out: bool = True, direct: bool = False, sinks=None):
        """Launches the attention into out3; for a decode in the Q8_1 mode also returns the
        output's Q8_1 copy, the o-projection's input (launch_decode's xq_out; not with
        quantize_out=False: a batched decode's rows are quantized together), else None.
        direct: a decode without splits (the step's plan)."""
        if q3.shape[0] == 1:   # decode: kv_len = position + 1, split over the context
            config = self._decode_config(q3.shape[1], k_cache, direct)
            workspace = None if direct else cache.workspace(q3.shape[1], config)
            # the kernel writing the output (the combine, or the split kernel without splits)
            # also writes the o-projection's Q8_1 activations: no quantize launch for them
            xq = None
            q8_out = self.options.attention_q8
            wanted = q8_out == "all" or (q8_out == "split" and workspace is not None)
            if wanted and quantize_out and self.activations == "q8_1" and q3.shape[2] % 32 == 0:
                xq = self.arena.take(W.q8_buffer_shape(1, q3.shape[1] * q3.shape[2]), np.uint8)
            # early_kv: under PDL the split blocks read the length and start loading older
            # rows before their wait (the kernel before writes only the newest row)
            launch_decode(q3, k_cache, v_cache, KeyRange(start_dev, add=1, window=window or None),
                          out3, scale, workspace=workspace, config=config,
                          early_kv=self.options.early_kv, xq_out=xq, sinks=sinks)
            return xq
        elif self._tensor_core_prefill(k_cache):   # Q, K, V, P rounded to f16 like llama.cpp's
            first, first_dev = self._prefill_start(start, start_dev)
            launch_prefill(q3, k_cache, v_cache, out3, first, scale, window=window or None,
                           start_dev=first_dev, sinks=sinks)
        else:                  # prefill: query z sees start + z + 1 keys of the shared cache
            launch_decode(q3, k_cache, v_cache,
                          KeyRange(start_dev, add=1, step=1, stride=0, window=window or None),
                          out3, scale, share_cache=True, sinks=sinks)
        return None

    def _decode_config(self, n_head: int, k_cache, direct: bool = False):
        """Tensor-core decode attention (Q and P rounded to f16) in the llama.cpp-like Q8_1
        mode; activations="f32", the accurate mode, keeps the f32 SIMT kernel."""
        group, head_dim = n_head // k_cache.shape[-3], k_cache.shape[-1]
        # a Q8_0 cache is read by the tensor-core kernel alone (in both activation modes)
        if self.activations == "q8_1" or self.device.kind == "cpu" or \
                isinstance(k_cache, Q8Cache):
            config = default_config(group, head_dim, self.device, k_cache.dtype,
                                    self.options.kernel_options)
        else:
            config = gpu_config(group, head_dim, k_cache.dtype)
        if direct:     # no splits: one query head per block
            config = direct_config(config)
        # in the decode graph the split and combine kernels let the next kernel launch at their
        # start (its blocks then prefetch weights meanwhile): 8B @ d4096 +0.5% on an H200
        # (benchmarks/RESULTS.md, "Decode attention's early trigger in the runner")
        return dataclasses.replace(config, early_trigger=self.options.early_trigger)

    def _tensor_core_prefill(self, k_cache) -> bool:
        """Flash attention on tensor cores for prefill: f16 cache, sm_80+, and the llama.cpp-like
        Q8_1 activation mode (activations="f32" keeps the f32 SIMT path, the accurate one)."""
        return (self.options.tensor_core_prefill and self.activations == "q8_1"
                and (isinstance(k_cache, Q8Cache) or k_cache.dtype == np.float16)
                and mma_available(self.device))

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
                  self._scratch, self.options.kernel_options)
            return out
        g, u = self._contiguous(gate), self._contiguous(up)
        out = self.arena.take(g.shape, np.float32)
        return glu_rows(g, u, act, out=out)

    def swiglu(self, gate, up):
        return self._glu(gate, up, "silu")

    def geglu_tanh(self, gate, up):
        return self._glu(gate, up, "gelu_tanh")

    def gelu(self, x):
        x = self.materialize(x)
        return activation_rows(x, "gelu_tanh", out=self.arena.take(x.shape, np.float32))

    def rows(self, x, indices):
        """x's rows `indices` gathered (host ints, or a device array: a prefill graph's index
        of the prompt's last row)."""
        x = self.materialize(x)
        index = self._device_ints(indices)
        return embedding_rows(x, index, out=self.arena.take((index.shape[0], x.shape[1]),
                                                            np.float32))

    def argmax_rows(self, x):
        return self.readback.argmax_rows(self.materialize(x))

    def top_candidates(self, x, k):
        return self.readback.top_candidates(self.materialize(x), k)

    def sample_rows(self, x, samplers, histories):
        return self.readback.sample_rows(self.materialize(x), samplers, histories)

    def logits_rows(self, x, indices):
        return self.readback.pick(self.materialize(x), indices)

    def last_row(self, x):
        x = self.materialize(x)
        return x[x.shape[0] - 1:]

    def to_host(self, x):
        return self.materialize(x).numpy()

    def to_host_reused(self, x):
        return self.readback.rows(self.materialize(x))

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
            return self._contiguous(Cols(full, half * x.index, half)
                                    if full.shape[0] > 1 else
                                    full.reshape(-1)[half * x.index:half * (x.index + 1)]
                                    .reshape(1, half))
        if isinstance(x, Roped):
            return self._apply_rope(x)
        if isinstance(x, M.PendingMoe):
            return M.run_experts(self, x)
        return self._contiguous(x)

    def _contiguous(self, x):
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
            split_workspace_bytes(self.device))


def _store_rows(k, v, cache: KernelsKVCache, layer: int, start_dev) -> None:
    """k, v rows into the layer's cache from position start_dev[0] on (Q8_0 or f16/f32)."""
    store = kv_q8.store_rows if cache.q8 else X.store_kv
    store(k, v, cache.k[layer], cache.v[layer], start_dev)


def _rope_style(p: RopeParams) -> str:
    return "neox" if p.neox else "normal"


def _head_norms(q, k, head_dim: int):
    """(q weight, k weight, eps) when both q and k are deferred per-head RMSNorms of head_dim
    with one eps (qwen3 / gemma3's q_norm / k_norm), which the RoPE launch can apply; else
    None."""
    if isinstance(q, HeadNormed) and isinstance(k, HeadNormed) and q.eps == k.eps and \
            q.group == k.group == head_dim:
        return q.weight, k.weight, q.eps
    return None


def _rope_spec(p: RopeParams, freq_factors) -> RopeSpec:
    return RopeSpec(p.base, _rope_style(p), p.n_rot, freq_factors, mscale=M.rope_mscale(p))


def _rope_norms(norms) -> HeadNorms | None:
    """_head_norms' (q weight, k weight, eps) as the RoPE launch's HeadNorms."""
    return None if norms is None else HeadNorms(*norms)


def _rope_sources(q, k, head_dim: int) -> tuple:
    """(fused, q source, k source, head norms): fused when q and k are deferred RoPEs of one
    kind, which one launch applies (with the cache write) to their sources, the head norms
    (_head_norms) included; else (False, q, k, None)."""
    if not (isinstance(q, Roped) and isinstance(k, Roped) and q.params == k.params):
        return False, q, k, None
    norms = _head_norms(q.x, k.x, head_dim)
    if norms is not None:      # the head norms run inside the RoPE launch
        return True, q.x.x, k.x.x, norms
    return True, q.x, k.x, None


def _qkv_in_place(q, k, v) -> bool:
    """q, k, v are the first three column blocks, in order, of one projection's output."""
    return (isinstance(q, Cols) and isinstance(k, Cols) and isinstance(v, Cols)
            and q.src is k.src is v.src and q.off == 0 and k.off == q.width
            and v.off == q.width + k.width and q.src.dtype == np.float32)


def _f32_vector(t: TensorInfo) -> np.ndarray:
    from llm.backends.dequant import dequantize
    return dequantize(t.data, t.ggml_type, t.shape).reshape(-1).astype(np.float32)


def create(device: str = "cuda", **options) -> KernelsBackend:
    return KernelsBackend(device=device, **options)
