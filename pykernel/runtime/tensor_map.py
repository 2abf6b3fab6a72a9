"""`pk.tensor_map`: the host side of TMA tensor copies (intrinsics/tma.py).

Input: a device array (1..5 dimensions, C-contiguous), the box (tile) shape in the array's index
order and the copy options. Output: a `TiledTensorMap`, passed to a `pk.TensorMap` kernel
parameter by value (128 bytes, packer.py's "tensormap" field kind).

On a CUDA device the 128 bytes are the driver's opaque CUtensorMap from
`cuTensorMapEncodeTiled` (dimensions innermost first, as the driver wants). On the CPU device
they are this module's own record, which the CPU target's emulation reads (cpu_tma.py):

    0   u64 global address         8  u32 rank          12 u32 element bytes
    16  u64 dims[5]                56 u64 strides[5] (bytes; [0] = element bytes)
    96  u16 box[5]                 106 u16 swizzle bytes (0, 32, 64, 128)
    108 u32 out-of-bounds fill (0 zeros, 1 NaN)     112 u64 the element type's NaN bits
    120 u64 MAGIC
(all per-dimension fields innermost first). The rules are the driver's, checked here for both
devices so that a map the CPU target accepts is one the GPU accepts, with messages that name
the rule."""
from __future__ import annotations

import math
import struct

import numpy as np

from .arrays import Array

MAX_RANK = 5
MAX_BOX = 256
SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}            # bytes -> CUtensorMapSwizzle
L2_PROMOTIONS = {0: 0, 64: 1, 128: 2, 256: 3}      # bytes -> CUtensorMapL2promotion
OOB_FILLS = {"zeros": 0, "nan": 1}                 # -> CUtensorMapFloatOOBfill
# numpy dtype name -> CUtensorMapDataType (bf16 lives in uint16 arrays: a tile copy moves
# bytes, the type only matters for the NaN fill)
DATA_TYPES = {"uint8": 0, "int8": 0, "bool": 0, "uint16": 1, "int16": 1, "uint32": 2,
              "int32": 3, "uint64": 4, "int64": 5, "float16": 6, "float32": 7, "float64": 8}
NAN_BITS = {"float16": 0x7FFF, "float32": 0x7FFFFFFF, "float64": 0x7FFFFFFFFFFFFFFF}
MAGIC = int.from_bytes(b"PKTMAP01", "little")
RECORD = struct.Struct("<QII5Q5Q5HHIQQ")
assert RECORD.size == 128


class TiledTensorMap:
    """What `pk.tensor_map` returns: the 128 bytes a `pk.TensorMap` parameter takes, for
    arrays of one device kind; it keeps the array alive."""
    __slots__ = ("array", "box_shape", "data", "device_kind", "oob_fill", "swizzle")

    def __init__(self, data: bytes, device_kind: str, array, box_shape, swizzle, oob_fill):
        self.data, self.device_kind, self.array = data, device_kind, array
        self.box_shape, self.swizzle, self.oob_fill = box_shape, swizzle, oob_fill

    @property
    def box_bytes(self) -> int:
        """Bytes one tma_load of this map lands (the mbarrier's expect-tx count)."""
        return math.prod(self.box_shape) * self.array.itemsize

    def __repr__(self) -> str:
        return (f"<tensor map of {self.array.dtype}{list(self.array.shape)} on "
                f"{self.device_kind}, box {list(self.box_shape)}, swizzle {self.swizzle}>")


def tensor_map(array, box_shape, swizzle: int = 0, interleave=None, l2_promotion: int = 0,
               oob_fill: str = "zeros") -> TiledTensorMap:
    """A tiled tensor map of `array` whose copies move boxes of `box_shape` elements
    (docs/runtime.md, "Tensor maps"). swizzle: 0, 32, 64 or 128 (bytes; the shared-memory
    layout wgmma descriptors of that mode read); l2_promotion: 0, 64, 128 or 256 (bytes);
    oob_fill: "zeros", or "nan" for float arrays."""
    if not isinstance(array, Array):
        raise TypeError(f"pk.tensor_map: expected a pykernel device array (pk.to_device, "
                        f"pk.empty, ...), got {type(array).__name__}")
    dtype = array.dtype.name
    rank = array.ndim
    box = _box(box_shape, rank)
    _check_options(dtype, swizzle, interleave, l2_promotion, oob_fill)
    dims, strides = _layout(array)
    inner = box[-1] * array.itemsize
    if inner % 16:
        raise ValueError(f"pk.tensor_map: the box's inner extent {box[-1]} x "
                         f"{array.itemsize} bytes = {inner} bytes must be a multiple of 16")
    if swizzle and inner > swizzle:
        raise ValueError(f"pk.tensor_map: with swizzle={swizzle} the box's inner extent "
                         f"must be at most {swizzle} bytes, got {box[-1]} x {array.itemsize} "
                         f"= {inner} bytes")
    if array.ptr % 16:
        raise ValueError(f"pk.tensor_map: the array's address must be 16-byte aligned, got "
                         f"{array.ptr:#x}")
    kind = array.device.kind
    args = (dtype, rank, array.ptr, dims, strides, box, swizzle, l2_promotion, oob_fill)
    data = _encode_cuda(*args) if kind == "cuda" else _encode_record(array.itemsize, *args)
    return TiledTensorMap(data, kind, array, tuple(box), swizzle, oob_fill)


