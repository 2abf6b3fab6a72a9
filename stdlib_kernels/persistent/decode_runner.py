"""Host side of the persistent decode step (decode.py's kernel): device buffers and launches.

    runner = DecodeRunner(sched, weights, eps=..., scale=..., rope_theta=..., rot_dim=...,
                          neox=..., cache_dtype=np.float16)
    runner.set_cache(layer, k, v)            # rows already in its own KV cache (a prefill's)
    logits = runner.step(token, pos)         # io upload, one launch, logits read back
    runner.bind_cache(k_all, v_all, kv_base, kv_layer)   # or: another KV cache (the runner's)
    runner.launch(io, stream)                # graph-capturable: io stays on the device

weights: decode_weights' buffer (numpy or device uint8, sched.weight_bytes); the xq buffer
(sched.xq_words u32, the QUANT items' Q8_1 inputs) is the runner's. The kernel's
specialisation: the cache type C, NeoX RoPE, PREFETCH (the L2 prefetch of an item's weights
before its wait: sm_90+ GPUs and the CPU target) and PROFILE (profile=True: per-item globaltimer stamps,
read with `profile()`; decode_profile.py).
"""
from __future__ import annotations

import math

import numpy as np

import pykernel as pk

from .chain import device_tables, launch_grid
from .decode import WARPS, decode_kernel
from .decode_schedule import DecodeSchedule, validate_decode
from .decode_take import PROF_COLS

CACHE_TYPES = (np.dtype(np.float16), np.dtype(np.float32))
XQ_POISON = 0xFFFFFFFF     # a Q8_1 block nobody wrote has NaN scales: its dots show it


def bulk_prefetch_available() -> bool:
    """Whether the current device has cp.async.bulk.prefetch (sm_90+; the CPU target checks
    it and copies nothing)."""
    arch = pk.current_device().arch
    digits = "".join(ch for ch in arch.split("_")[-1] if ch.isdigit())
    return arch == "cpu" or (arch.startswith("sm_") and int(digits or 0) >= 90)


def decode_grid(cache_dtype, neox: bool, profile: bool = False) -> int:
    """The co-resident grid of decode_kernel's build for this cache type (what DecodeRunner
    launches by default; decode_plan.plan_items sizes the items for it)."""
    return launch_grid("decode_grid", None, decode_kernel, WARPS * 32, NEOX=bool(neox),
                       C=np.dtype(cache_dtype), PREFETCH=bulk_prefetch_available(),
                       PROFILE=bool(profile))


