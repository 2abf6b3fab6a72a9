"""Host side of decode attention: launches the kernel configuration decode_plan picks.

Input: device arrays (pykernel Arrays): q (n_seq, n_head, D) f32, K/V caches
(n_seq, n_kv_head, max_len, D) or (n_kv_head, max_len, D) in f16 or f32, kv lengths as a device
int32 array; an output (n_seq, n_head, D) f32 and a `DecodeWorkspace` for the split partials.
Output: the attention result written into `out` (nothing is allocated per call when the
caller passes `workspace`, so the launches can be captured in a CUDA graph).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import pykernel as pk

from .decode_combine import COMBINE_UNROLL, MAX_SPLITS, combine_geometry, combine_splits
from .decode_bulk import decode_bulk
from .decode_kernels import LOG2E, decode_partial
from .decode_mma import decode_mma
from .decode_plan import (BULK_MAX_WARPS, MMA_MAX_HEADS, DecodeConfig, bulk_shared_bytes,
                          default_config, multiprocessors)
from .kv_q8 import DTYPE as Q8_DTYPE, Q8Cache
from ..quant.q8_1 import q8_1_bytes, quantize_q8_1_into

HEAD_DIMS = (64, 80, 96, 128, 256)
DEFAULT_FUSED = False        # workspaces combine in the last split block (one launch)
MAX_CLUSTER_SPLITS = 16      # blocks per thread-block cluster (sm_90, non-portable above 8)


@dataclass(frozen=True)
class KeyRange:
    """The keys each query row z of a decode launch sees: kv_len(z) = lens[z * stride] + add +
    z * step (the query sits at position kv_len - 1), the last `window` of them (None or 0:
    all). lens: device int32, read by the kernel (a captured graph replays with new values).
    Decode: KeyRange(positions, add=1); the prefill fallback over one shared cache:
    KeyRange(start, add=first + 1, step=1, stride=0)."""
    lens: pk.Array
    add: int = 0
    step: int = 0
    stride: int = 1
    window: int | None = None


@dataclass
class DecodeWorkspace:
    """Preallocated split partials: o (n_seq, n_head, n_splits, D), ml (..., n_splits, 2).
    counters None (DEFAULT_FUSED False): two launches, split kernel + combine_splits. With
    fused=True, zeroed per-(sequence, head group) arrival counters: one launch whose last split
    block per head group combines (it resets its counter, so graph replays reuse them). Both
    use the parallel combine; on the H200 one launch measured within ~1 us of two, slightly
    behind at most lengths (benchmarks/RESULTS.md, "Attention").
    cluster=True (tensor-core kernel, sm_90+ or the CPU target, n_splits <= MAX_CLUSTER_SPLITS):
    one launch whose split blocks of a head group form a thread-block cluster and merge in
    distributed shared memory (decode_kernels.cluster_merge); no partials, no counters."""
    part_o: pk.Array
    part_ml: pk.Array
    n_splits: int
    counters: pk.Array | None = None
    cluster: bool = False

    @classmethod
    def allocate(cls, n_seq: int, n_head: int, head_dim: int, n_splits: int, device=None,
                 fused: bool | None = None, cluster: bool = False):
        fused = DEFAULT_FUSED if fused is None else fused
        if not 1 <= n_splits <= MAX_SPLITS:
            raise ValueError(f"attention.decode: {n_splits} splits, expected 1..{MAX_SPLITS}")
        if cluster:
            if not 2 <= n_splits <= MAX_CLUSTER_SPLITS:
                raise ValueError(f"attention.decode: a cluster merge needs 2..."
                                 f"{MAX_CLUSTER_SPLITS} splits (blocks per cluster), got "
                                 f"{n_splits}")
            empty = pk.empty((1,), np.float32, device)     # never read
            return cls(empty, empty, n_splits, None, True)
        part_o = pk.empty((n_seq, n_head, n_splits, head_dim), np.float32, device)
        part_ml = pk.empty((n_seq, n_head, n_splits, 2), np.float32, device)
        counters = pk.zeros((n_seq * n_head,), np.int32, device) if fused else None
        return cls(part_o, part_ml, n_splits, counters)



def _lane_layout(head_dim: int, itemsize: int, max_lanes: int = 32) -> dict:
    """L lanes per key row, NCH 16-byte chunks per lane of CH elements each."""
    ch = 16 // itemsize
    if head_dim % ch:
        raise ValueError(f"attention: head_dim {head_dim} must be a multiple of {ch} "
                         f"(16-byte rows of {itemsize}-byte elements)")
    chunks = head_dim // ch
    lanes = min(max_lanes, 1 << (chunks - 1).bit_length())
    return dict(L=lanes, LOG2L=lanes.bit_length() - 1, LOG2KPW=(32 // lanes).bit_length() - 1,
                CH=ch, NCH=-(-chunks // lanes))


def decode_kernel(config: DecodeConfig):
    if config.bulk:
        return decode_bulk
    return decode_mma if config.mma else decode_partial


def decode_spec(head_dim: int, dtype, config: DecodeConfig, fused: bool = False,
                trigger: bool = False, early_kv: bool = False, q8_out: bool = False,
                cluster: bool = False, sink: bool = False) -> dict:
    """The compile-time arguments of decode_kernel(config) (also used to precompile);
    fused=True only for workspaces with counters (the one-launch variant); trigger and
    early_kv: TRIGGER and EARLY_KV of decode_kernels' docstring; q8_out: a direct (one split)
    launch also writes its rows as Q8_1 (launch_decode's xq_out); sink: per-head sink logits
    (launch_decode's sinks)."""
    q8 = isinstance(dtype, str) and dtype == Q8_DTYPE
    if q8 and not config.mma:
        raise ValueError("attention.decode: a Q8_0 cache needs the tensor-core kernel "
                         "(mma_config)")
    dtype = np.dtype(np.float16 if q8 else dtype)
    if config.bulk:
        if q8 or dtype != np.float16 or head_dim % 32 or cluster or \
                config.heads_per_block > MMA_MAX_HEADS or not 1 <= config.warps <= BULK_MAX_WARPS:
            raise ValueError(f"attention.decode: the bulk-copy kernel needs an f16 cache, "
                             f"head_dim % 32 == 0, <= {MMA_MAX_HEADS} heads and 1..."
                             f"{BULK_MAX_WARPS} warps per block, no cluster; got {dtype}, "
                             f"{head_dim}, {config.heads_per_block} heads, {config.warps} warps")
        return dict(D=head_dim, GB=config.heads_per_block, NWARPS=config.warps,
                    S=config.stages, FUSED=int(fused), MAXS=MAX_SPLITS, UNR=COMBINE_UNROLL,
                    TRIGGER=int(trigger), EARLY_KV=int(early_kv), Q8OUT=int(q8_out),
                    SINK=int(sink),
                    **combine_geometry(config.heads_per_block, head_dim, 32 * config.warps))
    if config.mma:
        if dtype != np.float16 or head_dim % 32 or config.heads_per_block > MMA_MAX_HEADS:
            raise ValueError(f"attention.decode: the tensor-core kernel needs an f16 or Q8_0 "
                             f"cache, head_dim % 32 == 0 and <= {MMA_MAX_HEADS} heads per "
                             f"block; got {dtype}, {head_dim}, {config.heads_per_block}")
        return dict(D=head_dim, GB=config.heads_per_block, NWARPS=config.warps,
                    P=config.stages, FUSED=int(fused), MAXS=MAX_SPLITS, UNR=COMBINE_UNROLL,
                    Q8=int(q8), TRIGGER=int(trigger), EARLY_KV=int(early_kv),
                    Q8OUT=int(q8_out), CLUSTER=int(cluster), SINK=int(sink),
                    **combine_geometry(config.heads_per_block, head_dim, 32 * config.warps))
    if cluster:
        raise ValueError("attention.decode: the cluster merge needs the tensor-core kernel "
                         "(mma_config)")
    return dict(D=head_dim, GB=config.heads_per_block, NWARPS=config.warps, U=config.unroll,
                P=config.stages, HALF=int(dtype == np.float16), FUSED=int(fused),
                MAXS=MAX_SPLITS, UNR=COMBINE_UNROLL, TRIGGER=int(trigger), EARLY_KV=int(early_kv),
                Q8OUT=int(q8_out), SINK=int(sink),
                **combine_geometry(config.heads_per_block, head_dim, 32 * config.warps),
                **_lane_layout(head_dim, dtype.itemsize, config.lanes))


def combine_warps(n_splits: int) -> int:
    """combine_splits' warps per (z, head) row: enough split groups that each thread loads
    at most ~COMBINE_UNROLL partials (one round of L2 latency), 4 to 16 warps."""
    return 4 if n_splits <= 4 * COMBINE_UNROLL else 8 if n_splits <= 8 * COMBINE_UNROLL else 16


def combine_spec(head_dim: int, warps: int = 4, trigger: bool = False,
                 q8_out: bool = False, sink: bool = False) -> dict:
    return dict(D=head_dim, NWARPS=warps, MAXS=MAX_SPLITS, UNR=COMBINE_UNROLL,
                TRIGGER=int(trigger), Q8OUT=int(q8_out), SINK=int(sink),
                **combine_geometry(1, head_dim, 32 * warps))


def check_decode_shapes(q, k_cache, v_cache):
    if q.ndim != 3 or q.dtype != np.float32:
        raise ValueError(f"attention.decode: q must be (n_seq, n_head, head_dim) float32, got "
                         f"{q.shape} {q.dtype}")
    q8 = isinstance(k_cache, Q8Cache)
    if q8 != isinstance(v_cache, Q8Cache) or k_cache.shape != v_cache.shape or \
            (not q8 and k_cache.dtype != v_cache.dtype):
        raise ValueError(f"attention.decode: k_cache {k_cache.shape} {k_cache.dtype} and v_cache "
                         f"{v_cache.shape} {v_cache.dtype} must match")
    if (not q8 and k_cache.dtype not in (np.float16, np.float32)) or k_cache.ndim not in (3, 4):
        raise ValueError(f"attention.decode: caches must be (n_kv_head, max_len, head_dim) or "
                         f"(n_seq, n_kv_head, max_len, head_dim) float16/float32 (or Q8Cache), "
                         f"got {k_cache.shape} {k_cache.dtype}")
    n_seq, n_head, head_dim = q.shape
    n_kv_head, _, cache_dim = k_cache.shape[-3:]
    if cache_dim != head_dim or n_head % n_kv_head:
        raise ValueError(f"attention.decode: q {q.shape} does not fit caches {k_cache.shape} "
                         f"(same head_dim, n_head a multiple of n_kv_head)")
    if k_cache.ndim == 4 and k_cache.shape[0] != n_seq:
        raise ValueError(f"attention.decode: caches hold {k_cache.shape[0]} sequences, q {n_seq}")


def _cache_args(k_cache, v_cache, config: DecodeConfig) -> tuple:
    """The kernel's cache pointers: words of f16/f32 (or int8 quants), and for the tensor-core
    kernel the Q8_0 scales (an unread stand-in for other caches)."""
    if isinstance(k_cache, Q8Cache):
        return (k_cache.quants.view(np.uint32), v_cache.quants.view(np.uint32),
                k_cache.scales.view(np.uint16), v_cache.scales.view(np.uint16))
    words = (k_cache.view(np.uint32), v_cache.view(np.uint32))
    if config.mma and not config.bulk:
        return words + (k_cache.view(np.uint16), v_cache.view(np.uint16))
    return words


def check_sinks(sinks, n_head: int, who: str):
    """sinks: None or a device float32 array of n_head values."""
    if sinks is not None and (not isinstance(sinks, pk.Array) or sinks.dtype != np.float32
                              or sinks.size != n_head):
        raise ValueError(f"{who}: sinks must be a device float32 array of n_head = {n_head} "
                         f"values, got {type(sinks).__name__} "
                         f"{getattr(sinks, 'dtype', '')} {tuple(getattr(sinks, 'shape', ()))}")


def _sink_arg(sinks, stand_in):
    """The kernels' sinks pointer: an unread stand-in when there are none (SINK = 0)."""
    return (stand_in if sinks is None else sinks).reshape(-1)


def _under_pdl(device) -> bool:
    """Launches are being captured into a PDL graph (capture_graph(pdl=True))."""
    return bool(getattr(device, "programmatic_launch", False))


def _one_wave(threads: int, device=None) -> int:
    """Blocks of `threads` threads that fit at once by the thread limit (2048 per SM)."""
    return multiprocessors(device) * max(1, 2048 // threads)


def _q8_words(xq_out, out):
    """The kernels' Q8_1 output as u32 words; without one, `out` stands in (never written
    through it: Q8OUT is 0 then)."""
    return (out if xq_out is None else xq_out).reshape(-1).view(np.uint32)


def launch_split_kernel(q, k_cache, v_cache, keys: KeyRange, out, scale: float, *,
                        softcap=None, workspace: DecodeWorkspace | None = None,
                        config: DecodeConfig | None = None, stream=None,
                        share_cache: bool = False, early_kv: bool = False,
                        xq_out=None, sinks=None) -> bool:
    """The first launch of launch_decode alone (same arguments, shapes already checked): the
    split kernel, which also combines when the workspace has counters (returns True then).
    xq_out: Q8_1 rows, written here only by a direct (one split) launch. Benchmarks time it
    without the combine kernel."""
    n_seq, n_head, head_dim = q.shape
    n_kv_head, max_len = k_cache.shape[-3], k_cache.shape[-2]
    config = config or default_config(n_head // n_kv_head, head_dim, q.device, k_cache.dtype)
    n_sub = n_head // n_kv_head // config.heads_per_block
    n_splits = workspace.n_splits if workspace is not None else 1
    z_stride = 0 if (share_cache or k_cache.ndim == 3) else n_kv_head * max_len * head_dim
    use_softcap = softcap is not None and softcap > 0
    q_scale = float(scale) if use_softcap else float(scale) * LOG2E
    direct = n_splits == 1
    cluster = not direct and workspace.cluster
    part_o = out if direct else workspace.part_o
    part_ml = out if direct else workspace.part_ml
    has_counters = workspace is not None and workspace.counters is not None
    counters = workspace.counters if has_counters else keys.lens   # not read unless fused
    caches = _cache_args(k_cache, v_cache, config)
    pdl = q.device.kind == "cuda" and _under_pdl(q.device)
    blocks = n_splits * n_kv_head * n_sub * n_seq
    trigger = pdl and config.early_trigger and \
        blocks <= multiprocessors(q.device) * config.blocks_per_sm      # one wave
    # the promise covers one new row per sequence: not the prefill fallback, nor Q8_0 (a line
    # of its scales holds 16 rows). The CPU target runs kernels one after another, so the
    # same code path runs there (tests cover it without a GPU)
    early = early_kv and (pdl or q.device.kind == "cpu") and keys.step == 0 and \
        not share_cache and not isinstance(k_cache, Q8Cache)
    q8_out = (direct or cluster) and xq_out is not None
    grid = (n_splits, n_kv_head * n_sub, n_seq)
    spec = decode_spec(head_dim, k_cache.dtype, config, has_counters, trigger, early, q8_out,
                       cluster, sinks is not None)  # first: it names a configuration's errors
    dynamic = bulk_shared_bytes(config, head_dim) if config.bulk else 0
    decode_kernel(config)[grid, 32 * config.warps, stream, dynamic, (n_splits, 1, 1) if cluster
                          else None](
        q, *caches, keys.lens, keys.stride, keys.add, keys.step, z_stride, max_len, n_head,
        n_kv_head, q_scale, float(softcap) if use_softcap else 0.0, int(keys.window or 0),
        int(direct), out, part_o, part_ml, counters,
        _q8_words(xq_out if q8_out else None, out), sinks=_sink_arg(sinks, out), **spec)
    return not direct and (has_counters or cluster)


def launch_decode(q, k_cache, v_cache, keys: KeyRange, out, scale: float, *, softcap=None,
                  workspace: DecodeWorkspace | None = None, config: DecodeConfig | None = None,
                  stream=None, share_cache: bool = False, early_kv: bool = False,
                  xq_out=None, sinks=None):
    """Attention of each q row z against its cache over the keys `keys` gives it (KeyRange:
    kv_len(z) and the window). share_cache: all rows read one (n_kv_head, max_len, D) cache
    (prefill fallback). Without a workspace, or with one of one split, the kernel writes `out`
    directly; otherwise it writes partials and, with the workspace's counters, its last block
    per head group combines them (else combine_splits).
    early_kv (a promise, used only when captured under PDL): the kernels before this launch in
    the graph write neither `keys.lens` nor any cache row other than each sequence's newest
    (kv_len - 1), as a decode step's KV-cache write does; the split blocks then issue their
    first K/V loads before waiting for the previous kernel (decode_kernels' docstring).
    xq_out (n_seq, q8_1_bytes(n_head * D)) uint8: also the result as Q8_1 activations (what
    quantize_q8_1_into gives for out), written by the kernel that writes out (the combine
    kernel, the split kernel of a one-split launch or of a cluster merge) or else by a
    quantize launch (the one-launch combine): the next GEMV reads them.
    sinks (n_head,) float32 on the device, or None: head h's softmax has one more logit
    sinks[h] (not scaled by `scale`, no value; gpt-oss), added once where the result is
    normalised. Kernels compiled without sinks are the dense ones, unchanged."""
    check_decode_shapes(q, k_cache, v_cache)
    check_sinks(sinks, q.shape[1], "attention.decode")
    if not isinstance(keys, KeyRange):
        raise TypeError(f"attention.decode: keys must be a KeyRange (lens and how kv_len "
                        f"follows from them), got {type(keys).__name__}")
    n_seq, n_head, head_dim = q.shape
    n_kv_head = k_cache.shape[-3]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"attention.decode: head_dim {head_dim} not in {HEAD_DIMS}")
    config = config or default_config(n_head // n_kv_head, head_dim, q.device, k_cache.dtype)
    n_splits = workspace.n_splits if workspace is not None else 1
    if workspace is not None and not workspace.cluster and \
            workspace.part_o.shape != (n_seq, n_head, n_splits, head_dim):
        raise ValueError(f"attention.decode: workspace partials {workspace.part_o.shape} do not "
                         f"fit q {q.shape} with {n_splits} splits")
    if xq_out is not None and (head_dim % 32 or xq_out.dtype != np.uint8 or
                               xq_out.nbytes != n_seq * q8_1_bytes(n_head * head_dim)):
        raise ValueError(f"attention.decode: xq_out must be uint8 with {n_seq} x "
                         f"{q8_1_bytes(n_head * head_dim)} bytes (Q8_1 of the output; head_dim "
                         f"a multiple of 32, got {head_dim}), got {xq_out.dtype} "
                         f"{tuple(xq_out.shape)}")
    # one split: the split kernel quantizes its rows from the registers of its merge
    kernel_q8 = xq_out is not None and (n_splits == 1 or workspace.cluster)
    fused = launch_split_kernel(q, k_cache, v_cache, keys, out, scale, softcap=softcap,
                                workspace=workspace, config=config, stream=stream,
                                share_cache=share_cache, early_kv=early_kv,
                                xq_out=xq_out if kernel_q8 else None, sinks=sinks)
    if n_splits > 1 and not fused:
        warps = combine_warps(n_splits)
        trigger = (q.device.kind == "cuda" and _under_pdl(q.device) and config.early_trigger
                   and n_seq * n_head <= _one_wave(32 * warps, q.device))
        combine_splits[(n_seq * n_head,), 32 * warps, stream](
            workspace.part_o, workspace.part_ml, out, _q8_words(xq_out, out), n_splits,
            sinks=_sink_arg(sinks, out), n_head=n_head,
            **combine_spec(head_dim, warps, trigger, xq_out is not None, sinks is not None))
    elif xq_out is not None and not kernel_q8:    # incl. the one-launch combine (f32 only)
        quantize_q8_1_into(out.reshape(n_seq, n_head * head_dim), xq_out, stream=stream)
    return out