def _box(box_shape, rank: int) -> list:
    box = [box_shape] if isinstance(box_shape, int) else list(box_shape)
    if len(box) != rank:
        raise ValueError(f"pk.tensor_map: the box has {len(box)} dimensions, the array {rank}")
    for d, n in enumerate(box):
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or \
                not 1 <= n <= MAX_BOX:
            raise ValueError(f"pk.tensor_map: box dimension {d} must be an int in "
                             f"1..{MAX_BOX}, got {n!r}")
    return [int(n) for n in box]


def _check_options(dtype, swizzle, interleave, l2_promotion, oob_fill):
    if dtype not in DATA_TYPES:
        raise TypeError(f"pk.tensor_map: no TMA element type for {dtype} arrays")
    if swizzle not in SWIZZLES:
        raise ValueError(f"pk.tensor_map: swizzle must be 0, 32, 64 or 128 (bytes), got "
                         f"{swizzle!r}")
    if interleave not in (None, "none"):
        raise ValueError(f"pk.tensor_map: interleaved layouts are not supported (interleave="
                         f"{interleave!r}); only None")
    if l2_promotion not in L2_PROMOTIONS:
        raise ValueError(f"pk.tensor_map: l2_promotion must be 0, 64, 128 or 256 (bytes), "
                         f"got {l2_promotion!r}")
    if oob_fill not in OOB_FILLS:
        raise ValueError(f"pk.tensor_map: oob_fill must be 'zeros' or 'nan', got "
                         f"{oob_fill!r}")
    if oob_fill == "nan" and dtype not in NAN_BITS:
        raise ValueError(f"pk.tensor_map: oob_fill='nan' needs a float array, not {dtype}")


def _layout(array):
    """(dims, byte strides of dims 1..), both innermost first, as the driver takes them."""
    if array.ndim == 0 or array.ndim > MAX_RANK:
        raise ValueError(f"pk.tensor_map: a tensor map has 1..{MAX_RANK} dimensions, the "
                         f"array has {array.ndim}")
    dims = list(reversed(array.shape))
    if any(not 1 <= n <= 1 << 32 for n in dims):
        raise ValueError(f"pk.tensor_map: every dimension must be 1..2^32, got shape "
                         f"{array.shape}")
    strides, step = [], array.itemsize
    for n in dims[:-1]:                    # Arrays are C-contiguous
        step *= n
        strides.append(step)
    for d, s in enumerate(strides):
        if s % 16 or s >= 1 << 40:
            axis = array.ndim - 2 - d
            raise ValueError(f"pk.tensor_map: the stride of axis {axis} is {s} bytes; TMA "
                             f"needs global strides that are multiples of 16 bytes (and "
                             f"< 2^40): pad the inner dimension of shape {array.shape}")
    return dims, strides


def _encode_record(itemsize, dtype, rank, address, dims, strides, box, swizzle, _l2,
                   oob_fill) -> bytes:
    pad = [0] * (MAX_RANK - rank)
    return RECORD.pack(address, rank, itemsize, *(dims + pad), *([itemsize] + strides + pad),
                       *(list(reversed(box)) + pad), swizzle, OOB_FILLS[oob_fill],
                       NAN_BITS.get(dtype, 0), MAGIC)


def _encode_cuda(dtype, rank, address, dims, strides, box, swizzle, l2_promotion,
                 oob_fill) -> bytes:
    import ctypes

    from cuda.bindings import driver as cu

    from .cuda import check
    # the binding takes its lists as cuuint64_t / cuuint32_t objects, not ints
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    tmap = check(cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType(DATA_TYPES[dtype]), rank, address, [u64(d) for d in dims],
        [u64(s) for s in strides], [u32(b) for b in reversed(box)], [u32(1)] * rank,
        cu.CUtensorMapInterleave(0),
        cu.CUtensorMapSwizzle(SWIZZLES[swizzle]),
        cu.CUtensorMapL2promotion(L2_PROMOTIONS[l2_promotion]),
        cu.CUtensorMapFloatOOBfill(OOB_FILLS[oob_fill])), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tmap.getPtr(), 128)
