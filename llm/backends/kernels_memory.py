"""Device memory of the kernels backend: uploads with out-of-memory errors people can act on,
the activation arena, the KV cache (its element types: cache_dtype), and the memory report.

Input: host arrays to upload, shapes to allocate. Output: device arrays; `GPUMemoryError` (a
MemoryError) saying how much the model weights and the KV cache need and how much is free.
"""
from __future__ import annotations

import math
import weakref

import numpy as np

import pykernel as pk
from llm.backends.base import KV_CACHE_TYPES, KVCache
from stdlib_kernels.attention.kv_q8 import DTYPE as Q8_DTYPE

MIB = 2 ** 20

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


class GPUMemoryError(MemoryError):
    """Not enough device memory for the model's weights, its KV cache or its activations."""


def _free_total(device) -> tuple[int, int] | None:
    if device.kind != "cuda":
        return None
    from cuda.bindings import driver as cu
    device.activate()
    err, free, total = cu.cuMemGetInfo()
    return (int(free), int(total)) if not int(err) else None


class DeviceMemory:
    def __init__(self, device):
        self.device = device
        self.kv_bytes = 0

    def allocate(self, shape, dtype, what: str, context: str = "") -> pk.Array:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        try:
            return pk.empty(shape, dtype, self.device)
        except MemoryError:
            raise GPUMemoryError(self._message(what, nbytes, context)) from None

    def free_bytes(self) -> int | None:
        """Free device memory now (None on the CPU target)."""
        free_total = _free_total(self.device)
        return None if free_total is None else free_total[0]

    def upload(self, host: np.ndarray, what: str) -> pk.Array:
        out = self.allocate(host.shape, host.dtype, f"tensor {what!r}",
                            "the model's weights are uploaded in their GGUF format")
        out.copy_from(np.ascontiguousarray(host))
        return out

    def _message(self, what: str, nbytes: int, context: str) -> str:
        free_total = _free_total(self.device)
        where = "" if free_total is None else \
            f"; {free_total[0] / MIB:.0f} MiB free of {free_total[1] / MIB:.0f} MiB"
        return (f"out of {self.device.kind} memory allocating {what} ({nbytes / MIB:.1f} MiB)"
                f"{where}. {context}".rstrip() + " Use a smaller context (--ctx / n_ctx=), a "
                "smaller quantization, or a device with more memory.")

    def report(self, weight_bytes: int, activation_bytes: int, scratch_bytes: int = 0) -> dict:
        """scratch_bytes: kernels' own workspaces (the split-K GEMM's partials, the prompts'
        f16 weight scratch once a prompt has used it)."""
        report = {"weights": weight_bytes, "kv_cache": self.kv_bytes,
                  "activations": activation_bytes, "scratch": scratch_bytes}
        report["total"] = sum(report.values())
        free_total = _free_total(self.device)
        if free_total is not None:
            report["device_free"], report["device_total"] = free_total
        return report


def format_report(report: dict) -> str:
    parts = [f"{k} {v / MIB:.1f} MiB" for k, v in report.items()]
    return "device memory: " + ", ".join(parts)