class DecodeRunner:
    """Device buffers for one model's decode schedule: weights, activations, a KV cache (its
    own, or one bound with bind_cache), io, tables, counters; `launch` runs one token in one
    launch of `grid` blocks (default: the co-resident grid)."""

    def __init__(self, sched: DecodeSchedule, weights, *, eps: float, scale: float,
                 rope_theta: float, rot_dim: int, neox: bool, grid: int | None = None,
                 cache_dtype=np.float32, own_cache: bool = True, profile: bool = False):
        validate_decode(sched)
        s = sched.shape
        if weights.dtype != np.uint8 or weights.size != sched.weight_bytes:
            raise ValueError(f"DecodeRunner: weights must be uint8 with {sched.weight_bytes} "
                             f"bytes (decode_weights), got {weights.dtype} "
                             f"{tuple(weights.shape)}")
        if rot_dim % 2 or not 0 < rot_dim <= s.head_dim:
            raise ValueError(f"DecodeRunner: rot_dim must be even and in (0, {s.head_dim}], "
                             f"got {rot_dim}")
        if np.dtype(cache_dtype) not in CACHE_TYPES:
            raise ValueError(f"DecodeRunner: cache_dtype must be float16 or float32, got "
                             f"{cache_dtype}")
        self.sched, self.neox, self.cache_dtype = sched, bool(neox), np.dtype(cache_dtype)
        self.rope = (int(rot_dim), math.log2(rope_theta), float(eps), float(scale))
        w8 = pk.to_device(weights) if isinstance(weights, np.ndarray) else weights
        self.weights = (w8, w8.view(np.uint16), w8.view(np.uint32), w8.view(np.float32))
        self.acts = pk.full(sched.act_elems, np.nan, np.float32)   # unwritten values show
        self.xq = pk.full(sched.xq_words, XQ_POISON, np.uint32)      # d, s = f16 NaN
        cache = (s.n_layer, s.n_head_kv, s.n_ctx, s.head_dim)   # own_cache=False: bind one
        self.cache_k = pk.zeros(cache, self.cache_dtype) if own_cache else None
        self.cache_v = pk.zeros(cache, self.cache_dtype) if own_cache else None
        self.kv_base, self.kv_layer = 0, s.n_head_kv * s.n_ctx * s.head_dim
        self.io = pk.zeros(2, np.int32)
        self.items, self.stages, self.counters = device_tables(sched)
        self.profiling = bool(profile)
        self.prof = pk.zeros(sched.n_items * PROF_COLS if profile else 1, np.uint64)
        self.block = WARPS * 32
        self.grid = launch_grid("DecodeRunner", grid, decode_kernel, self.block,
                                **self._consts())

    def _consts(self) -> dict:
        return {"NEOX": self.neox, "C": self.cache_dtype, "PREFETCH": bulk_prefetch_available(),
                "PROFILE": self.profiling}

    def bind_cache(self, k, v, kv_base: int, kv_layer: int) -> None:
        """Read and write another KV cache: K and V arrays of this runner's cache type where
        layer l, KV head h, row p starts at element kv_base + l kv_layer + (h n_ctx + p)
        head_dim (the runner's KVPool: one allocation per K and V for all layers)."""
        s = self.sched.shape
        need = kv_base + (s.n_layer - 1) * kv_layer + s.n_head_kv * s.n_ctx * s.head_dim
        for name, a in (("K", k), ("V", v)):
            if a.dtype != self.cache_dtype or a.size < need or kv_base < 0 or \
                    kv_layer < s.n_head_kv * s.n_ctx * s.head_dim:
                raise ValueError(f"DecodeRunner.bind_cache: {name} must be {self.cache_dtype} "
                                 f"with at least {need} elements for kv_base {kv_base}, "
                                 f"kv_layer {kv_layer}; got {a.dtype} {a.size}")
        self.cache_k, self.cache_v, self.kv_base, self.kv_layer = k, v, kv_base, kv_layer

    def set_cache(self, layer: int, k, v) -> None:
        """K and V rows 0..n-1 of `layer` in the runner's own cache: (n_head_kv, n, head_dim)
        each (a prefill's)."""
        s = self.sched.shape
        k, v = np.asarray(k), np.asarray(v)
        if k.shape != v.shape or k.ndim != 3 or k.shape[0] != s.n_head_kv or \
                k.shape[2] != s.head_dim or k.shape[1] > s.n_ctx:
            raise ValueError(f"DecodeRunner.set_cache: K and V must be (n_head_kv={s.n_head_kv}"
                             f", rows <= {s.n_ctx}, head_dim={s.head_dim}), got {k.shape} and "
                             f"{v.shape}")
        if self.cache_k is None or self.kv_base or self.cache_k.shape != (s.n_layer, s.n_head_kv, s.n_ctx, s.head_dim):
            raise ValueError("DecodeRunner.set_cache: a bound cache is written by its owner")
        for dev, rows in ((self.cache_k, k), (self.cache_v, v)):
            host = dev.numpy()
            host[layer, :, :rows.shape[1]] = rows.astype(self.cache_dtype)
            dev.copy_from(host)

    def set_io(self, token: int, pos: int) -> None:
        s = self.sched.shape
        if not 0 <= token < s.n_vocab or not 0 <= pos < s.n_ctx:
            raise ValueError(f"DecodeRunner: token {token} must be in [0, {s.n_vocab}) and "
                             f"position {pos} in [0, {s.n_ctx}) (the cache's rows)")
        self.io.copy_from(np.array([token, pos], np.int32))

    def reset(self) -> None:
        """Zero the counters from the host (only needed after a launch that failed)."""
        self.counters.fill(0)

    def launch(self, io=None, stream=None) -> None:
        """One token: io (default self.io) = [token, pos] on the device; nothing else leaves
        the device, so the launch can sit in a captured graph after the argmax that writes io."""
        s, c = self.sched.shape, self._consts()
        if self.cache_k is None:
            raise ValueError("DecodeRunner.launch: no KV cache (own_cache=False: bind_cache)")
        decode_kernel[self.grid, self.block, stream](
            *self.weights, self.acts, self.xq, self.cache_k, self.cache_v,
            self.io if io is None else io,
            self.items, self.stages, self.counters, self.prof, self.sched.n_items,
            self.sched.n_stages, s.n_vocab, s.n_head, s.n_head_kv, s.head_dim, s.n_ctx,
            self.kv_base, self.kv_layer, *self.rope[:2], *self.rope[2:], c["NEOX"], c["C"],
            c["PREFETCH"], c["PROFILE"])

    def profile(self) -> np.ndarray:
        """The last launch's item stamps, (n_items, PROF_COLS) uint64 globaltimer ns
        (decode_take: TAKEN, READY, PREPPED, DONE); only with profile=True."""
        if not self.profiling:
            raise ValueError("DecodeRunner.profile: built without profile=True")
        return self.prof.numpy().reshape(self.sched.n_items, PROF_COLS)

    def logits_array(self):
        """The logits (n_vocab,) as a device view of the activation buffer."""
        off, n = self.sched.acts["logits"]
        return self.acts[off:off + n]

    def logits(self) -> np.ndarray:
        return self.logits_array().numpy()

    def step(self, token: int, pos: int) -> np.ndarray:
        """Logits (n_vocab,) after `token` at `pos`; K/V row pos of every layer written."""
        self.set_io(token, pos)
        self.launch()
        return self.logits()
