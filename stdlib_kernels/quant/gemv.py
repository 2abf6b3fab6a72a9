"""Decode GEMV on GGUF weights: host API over gemv_kernels.py.

    gemv(raw, "Q4_K", x) -> y                 raw uint8 (rows, row_bytes); x (n,) or (batch, n)
                                              float32, batch <= 8; y float32 (rows,) / (batch, rows)
    gemv_glu(gate, up, type, x, act="swiglu") -> act(gate x) * (up x), one launch
    gemv_residual(raw, type, x, res)         -> W x + res
    gemv_q8_into / gemv_f32_into              preallocated outputs, no allocation, no host sync

`activations="q8_1"` (default; llama.cpp's path) quantizes x once per call and uses DP4A for
the types in Q8_1_TYPES, except Q1_0 on sm_80+ and the CPU target: int8 per 128 values as bit
planes and binary tensor cores (gemv_q1_0.py; gemv_q8_into keeps Q1_0's DP4A kernel); other
types, and `activations="f32"`, use float32 activations.
Results are device arrays (pk.Array) on the current device.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

import pykernel as pk

from . import decode8 as d8
from . import gemv_kernels as gk
from .formats import GEMV, GEMV_Q8, get_format, type_ids
from .gemv_q1_0 import bmma_available, gemv_q1_0_into
from .gemv_bulk import BULK_TYPES, bulk_eligible, gemv_bulk_into
from .q8_1 import q8_1_bytes, quantize_q8_1_into
from .q8_planes import q8_planes_bytes, quantize_q8_planes_into

# items per block of the DP4A path (dot_q8.py, dot_q8_k.py): 32-value blocks 1, Q1_0 and the
# K-quants more; Q8_1_TYPES: type -> items for the formats' GEMV_Q8 family (formats.py)
_DP4A_ITEMS = {"Q1_0": 4, "Q2_K": 4, "Q3_K": 4, "Q4_K": 8, "Q5_K": 8, "Q6_K": 8}
Q8_1_TYPES = {t: _DP4A_ITEMS.get(t, 1) for t in type_ids(GEMV_Q8)}
PAIR_TYPES = {"Q4_0": gk.Q4_0_PAIR, "Q8_0": gk.Q8_0_PAIR}
# Kernel variants: type -> {name: (format id, items per block, Q8_1 row alignment in bytes the
# activation vector loads need, most tokens it runs for: registers)}. VARIANT names the default
# (GemvConfig.kernel overrides it; "" = the base kernel). Q4_0/Q8_0 "vec": block pairs with
# 8-byte activation loads. Q4_K "wide": one item per 64-value chunk, 8-byte activation loads
# (one token, matrices of 16 MB+ with rows up to 8192 values on sm_90+: gemv_bulk.py; so
# for Q5_K, whose register kernel is the base one).
# Q2_K/Q3_K "wide": one item per 128 values, 16-byte activation loads (Q3_K: u32 words; for one
# token and weights over L2 on sm_90+ the rows arrive by bulk copies, gemv_bulk.py). Q6_K
# "words": its 2-byte-aligned blocks read as u32 words (rows of an even number of blocks are
# 4-byte aligned), 4 items per block (one token, large weights, rows of a multiple of 2048 on
# sm_90+: bulk copies too); "" = u16 loads (also used for odd block counts). Q1_0
# "rows": u32 words, one item per block, 16-byte activation loads, bit-plane dots for all the
# group's rows at once.
VARIANTS = {"Q4_0": {"vec": (gk.Q4_0_PAIR_VEC, 1, 8, 8)},
            "Q8_0": {"vec": (gk.Q8_0_PAIR_VEC, 1, 8, 8)},
            "Q4_K": {"wide": (gk.Q4_K_WIDE, 4, 8, 8)}, "Q2_K": {"wide": (gk.Q2_K_WIDE, 2, 16, 2)},
            "Q3_K": {"wide": (gk.Q3_K_WIDE, 2, 16, 2)},
            "Q6_K": {"words": (gk.Q6_K_WORDS, 4, 4, 8)},
            "Q1_0": {"rows": (gk.Q1_0_ROWS, 1, 16, 2)}}
VARIANT = {"Q4_0": "vec", "Q8_0": "vec", "Q4_K": "wide", "Q2_K": "wide", "Q6_K": "words",
           "Q3_K": "wide", "Q1_0": "rows"}
GPU_ONLY = {gk.Q1_0_ROWS: gk.Q1_0_ROWS_PRMT}   # the same kernel with inline PTX (cuda)
# 2-byte-aligned blocks read as u32 (rows of an even number of blocks)
U32_WORD_TYPES = ("Q4_0", "Q8_0", "Q6_K", "Q3_K", "Q1_0")


def kernel_format(type_name: str, n: int, xq, batch: int = 1, variant: str | None = None):
    """(format id, items per block, blocks per row, reads u32 words) of the kernel variant for
    rows of n values and Q8_1 activations xq; variant None = VARIANT's (one whose alignment xq
    lacks falls back to the base kernel; so does one run for more tokens than its table entry
    allows, where its registers would spill)."""
    fmt = get_format(type_name)
    blocks = n // fmt.block_elems
    variant = VARIANT.get(type_name, "") if variant is None else variant
    options = VARIANTS.get(type_name, {})
    if variant in options:
        _, _, align, most = options[variant]
        if xq.ptr % align or q8_1_bytes(n) % align or batch > most:
            variant = ""
    as_u32 = type_name in U32_WORD_TYPES and blocks % 2 == 0 and (
        type_name in PAIR_TYPES or variant in options)
    if type_name in U32_WORD_TYPES and not as_u32:
        return int(fmt.ggml_type), Q8_1_TYPES[type_name], blocks, False
    if type_name in PAIR_TYPES:   # u32 block pairs
        fmt_id = options[variant][0] if variant in options else PAIR_TYPES[type_name]
        return fmt_id, 1, blocks // 2, True
    if variant in options:
        fmt_id = options[variant][0]
        if pk.current_device().kind == "cuda":
            fmt_id = GPU_ONLY.get(fmt_id, fmt_id)
        return fmt_id, options[variant][1], blocks, as_u32
    return int(fmt.ggml_type), Q8_1_TYPES[type_name], blocks, False


class GemvConfig(NamedTuple):
    """Launch shape: `warps` per thread block; `split` warps share each row group (> 1 adds a
    shared-memory reduction); `rows` output rows per group; `unroll` items per thread per loop
    trip (their loads in flight together); `widen` consecutive items per thread visit (used
    only when it divides the row's item count); `stage_x` 1: each block first copies the Q8_1
    activations to shared memory (strided per-lane activation reads then cost one shared
    wavefront instead of one L1 line per lane group; used while they fit STAGE_X_MAX_BYTES);
    `per_sm` > 0: a persistent grid of per_sm blocks per SM striding over the row groups
    (amortizes the staging; 0 = one block per row group); `kernel`: the kernel variant
    (VARIANTS; None = VARIANT's default for the type, "" = the base kernel; "bulk": the
    bulk-copy kernel of gemv_bulk.BULK_TYPES (the K-quants but Q2_K, Q4_0, Q4_1, Q8_0), with
    `warps` per block, `rows` per warp and a ring of `stages` row groups per warp, or with
    `split` > 1 that many warps per row)."""
    warps: int = 4
    split: int = 1
    rows: int = 1
    unroll: int = 2
    widen: int = 1
    stage_x: int = 0
    per_sm: int = 0
    kernel: str | None = None
    stages: int = 1


G = GemvConfig
# fastest measured per type, H200, batch 1 (benchmarks/RESULTS.md, issue 5): rows of k = 14336
TUNED_CONFIGS = {"Q4_0": G(8, 2, 2, 1, 1), "Q4_1": G(8, 8, 2, 1, 1), "Q8_0": G(4, 4, 4, 1, 1),
                 "Q4_K": G(4, 2, 2, 1, 1), "Q6_K": G(4, 2, 4, 1, 1, kernel="words"),
                 "Q1_0": G(4, 2, 2, 1, 1), "Q2_K": G(4, 2, 2, 1, 1), "Q5_K": G(4, 2, 2, 1, 2),
                 "Q3_K": G(4, 2, 4, 1, 1)}
DEFAULT_CONFIG = G(4, 2, 2, 1, 1)   # best for Q5_0, Q5_1; a safe shape for the rest
# rows of at most SHORT_ROW values (k = 4096: 57344 and 128256 rows): fewer warps per row
SHORT_ROW = 8192
TUNED_SHORT = {"Q4_0": G(4, 1, 2, 2, 1), "Q4_1": G(4, 2, 2, 1, 1), "Q8_0": G(4, 2, 4, 1, 1),
               "Q4_K": G(4, 2, 2, 1, 1), "Q6_K": G(4, 2, 4, 1, 1, kernel="words"),
               "Q1_0": G(4, 1, 16, 1, 1), "Q2_K": G(4, 1, 2, 1, 1), "Q5_0": G(4, 2, 4, 1, 1),
               "Q5_K": G(4, 1, 2, 1, 2), "Q3_K": G(1, 1, 6, 1, 1)}
# batch > 1: measured on Q4_K (2, 4, 8 tokens); 4 rows per group reuse each activation load;
# the base kernels (Q4_K's 64-value items were slower at 2 and 4 tokens, 9% faster at 8)
BATCH_CONFIGS = ((3, G(4, 2, 4, 1, 2, kernel="")), (5, G(4, 2, 4, 1, 1, kernel="")),
                 (8, G(4, 1, 4, 1, 2, kernel="")))
F32_CONFIG = GemvConfig(warps=4, split=4, rows=1, unroll=1)
HALF_WORDS = {"F16": d8.F16_WORDS, "BF16": d8.BF16_WORDS}
# the CPU target emulates every thread: unrolled trips only cost it compile time
CPU_CONFIG = GemvConfig(warps=4, split=1, rows=1, unroll=1)
STAGE_X_MAX_BYTES = 48 << 10   # above this the block's copy of x would cap blocks per SM


@functools.lru_cache(maxsize=None)
def sm_count(kind: str, ordinal: int) -> int:
    """Multiprocessors of the current device (the CPU target: 1)."""
    if kind != "cuda":
        return 1
    from cuda.bindings import driver
    attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    err, count = driver.cuDeviceGetAttribute(attr, ordinal)
    return int(count) if not err and count > 0 else 132


def gemv_config(type_name: str, batch: int, n: int = 0) -> GemvConfig:
    """The launch shape for rows of n values (0: long rows) and `batch` tokens."""
    if pk.current_device().kind == "cpu":
        return CPU_CONFIG
    if batch > 1:
        return next(c for most, c in BATCH_CONFIGS if batch <= most)
    table = TUNED_SHORT if 0 < n <= SHORT_ROW else TUNED_CONFIGS
    return table.get(type_name, DEFAULT_CONFIG)


F32_TYPES = tuple(type_ids(GEMV))   # the f32-activation GEMV's (and gemm.py's) formats
MODES = {None: gk.MODE_PLAIN, "residual": gk.MODE_RESIDUAL, "swiglu": gk.MODE_SWIGLU,
         "geglu": gk.MODE_GEGLU}


def word_dtype(type_name: str):
    """u32 where every block is 4-byte aligned, u16 where 2-byte aligned, else u8 (MXFP4's
    17-byte blocks)."""
    block_bytes = get_format(type_name).block_bytes
    return np.uint32 if block_bytes % 4 == 0 else (np.uint16 if block_bytes % 2 == 0
                                                    else np.uint8)


def weight_words(raw, type_name: str, n: int):
    """Device weight rows (rows, row_bytes) as a flat word view for the kernels (no copy)."""
    fmt = get_format(type_name)
    if type_name not in F32_TYPES:
        raise ValueError(f"gemv: no GEMV kernel for {type_name}; supported: {F32_TYPES}")
    if n <= 0 or n % max(fmt.block_elems, 8) or n % 8:
        raise ValueError(f"gemv {type_name}: row length {n} must be a positive multiple of "
                         f"{max(fmt.block_elems, 8)}")
    if isinstance(raw, np.ndarray):
        raw = pk.to_device(np.ascontiguousarray(raw))
    per_row = n // fmt.block_elems * fmt.block_bytes
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != per_row:
        raise ValueError(f"gemv {type_name}: weights must be uint8 (rows, {per_row}) for rows "
                         f"of {n} elements, got {raw.dtype} {tuple(raw.shape)}")
    if raw.ptr % 16:
        raise ValueError(f"gemv {type_name}: weight buffer must be 16-byte aligned")
    return raw.reshape(-1).view(word_dtype(type_name)), raw.shape[0]


def _check_out(y, batch: int, rows: int, what: str):
    if y.dtype != np.float32 or y.size != batch * rows:
        raise ValueError(f"{what}: output must be float32 with {batch}x{rows} elements, got "
                         f"{y.dtype} {tuple(y.shape)}")


def gemv_q8_into(w, type_name, xq, y, rows, n, batch=1, *, w2=None, res=None, mode=None,
                 stream=None, config: GemvConfig | None = None):
    """y (batch, rows) = W @ x from Q8_1 activations xq (batch, n//32*36 bytes); w/w2 from
    weight_words. mode: None, "residual" (res (batch, rows), may be y), "swiglu", "geglu"."""
    if not 1 <= batch <= gk.MAX_BATCH:
        raise ValueError(f"gemv: batch {batch} outside 1..{gk.MAX_BATCH}; use quant.matmul")
    _check_out(y, batch, rows, "gemv")
    if _bulk(type_name, batch, mode, rows, n, config):
        return gemv_bulk_into(w, type_name, xq, y, rows, n, w2=w2, res=res, mode=mode,
                              stream=stream, batch=batch,
                              rows_per_warp=config.rows if config else None,
                              warps=config.warps if config else None,
                              stages=config.stages if config else None,
                              split=config.split if config else None)
    words = xq.reshape(-1).view(np.uint32)
    c = config or gemv_config(type_name, batch, n)
    plan = register_plan(type_name, rows, n, xq, batch, c)
    if plan.as_u32:
        w = w.view(np.uint32)
        w2 = None if w2 is None else w2.view(np.uint32)
    grid = plan.groups
    if c.per_sm > 0:
        dev = pk.current_device()
        grid = min(grid, c.per_sm * sm_count(dev.kind, getattr(dev, "ordinal", 0)))
    xq_words = q8_1_bytes(n) // 4
    stage = 1 if c.stage_x and batch * xq_words * 4 <= STAGE_X_MAX_BYTES else 0
    gk.gemv_q8_kernel[grid, c.warps * 32, stream, stage * batch * xq_words * 4](
        w, w if w2 is None else w2, words, y if res is None else res, y, rows,
        plan.row_bytes // w.itemsize, plan.blocks, xq_words, plan.fmt_id, w.dtype, plan.items,
        c.warps, batch, MODES[mode], c.rows, c.split, c.unroll, plan.widen, stage, _under_pdl())


class RegisterPlan(NamedTuple):
    """How the register DP4A kernel (gemv_kernels.gemv_q8_kernel) runs one matrix: kernel
    variant (format id, items per block, blocks per row, whether it reads u32 words), the
    items per visit actually used, bytes per row and row groups (blocks of the config)."""
    fmt_id: int
    items: int
    blocks: int
    as_u32: bool
    widen: int
    row_bytes: int
    groups: int


def register_plan(type_name: str, rows: int, n: int, xq, batch: int,
                  c: GemvConfig) -> RegisterPlan:
    """The register kernel's plan for rows x n weights of type_name under config c (shared by
    gemv_q8_into and gemv_pair)."""
    fmt = get_format(type_name)
    fmt_id, items, blocks, as_u32 = kernel_format(type_name, n, xq, batch, c.kernel)
    widen = c.widen if (blocks * items) % c.widen == 0 else 1
    per_block = c.warps // c.split * c.rows
    return RegisterPlan(fmt_id, items, blocks, as_u32, widen,
                        n // fmt.block_elems * fmt.block_bytes, (rows + per_block - 1) // per_block)


def _bulk(type_name: str, batch: int, mode, rows: int, n: int, config) -> bool:
    """BULK_TYPES: the bulk-copy kernel (gemv_bulk.py) when asked for (GemvConfig(kernel=
    "bulk")) or, by default, where it applies (gemv_bulk.bulk_eligible: for one token large
    weights, for 2..8 tokens every matrix of the BATCH_BULK types whose rows fit)."""
    if type_name not in BULK_TYPES:
        return False
    if config is not None:
        return config.kernel == "bulk"
    return pk.current_device().kind == "cuda" and bulk_eligible(type_name, rows, n, batch)


def gemv_f32_into(w, type_name, x, y, rows, n, batch=1, *, w2=None, res=None, mode=None,
                  stream=None, config: GemvConfig | None = None):
    """As gemv_q8_into with float32 activations x (batch, n)."""
    if not 1 <= batch <= gk.MAX_BATCH:
        raise ValueError(f"gemv: batch {batch} outside 1..{gk.MAX_BATCH}; use quant.matmul")
    _check_out(y, batch, rows, "gemv")
    fmt = get_format(type_name)
    c = config or F32_CONFIG
    per_block = c.warps // c.split
    fmt_id = int(fmt.ggml_type)
    if type_name in HALF_WORDS and n % 8 == 0 and w.ptr % 16 == 0 and \
            (w2 is None or w2.ptr % 16 == 0):
        # 16-byte rows: one vector load per 8 halves (decode8.decode8_halves)
        fmt_id = HALF_WORDS[type_name]
        w = w.view(np.uint32)
        w2 = None if w2 is None else w2.view(np.uint32)
    gk.gemv_f32_kernel[(rows + per_block - 1) // per_block, c.warps * 32, stream](
        w, w if w2 is None else w2, x.reshape(-1), y if res is None else res, y, rows,
        n // fmt.block_elems * fmt.block_bytes // w.itemsize, n, fmt_id, w.dtype,
        c.warps, batch, MODES[mode], c.split, _under_pdl())


def _under_pdl() -> bool:
    """True while launches are captured into a PDL graph (capture_graph(pdl=True)): the GEMV
    then prefetches its first weight rows before waiting for the previous kernel."""
    return bool(getattr(pk.current_device(), "programmatic_launch", False))


def _activations(x):
    if isinstance(x, np.ndarray):
        x = pk.to_device(np.ascontiguousarray(x, dtype=np.float32))
    if x.dtype != np.float32 or x.ndim not in (1, 2):
        raise ValueError(f"gemv: activations must be float32 (n,) or (batch, n), got {x.dtype} "
                         f"{tuple(x.shape)}")
    return x


def _run(raws, type_name, x, mode, res, activations):
    x = _activations(x)
    n = x.shape[-1]
    batch = x.shape[0] if x.ndim == 2 else 1
    w, rows = weight_words(raws[0], type_name, n)
    w2 = None
    if len(raws) > 1:
        w2, rows2 = weight_words(raws[1], type_name, n)
        if rows2 != rows:
            raise ValueError(f"gemv_glu: gate has {rows} rows, up has {rows2}")
    y = pk.empty((batch, rows) if x.ndim == 2 else (rows,), np.float32)
    if res is not None:
        res = _activations(res)
        if res.size != y.size:
            raise ValueError(f"gemv_residual: residual has shape {tuple(res.shape)}, output "
                             f"{tuple(y.shape)}")
    if activations == "q8_1" and type_name == "Q1_0" and bmma_available():
        xp = pk.empty((batch, q8_planes_bytes(n)), np.uint8)   # per-128 int8 (gemv_q1_0.py)
        quantize_q8_planes_into(x, xp)
        gemv_q1_0_into(w, xp, y, rows, n, batch, w2=w2, res=res, mode=mode)
    elif activations == "q8_1" and type_name in Q8_1_TYPES and n % 32 == 0:
        xq = pk.empty((batch, q8_1_bytes(n)), np.uint8)
        quantize_q8_1_into(x, xq)
        gemv_q8_into(w, type_name, xq, y, rows, n, batch, w2=w2, res=res, mode=mode)
    elif activations in ("q8_1", "f32"):
        gemv_f32_into(w, type_name, x, y, rows, n, batch, w2=w2, res=res, mode=mode)
    else:
        raise ValueError(f"gemv: activations must be 'q8_1' or 'f32', got {activations!r}")
    return y


def gemv(raw, type_name: str, x, activations: str = "q8_1"):
    """y = W @ x for GGUF rows raw (rows, row_bytes); x (n,) or (batch <= 8, n)."""
    return _run((raw,), type_name, x, None, None, activations)


def gemv_glu(gate, up, type_name: str, x, act: str = "swiglu", activations: str = "q8_1"):
    """act(gate @ x) * (up @ x) in one launch; act "swiglu" (silu) or "geglu" (gelu tanh)."""
    if act not in ("swiglu", "geglu"):
        raise ValueError(f"gemv_glu: act must be 'swiglu' or 'geglu', got {act!r}")
    return _run((gate, up), type_name, x, act, None, activations)


def gemv_residual(raw, type_name: str, x, res, activations: str = "q8_1"):
    """W @ x + res (the residual add fused into the GEMV's store)."""
    return _run((raw,), type_name, x, "residual", res, activations)
