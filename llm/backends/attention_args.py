"""What the kernels backend's attention launches take, built from the model's values: a prompts
step's slot tables (prompt_tables), the RoPE launch's spec and head norms, and the K/V row
store of models whose cache write is not fused into RoPE (store_rows)."""
from __future__ import annotations

import numpy as np

import pykernel as pk
from llm.backends import kernels_extra as X
from llm.backends import kernels_moe as M
from llm.backends.kernels_memory import KernelsKVCache
from llm.config import RopeParams
from llm.step import Step
from stdlib_kernels.attention import kv_q8
from stdlib_kernels.rotary import HeadNorms, RopeSpec


def prompt_tables(caches, step: Step) -> tuple | None:
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


def store_rows(k, v, cache: KernelsKVCache, layer: int, start_dev) -> None:
    """k, v rows into the layer's cache from position start_dev[0] on (Q8_0 or f16/f32)."""
    store = kv_q8.store_rows if cache.q8 else X.store_kv
    store(k, v, cache.k[layer], cache.v[layer], start_dev)


def rope_style(p: RopeParams) -> str:
    return "neox" if p.neox else "normal"


def rope_spec(p: RopeParams, freq_factors) -> RopeSpec:
    return RopeSpec(p.base, rope_style(p), p.n_rot, freq_factors, mscale=M.rope_mscale(p))


def rope_norms(norms) -> HeadNorms | None:
    """kernels_attention._head_norms' (q weight, k weight, eps) as the RoPE launch's HeadNorms."""
    return None if norms is None else HeadNorms(*norms)