class Arena:
    """Activation buffers handed out in call order and reused by the next forward of the same
    shape sequence (`reset` starts a forward). A slot only grows (a new, larger allocation).
    Layers take from two alternating slot lists (`begin_layer`): nothing a layer takes is read
    two layers later (its input is the previous layer's output, or a residual kept in place),
    so a forward holds two layers' activations, not every layer's: an 8B model's 512-token
    prefill took ~4.8 GB of activations with one list for all layers. What is taken before the
    first layer and after the last (`end_layers`: final norm, logits) has a list of its own."""

    def __init__(self, memory: DeviceMemory, keep_replaced: bool = False):
        self.memory = memory
        self.lists: list[list[pk.Array]] = [[], [], []]   # outside layers, even, odd layers
        # keep_replaced (the arenas whose forwards are captured as CUDA graphs): a slot that
        # grows keeps its old buffer alive, since a graph captured earlier (an earlier layer
        # on the same list, or a shorter prompt's graph) may still read it. Such a slot at
        # least doubles when it grows, so what it keeps stays under its final size: prompts
        # captured in rising lengths 8, 16, ..., 256 would otherwise keep every length's
        # buffers
        self.replaced: list[pk.Array] | None = [] if keep_replaced else None
        self.slots = self.lists[0]
        self.next = 0
        self._outer_next = 0

    def reset(self) -> None:
        self.slots = self.lists[0]
        self.next = 0

    def begin_layer(self, layer: int) -> None:
        if self.slots is self.lists[0]:
            self._outer_next = self.next
        self.slots = self.lists[1 + layer % 2]
        self.next = 0

    def end_layers(self) -> None:
        if self.slots is not self.lists[0]:
            self.slots = self.lists[0]
            self.next = self._outer_next

    def take(self, shape, dtype) -> pk.Array:
        # on the eager prefill's hot path (hundreds of calls per forward): one view, no numpy
        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = max(1, math.prod(shape) * dtype.itemsize)
        if self.next == len(self.slots):
            self.slots.append(self._alloc(nbytes))
        elif self.slots[self.next].nbytes < nbytes:
            if self.replaced is not None:
                old = self.slots[self.next]
                self.replaced.append(old)
                nbytes = max(nbytes, 2 * old.nbytes)
            self.slots[self.next] = self._alloc(nbytes)
        slot = self.slots[self.next]
        self.next += 1
        return slot.view_as(shape, dtype)

    def _alloc(self, nbytes: int) -> pk.Array:
        nbytes = -(-nbytes // 256) * 256   # keeps every view 16-byte aligned for vector loads
        return self.memory.allocate((nbytes,), np.uint8, "activations",
                                    "Activations grow with the prompt step "
                                    "(PYKERNEL_PREFILL_GRAPH_MAX=N sets its largest size).")

    @property
    def nbytes(self) -> int:
        kept = sum(s.nbytes for s in self.replaced or ())
        return kept + sum(s.nbytes for slots in self.lists for s in slots)


def _release_kv(memory: DeviceMemory, accounted: list) -> None:
    memory.kv_bytes -= accounted[0]


class KVPool:
    """K and V of `n_slots` sequences per layer: (n_slots, n_head_kv, n_ctx, head_dim) of
    `dtype` (float16, float32, or "q8_0": a stdlib Q8Cache, int8 quants plus an f16 scale per
    32 values); f16 / f32 layers are views of one (n_layer, n_slots, ...) allocation each for
    K and V (k_all, v_all). Sequence s's cache is the contiguous view [s], so a batched decode
    over consecutive slots reads them as one (n_seq, ...) cache."""

    def __init__(self, memory: DeviceMemory, n_slots, n_layer, n_ctx, n_head_kv, head_dim, dtype,
                 weight_bytes: int):
        from stdlib_kernels.attention import kv_q8
        self.n_slots, self.n_ctx = n_slots, n_ctx
        self.q8 = isinstance(dtype, str) and dtype == kv_q8.DTYPE
        self.dtype = kv_q8.DTYPE if self.q8 else np.dtype(dtype)
        shape = (n_slots, n_head_kv, n_ctx, head_dim)
        element = kv_q8.BYTES_PER_VALUE if self.q8 else self.dtype.itemsize
        total = int(2 * n_layer * int(np.prod(shape)) * element)
        slots = f"{n_slots} sequences of {n_ctx} tokens" if n_slots > 1 else f"{n_ctx} tokens"
        context = (f"The KV cache for {slots} needs {total / MIB:.1f} MiB in all "
                   f"({n_layer} layers x K and V of {shape[1:]} {self.dtype}"
                   f"{f' x {n_slots}' if n_slots > 1 else ''}); the model's weights "
                   f"take {weight_bytes / MIB:.1f} MiB.")
        self.k, self.v = [], []
        # f16 / f32: one allocation for all layers' K (and one for V), each layer a view of
        # it, so one pointer reaches every layer (the persistent decode step,
        # llm/backends/persistent_decode.py); q8_0: one allocation per layer and K / V
        self.k_all = self.v_all = None
        if not self.q8:
            self.k_all, self.v_all = (memory.allocate((n_layer, *shape), self.dtype,
                                                      f"KV cache {name} (all layers)", context)
                                      for name in ("K", "V"))
            self.k, self.v = [self.k_all[il] for il in range(n_layer)], \
                [self.v_all[il] for il in range(n_layer)]
        for il in range(n_layer if self.q8 else 0):
            for name, into in (("K", self.k), ("V", self.v)):
                what = f"KV cache layer {il} {name}"
                into.append(kv_q8.allocate(shape, allocate=lambda sh, dt, what=what:
                                           memory.allocate(sh, dt, what, context)))
        self.nbytes = total
        memory.kv_bytes += total
        self.memory = memory
        # the memory report counts live caches: a dropped cache (bench runs one per depth)
        # gives its bytes back; a list, so the finalizer does not hold the pool itself
        self.accounted = [total]
        weakref.finalize(self, _release_kv, memory, self.accounted)
        self._workspaces: dict = {}
        self.prefill_graphs: dict = {}  # kernels_graph: bucket -> PrefillGraph (graph_slots)

    def slot(self, array, s: int):
        from stdlib_kernels.attention.kv_q8 import Q8Cache
        if self.q8:
            return Q8Cache(array.quants[s], array.scales[s])
        return array[s]

    def workspace(self, n_seq: int, n_head: int, config, splits: int):
        """Split partials of a decode attention over n_seq slots with `config` and `splits`
        (stdlib attention.batch_splits, planned per step from the slots' lengths)."""
        from stdlib_kernels.attention.decode import DecodeWorkspace
        key = (n_seq, n_head, config, splits)
        if key not in self._workspaces:
            self._workspaces[key] = DecodeWorkspace.allocate(n_seq, n_head,
                                                             self.k[0].shape[-1], splits)
        return self._workspaces[key]


class KernelsKVCache(KVCache):
    """K and V per layer: (n_head_kv, n_ctx, head_dim) of `dtype`, slot `slot` of a KVPool
    (a pool of its own unless one is given), allocated up front."""

    def __init__(self, memory: DeviceMemory, n_layer, n_ctx, n_head_kv, head_dim, dtype,
                 weight_bytes: int, pool: KVPool | None = None, slot: int = 0):
        self.pool = pool or KVPool(memory, 1, n_layer, n_ctx, n_head_kv, head_dim, dtype,
                                   weight_bytes)
        self.slot = slot
        self.n_layer, self.n_ctx, self.n_head_kv = n_layer, n_ctx, n_head_kv
        self.head_dim, self.head_dim_v = head_dim, head_dim
        self.q8, self.dtype = self.pool.q8, self.pool.dtype
        self.k = [self.pool.slot(a, slot) for a in self.pool.k]
        self.v = [self.pool.slot(a, slot) for a in self.pool.v]
        self.k_bytes = self.pool.nbytes // self.pool.n_slots
        self._memory = memory
        self._f16_rows = None   # q8_0: one layer's K and V as f16, the prefill attention's input
        self._workspaces: dict = {}
        self.graph = None     # set by kernels_graph: the captured decode step on this cache
        self.graphs: dict = {}  # kernels_graph: its decode graphs (short/long context, pick)
        self.uniforms = None    # kernels_graph: sampled decode graphs' uniform per position
        # kernels_graph: prompt length bucket -> PrefillGraph of this cache alone (graphs that
        # cannot move between slots, graph_slots); the others are the pool's prefill_graphs
        self.own_prefill_graphs: dict = {}

    @property
    def prefill_graphs(self) -> dict:
        """Prompt length bucket -> PrefillGraph that a prompt into this cache replays: its
        own, then its pool's (captured on any slot, re-pointed at this one)."""
        return {**self.pool.prefill_graphs, **self.own_prefill_graphs}

    def copy_from(self, other: "KernelsKVCache", n_rows: int) -> None:
        """Every layer's K and V of `other` (same shape and type) into this cache: whole
        layers (a row range would take one copy per head), on the legacy default stream,
        which the backend's blocking stream waits for."""
        for mine, theirs in zip(self.k + self.v, other.k + other.v):
            if self.q8:
                mine.quants.copy_from(theirs.quants)
                mine.scales.copy_from(theirs.scales)
            else:
                mine.copy_from(theirs)

    def f16_rows(self):
        """q8_0 caches: (K, V) f16 buffers of one layer's shape, allocated on first use, into
        which a prefill dequantizes the rows it attends to."""
        if self._f16_rows is None:
            shape = (self.n_head_kv, self.n_ctx, self.head_dim)
            context = ("A q8_0 KV cache's prefill reads one layer's keys and values as f16 "
                       "(two buffers of one f16 layer's size).")
            self._f16_rows = tuple(self._memory.allocate(shape, np.float16, f"KV rows {n}",
                                                         context) for n in ("K", "V"))
            rows = sum(a.nbytes for a in self._f16_rows)
            self._memory.kv_bytes += rows
            self.pool.accounted[0] += rows
        return self._f16_rows

    @property
    def nbytes(self) -> int:
        return self.k_bytes

    def workspace(self, n_head: int, config):
        """Split partials of the decode attention with `config`, sized for the whole context."""
        from stdlib_kernels.attention.decode import DecodeWorkspace
        from stdlib_kernels.attention.decode_plan import config_splits
        key = (n_head, config)
        if key not in self._workspaces:
            splits = config_splits(config, n_head, self.n_head_kv, self.n_ctx)
            self._workspaces[key] = DecodeWorkspace.allocate(1, n_head, self.head_dim, splits)
        return self._workspaces[key]
