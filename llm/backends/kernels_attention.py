"""Attention of the "kernels" backend: RoPE, the K/V cache writes and the attention launches
of one layer, for a step of one sequence's tokens, a batch of decode rows or several prompts.

Input: the layer's q, k, v as the backend's ops left them (deferred RoPEs and head norms,
column blocks of the fused q|k|v projection), the step (positions on the device, host starts,
a prompts step's slot tables) and the KV caches. Output: the attention rows
(n, n_head * head_dim) f32 in the backend's arena, or `Quantized` with their Q8_1 copy where
the decode kernel writes it for the o-projection. RoPE of q and k and the cache write are one
launch (rotary.rope_kv_cache*), reading the projection's columns in place when q, k, v are
its first three blocks; then decode attention, or the tensor-core prefill on f16 caches (a
q8_0 cache dequantized to f16 first). `KernelsAttention` reaches the arena, the options and
the deferred values through the backend that owns it (KernelsBackend.attention_ops).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from llm.backends import kernels_extra as X
from llm.backends import kernels_moe as M
from llm.backends import kernels_weights as W
from llm.backends.kernels_lazy import Cols, HeadNormed, Quantized, Roped
from llm.backends.attention_args import rope_norms, rope_spec, rope_style, store_rows
from llm.backends.kernels_memory import KernelsKVCache
from llm.step import Step
from stdlib_kernels import rope as rope_rows
from stdlib_kernels import rope_kv_cache
from stdlib_kernels.attention import kv_q8
from stdlib_kernels.attention.decode import HEAD_DIMS, KeyRange, launch_decode
from stdlib_kernels.attention.decode_plan import (batch_splits, config_splits, default_config,
                                                  direct_config, gpu_config)
from stdlib_kernels.attention.kv_q8 import Q8Cache
from stdlib_kernels.attention.prefill import (launch_prefill, launch_prefill_seqs,
                                              mma_available)
from stdlib_kernels.attention.prefill_wgmma import wgmma_prefill_applies
from stdlib_kernels.rotary import rope_kv_cache_cols

# options.early_kv (launch_decode(early_kv=) in the decode graphs) was off for a while: ptxas
# had scheduled the attention kernel's Q loads (ld.global.nc) above its late PDL wait, so
# pipelined greedy decode sometimes picked different tokens; Q is a plain pointer now, and
# tests/kernels/test_pdl_load_order.py checks the SASS (benchmarks/RESULTS.md, "early_kv again").


class KernelsAttention:
    """The backend's attention op (KernelsBackend.attention) and the batched steps' split
    planning (batch_splits, batch_split_choices: kernels_graph keys its graphs by them)."""

    def __init__(self, backend):
        self.backend = backend

    def attention(self, q, k, v, step: Step, caches, layer, scale, window=0, sinks=None):
        # sinks (gpt-oss): (n_head,) f32 on the device, passed to every attention launch
        if step.kind == "batch":
            return self._attention_batch(q, k, v, step, caches, layer, scale, window, sinks)
        if step.kind == "prompts":
            return self._attention_prompts(q, k, v, step, caches, layer, scale, window, sinks)
        return self._attention_tokens(q, k, v, step, caches[0], layer, scale, window, sinks)

    def apply_rope(self, r: Roped):
        """A deferred RoPE applied on its own launch (no cache write fused): the rows rotated
        in place, in r.x itself or in the contiguous copy of its columns."""
        b = self.backend
        x = b.contiguous(r.x)
        n = x.shape[0]
        pos = b.device_ints(r.positions)
        p = r.params
        x3 = x.reshape(n, -1, r.head_dim)
        rope_rows(x3, pos, p.base, rope_style(p), rot_dim=p.n_rot,
                  freq_factors=r.freq_factors, mscale=M.rope_mscale(p), out=x3)
        return x

    def _attention_tokens(self, q, k, v, step: Step, cache: KernelsKVCache, layer, scale,
                          window, sinks=None):
        """Rows start.. of one sequence (start on the host, or None: a graph's, on the device
        in step.positions)."""
        b = self.backend
        start = step.starts[0] if step.starts is not None else None
        positions, start_dev = step.positions, step.positions[0:1]
        d = cache.head_dim
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        fused, q_src, k_src, norms = _rope_sources(q, k, d)
        if fused and d in HEAD_DIMS and self._tensor_core_prefill(k_cache) and \
                _qkv_in_place(q_src, k_src, v):
            qkv = q_src.src
            n = qkv.shape[0]
            out = b.arena.take((n, q_src.width), np.float32)
            self._prefill_in_place(q, q_src, k_src, norms, qkv, cache, layer, start, positions,
                                   out, scale, window, sinks)
            return out
        qa = b.contiguous(q_src if fused else b.materialize(q))
        ka = b.contiguous(k_src if fused else b.materialize(k))
        va = b.contiguous(v)
        n = qa.shape[0]
        q3 = qa.reshape(n, -1, d)
        if fused:
            p = q.params
            rope_kv_cache(ka.reshape(n, -1, d), va.reshape(n, -1, d), k_cache, v_cache,
                          positions, rope_spec(p, q.freq_factors), q=q3,
                          norms=rope_norms(norms))
        else:
            store_rows(ka, va, cache, layer, start_dev)
        if cache.q8 and n > 1:     # prefill reads the rows as f16 (decode reads Q8_0 itself)
            k_cache, v_cache = self._dequantized(cache, layer, start + n)
        out = b.arena.take((n, qa.shape[1]), np.float32)
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
        b = self.backend
        d, first, n = caches[0].head_dim, caches[0], len(caches)
        positions, positions_dev = np.asarray(step.starts), step.positions   # host, device
        if d in HEAD_DIMS and not first.q8 and all(
                c.pool is first.pool and c.slot == first.slot + i for i, c in enumerate(caches)):
            k_all = first.pool.k[layer][first.slot:first.slot + n]
            v_all = first.pool.v[layer][first.slot:first.slot + n]
            qa = self._rope_into_slots(q, k, v, k_all, v_all, positions_dev)
            if qa is None:
                qa, ka, va = (b.contiguous(b.materialize(a)) for a in (q, k, v))
                X.store_kv(ka, va, k_all, v_all, positions_dev)
            q3 = qa.reshape(n, -1, d)
            out = b.arena.take((n, qa.shape[1]), np.float32)
            config = self._decode_config(q3.shape[1], k_all)
            splits = self.batch_splits(caches, positions, window, q3.shape[1], step.splits)
            launch_decode(q3, k_all, v_all, KeyRange(positions_dev, add=1, window=window or None),
                          out.reshape(n, -1, d), scale, config=config,
                          early_kv=b.options.early_kv,
                          workspace=first.pool.workspace(n, q3.shape[1], config, splits),
                          sinks=sinks)
            return out
        qa, ka, va = (b.contiguous(b.materialize(a)) for a in (q, k, v))
        out = b.arena.take((n, qa.shape[1]), np.float32)
        q3, out3 = qa.reshape(n, -1, d), out.reshape(n, -1, d)
        for i, cache in enumerate(caches):
            k_cache, v_cache = cache.k[layer], cache.v[layer]
            pos_dev = positions_dev[i:i + 1]
            store_rows(ka[i:i + 1], va[i:i + 1], cache, layer, pos_dev)
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
        b = self.backend
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
            out = b.arena.take((qkv.shape[0], q_src.width), np.float32)
            rope_kv_cache_cols(qkv, q_src.width // d, k_src.width // d, d, pool.k[layer],
                               pool.v[layer], positions_dev, rope_spec(p, q.freq_factors),
                               slots=slots, slots_dev=slots_dev, norms=rope_norms(norms))
            launch_prefill_seqs(qkv, pool.k[layer], pool.v[layer],
                                out.reshape(qkv.shape[0], -1, d), seqs, scale,
                                seqs_dev=seqs_dev, window=window or None,
                                n_head=q_src.width // d, sinks=sinks)
            return out
        if in_place:
            qkv = q_src.src
            out = b.arena.take((qkv.shape[0], q_src.width), np.float32)
            for cache, start, n, end in zip(caches, starts, counts, ends):
                self._prefill_in_place(q, q_src, k_src, norms, qkv[end - n:end], cache, layer,
                                       int(start), positions_dev[end - n:end],
                                       out[end - n:end], scale, window, sinks)
            return out
        qa, ka, va = (b.contiguous(b.materialize(a)) for a in (q, k, v))
        out = b.arena.take((qa.shape[0], qa.shape[1]), np.float32)
        for cache, start, n, end in zip(caches, starts, counts, ends):
            rows, start_dev = slice(end - n, end), positions_dev[end - n:end - n + 1]
            store_rows(ka[rows], va[rows], cache, layer, start_dev)
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

    def _rope_into_slots(self, q, k, v, k_all, v_all, positions_dev):
        """The batched step's q / k RoPE and K / V writes in one launch, when q, k, v are
        the fused projection's columns (rope_kv_cache_cols with a cache per row: row i into
        k_all[i] / v_all[i] at its position); the rotated q in a new contiguous buffer (the
        decode's input), or None where the columns are not fused."""
        b = self.backend
        d = k_all.shape[-1]
        fused, q_src, k_src, norms = _rope_sources(q, k, d)
        if not fused or not _qkv_in_place(q_src, k_src, v):
            return None
        qkv, p = q_src.src, q.params
        qa = b.arena.take((qkv.shape[0], q_src.width), np.float32)
        rope_kv_cache_cols(qkv, q_src.width // d, k_src.width // d, d, k_all, v_all,
                           positions_dev, rope_spec(p, q.freq_factors), q_out=qa,
                           norms=rope_norms(norms))
        return qa

    def batch_splits(self, caches, positions, window, n_head: int, forced=None) -> int:
        """The split count of a batched step's one attention launch over consecutive pool
        slots, from the step's host positions (each row's keys: position + 1, within the
        window), or `forced` (a step's planned splits: graph warm-up): the batched graphs are
        keyed by it (kernels_graph), since it is fixed in a capture."""
        b = self.backend
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
                            np.dtype(first.dtype).itemsize, b.device)

    def batch_split_choices(self, caches, n_head: int) -> list[int]:
        """Every split count batch_splits can give these caches' slots (powers of two up to
        one full slot's plan): what the scheduler's warm-up captures a graph for."""
        b = self.backend
        first = caches[0]
        if first.q8:
            return [0]
        config = self._decode_config(n_head, first.pool.k[0])
        most = config_splits(config, n_head, first.n_head_kv, first.n_ctx, b.device)
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
                           positions, rope_spec(p, q.freq_factors), norms=rope_norms(norms))
        if cache.q8:
            k_cache, v_cache = self._dequantized(cache, layer, start + n)
        first, first_dev = self._prefill_start(start, positions[0:1])
        launch_prefill(rows, k_cache, v_cache, out.reshape(n, -1, d), first, scale,
                       window=window or None, n_head=q_src.width // d, start_dev=first_dev,
                       sinks=sinks, path=self._tensor_core_path(k_cache))

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
        b = self.backend
        if q3.shape[0] == 1:   # decode: kv_len = position + 1, split over the context
            config = self._decode_config(q3.shape[1], k_cache, direct)
            workspace = None if direct else cache.workspace(q3.shape[1], config)
            # the kernel writing the output (the combine, or the split kernel without splits)
            # also writes the o-projection's Q8_1 activations: no quantize launch for them
            xq = None
            q8_out = b.options.attention_q8
            wanted = q8_out == "all" or (q8_out == "split" and workspace is not None)
            if wanted and quantize_out and b.activations == "q8_1" and q3.shape[2] % 32 == 0:
                xq = b.arena.take(W.q8_buffer_shape(1, q3.shape[1] * q3.shape[2]), np.uint8)
            # early_kv: under PDL the split blocks read the length and start loading older
            # rows before their wait (the kernel before writes only the newest row)
            launch_decode(q3, k_cache, v_cache, KeyRange(start_dev, add=1, window=window or None),
                          out3, scale, workspace=workspace, config=config,
                          early_kv=b.options.early_kv, xq_out=xq, sinks=sinks)
            return xq
        elif self._tensor_core_prefill(k_cache):   # Q, K, V, P rounded to f16 like llama.cpp's
            first, first_dev = self._prefill_start(start, start_dev)
            launch_prefill(q3, k_cache, v_cache, out3, first, scale, window=window or None,
                           start_dev=first_dev, sinks=sinks,
                           path=self._tensor_core_path(k_cache))
        else:                  # prefill: query z sees start + z + 1 keys of the shared cache
            launch_decode(q3, k_cache, v_cache,
                          KeyRange(start_dev, add=1, step=1, stride=0, window=window or None),
                          out3, scale, share_cache=True, sinks=sinks)
        return None

    def _decode_config(self, n_head: int, k_cache, direct: bool = False):
        """Tensor-core decode attention (Q and P rounded to f16) in the llama.cpp-like Q8_1
        mode; activations="f32", the accurate mode, keeps the f32 SIMT kernel."""
        b = self.backend
        group, head_dim = n_head // k_cache.shape[-3], k_cache.shape[-1]
        # a Q8_0 cache is read by the tensor-core kernel alone (in both activation modes)
        if b.activations == "q8_1" or b.device.kind == "cpu" or \
                isinstance(k_cache, Q8Cache):
            config = default_config(group, head_dim, b.device, k_cache.dtype,
                                    b.options.kernel_options)
        else:
            config = gpu_config(group, head_dim, k_cache.dtype)
        if direct:     # no splits: one query head per block
            config = direct_config(config)
        # in the decode graph the split and combine kernels let the next kernel launch at their
        # start (its blocks then prefetch weights meanwhile): 8B @ d4096 +0.5% on an H200
        # (benchmarks/RESULTS.md, "Decode attention's early trigger in the runner")
        return dataclasses.replace(config, early_trigger=b.options.early_trigger)

    def _tensor_core_path(self, k_cache) -> str | None:
        """launch_prefill's path for a tensor-core prefill over this (f16) cache: "wgmma"
        (prefill_wgmma) where the kernel options ask for it and it applies, else None (its
        default: "mma" for f16 caches)."""
        b = self.backend
        wanted = b.options.kernel_options.prefill_wgmma
        if wanted and wgmma_prefill_applies(k_cache.shape[-1], k_cache.dtype, b.device):
            return "wgmma"
        return None

    def _tensor_core_prefill(self, k_cache) -> bool:
        """Flash attention on tensor cores for prefill: f16 cache, sm_80+, and the llama.cpp-like
        Q8_1 activation mode (activations="f32" keeps the f32 SIMT path, the accurate one)."""
        b = self.backend
        return (b.options.tensor_core_prefill and b.activations == "q8_1"
                and (isinstance(k_cache, Q8Cache) or k_cache.dtype == np.float16)
                and mma_available(b.device))


def _head_norms(q, k, head_dim: int):
    """(q weight, k weight, eps) when both q and k are deferred per-head RMSNorms of head_dim
    with one eps (qwen3 / gemma3's q_norm / k_norm), which the RoPE launch can apply; else
    None."""
    if isinstance(q, HeadNormed) and isinstance(k, HeadNormed) and q.eps == k.eps and \
            q.group == k.group == head_dim:
        return q.weight, k.weight, q.eps
    return None


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
