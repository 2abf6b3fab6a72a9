"""`@pk.elementwise`: a scalar function applied to every element of arrays (Numba's
`@vectorize(target="cuda")`, CuPy's ElementwiseKernel), without writing the kernel.

    @pk.elementwise
    def axpb(x: f32, y: f32, a: f32) -> f32:
        return a * x + y

    z = axpb(x, y, 2.0)            # arrays (broadcast as numpy's) and scalars -> a new array
    axpb(x, y, 2.0, out=z)         # or into an existing one (may be an input)

The function is an ordinary @pk.func (its body follows the kernel language, its parameters and
result are annotated scalar types). Each call pattern (which arguments are arrays, and whether
every array is aligned for VEC-wide loads) gets one generated kernel: a grid-stride loop in
which each thread computes VEC consecutive outputs from VEC-wide vector loads (`pk.load_vec`,
16 bytes for f32), the last n % VEC elements one by one; misaligned arrays (views at odd
offsets) get a one-element-per-thread loop. Arrays are contiguous, scalars passed by value.
Arrays of different shapes broadcast as numpy's: dimensions merged where every array walks
them alike (_coalesce), then a kernel that maps each flat index to coordinates and each
array's offset (4 outputs per thread when the innermost dimension allows). The generated source is
registered with linecache (generated.py), so the compiler, its disk cache and its error
messages treat it like a file; errors in the function's body point at the user's own lines.
"""
from __future__ import annotations

import inspect
import math

import numpy as np

from .errors import LaunchError
from .generated import array_address, define_kernel, vector_aligned
from .kernel import DeviceFunction
from .types import Ptr, ScalarType, i32, i64

THREADS = 256
MAX_BLOCKS = 65535 * 8   # the grid-stride loop covers larger arrays
VEC = 4                  # elements per thread and vector load (16 bytes of f32)
RESERVED = ("out", "stream")   # the call's keyword arguments
MAX_DIMS = 6             # broadcasting: dimensions after merging contiguous ones


def elementwise(fn=None, *, threads: int = THREADS):
    """Decorator: see the module docstring; `threads` per block (default 256)."""
    def wrap(f):
        return Elementwise(f, threads)
    return wrap if fn is None else wrap(fn)


def _is_array(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and getattr(value, "ndim", 1) > 0


class Elementwise:
    def __init__(self, fn, threads: int):
        self.func = fn if isinstance(fn, DeviceFunction) else DeviceFunction(fn)
        self.name = self.func.name
        self.threads = threads
        annotations = self.func.annotations()
        self.params = list(inspect.signature(self.func.fn).parameters)
        taken = [p for p in self.params if p in RESERVED or p.startswith("_pk_")]
        if taken:
            raise TypeError(f"@pk.elementwise {self.name}: parameter name(s) {', '.join(taken)} "
                            f"are reserved (out= and stream= are the call's keywords)")
        self.types = []
        for p in self.params:
            ann = annotations.get(p)
            if not isinstance(ann, ScalarType):
                raise TypeError(f"@pk.elementwise {self.name}: parameter '{p}' needs a scalar "
                                f"type annotation (f32, i32, f16, ...), got {ann!r}")
            self.types.append(ann)
        result = annotations.get("return")
        if not isinstance(result, ScalarType):
            raise TypeError(f"@pk.elementwise {self.name}: the function needs a scalar return "
                            f"annotation (-> f32, ...), got {result!r}")
        self.result = result
        self._kernels: dict = {}
        self.__doc__ = self.func.fn.__doc__

    def __call__(self, *args, out=None, stream=None):
        if len(args) != len(self.params):
            raise LaunchError(f"{self.name}(): takes {len(self.params)} arguments "
                              f"({', '.join(self.params)}), got {len(args)}")
        pattern = tuple(_is_array(a) for a in args)
        shapes = [tuple(a.shape) for a, is_arr in zip(args, pattern) if is_arr]
        if not shapes and out is None:
            raise LaunchError(f"{self.name}(): needs at least one array argument (or out=)")
        shape = self._result_shape(args, pattern, shapes, out)
        if out is None:
            if self.result.name == "bf16":
                raise LaunchError(f"{self.name}(): a bf16 result needs out= (a bf16 DLPack "
                                  f"tensor, e.g. torch's): numpy has no bfloat16 dtype")
            from .runtime import empty
            out = empty(shape, self.result.np_dtype)
        n = math.prod(shape)
        if n == 0:
            return out
        if any(s != shape for s in shapes):
            self._broadcast(args, pattern, shape, n, out, stream)
            return out
        arrays = [(a, t) for a, t, is_arr in zip(args, self.types, pattern) if is_arr]
        arrays.append((out, self.result))
        vec = all(vector_aligned(a, t, VEC) for a, t in arrays)
        per_thread = VEC if vec else 1
        blocks = max(1, min(-(-n // (self.threads * per_thread)), MAX_BLOCKS))
        self._kernel(pattern, vec)[blocks, self.threads, stream](n, out, *args)
        return out

    def kernel(self, arrays=None, vector: bool = True):
        """The generated @pk.kernel a call of same-shaped arrays launches: arrays[j] says
        whether argument j is an array (default: all are), vector whether every array is
        16-byte aligned (the 4-wide path; types over 32 bits never take it). Inspect it with
        `.ptx(arch)` / `.llvm_ir(arch)`."""
        pattern = tuple(True for _ in self.params) if arrays is None else tuple(map(bool, arrays))
        if len(pattern) != len(self.params):
            raise ValueError(f"{self.name}.kernel(): arrays needs one flag per parameter "
                             f"({', '.join(self.params)}), got {len(pattern)}")
        vector = vector and all(t.bits <= 32 and t.kind != "bool"
                                for t in self.types + [self.result])
        return self._kernel(pattern, vector)

    def ptx(self, arch: str = "sm_90", arrays=None, vector: bool = True) -> str:
        """PTX of the kernel `kernel(arrays, vector)` names."""
        return self.kernel(arrays, vector).ptx(arch)

    def _result_shape(self, args, pattern, shapes, out) -> tuple:
        """numpy's broadcast of the array arguments and `out`, which must have that shape
        itself (inputs broadcast to out, as with numpy's out=)."""
        def given() -> str:
            text = ", ".join(f"{n} {tuple(a.shape)}" for n, a, is_arr in
                             zip(self.params, args, pattern) if is_arr)
            return text + (f", out {tuple(out.shape)}" if out is not None else "")
        every = shapes + ([tuple(out.shape)] if out is not None else [])
        try:
            shape = tuple(int(e) for e in np.broadcast_shapes(*every))
        except ValueError:
            raise LaunchError(f"{self.name}(): array shapes do not broadcast together: "
                              f"{given()}") from None
        if out is not None and tuple(out.shape) != shape:
            raise LaunchError(f"{self.name}(): out must have the broadcast shape {shape}, got "
                              f"{given()}")
        return shape

    def _broadcast(self, args, pattern, shape, n, out, stream) -> None:
        """Arrays of other shapes than the result: each read at its broadcast offset. The
        dimensions are first coalesced (adjacent ones that every array walks contiguously, or
        broadcasts along both, become one), so a matrix plus a row bias is 2-D and a
        (2, 3, 4) + (1, 1, 4) sum 2-D too; then extents and element strides (0 along broadcast
        dimensions) go to the kernel as scalars. When the innermost extent is a multiple of 4
        and every array's innermost stride is 1 or 0, each thread does 4 outputs with vector
        loads of the stride-1 arrays and one load of the broadcast ones."""
        arrays = [a for a, is_arr in zip(args, pattern) if is_arr]
        extents, strides = _coalesce(tuple(shape), [tuple(a.shape) for a in arrays])
        if len(extents) > MAX_DIMS:
            raise LaunchError(f"{self.name}(): broadcasting supports up to {MAX_DIMS} "
                              f"dimensions after merging contiguous ones, got {shape}")
        inner = tuple(st[-1] for st in strides)
        vec = extents[-1] % VEC == 0 and all(i in (0, 1) for i in inner) and \
            all(t.bits <= 32 and t.kind != "bool" for t in self.types + [self.result]) and \
            all((array_address(a) or 1) % 16 == 0 for a, i in zip(arrays, inner) if i == 1) \
            and (array_address(out) or 1) % 16 == 0
        # i32 index arithmetic (cheaper divisions) when no index can pass 2**31 - 1
        index = "i32" if n + MAX_BLOCKS * self.threads * VEC < 2 ** 31 else "i64"
        per_thread = VEC if vec else 1
        blocks = max(1, min(-(-n // (self.threads * per_thread)), MAX_BLOCKS))
        shape_key = (len(extents), inner if vec else None)
        kernel = self._kernel(pattern, False, (index, shape_key))
        kernel[blocks, self.threads, stream](n, out, *args, *extents[1:],
                                             *[x for st in strides for x in st])

    def _kernel(self, pattern: tuple, vec: bool, broadcast: str | None = None):
        key = (pattern, vec, broadcast)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = (self._generate_broadcast(pattern, broadcast) if broadcast
                                      else self._generate(pattern, vec))
        return k

    def _signature(self, pattern: tuple) -> str:
        return ", ".join(f"{p}: Ptr[T{j}, 'ro']" if arr else f"{p}: T{j}"
                         for j, (p, arr) in enumerate(zip(self.params, pattern)))

    def _namespace(self) -> dict:
        import pykernel as pk
        return {"pk": pk, "Ptr": Ptr, "i32": i32, "i64": i64, "R": self.result,
                "FN": self.func, **{f"T{j}": t for j, t in enumerate(self.types)}}

    def _generate_broadcast(self, pattern: tuple, how: tuple):
        """The kernel for broadcast shapes, how = (index type, (ndim, innermost strides or None)):
        flat index -> ndim coordinates -> each array's offset; with innermost strides, VEC
        outputs per thread (stride-1 arrays by vector loads, stride-0 ones by one load)."""
        index, (nd, inner) = how
        vec = inner is not None
        name = f"{self.name}_elementwise_broadcast"
        arrays = [j for j, arr in enumerate(pattern) if arr]
        extra = ", ".join([f"_pk_e{d}: {index}" for d in range(1, nd)] +
                          [f"_pk_s{j}_{d}: {index}" for j in arrays for d in range(nd)])
        coords = "".join(f"        _pk_c{d} = _pk_r % _pk_e{d}\n"
                         f"        _pk_r = _pk_r // _pk_e{d}\n" for d in range(nd - 1, 0, -1))
        offsets = "".join(
            f"        _pk_o{j} = " + " + ".join([f"_pk_r * _pk_s{j}_0"] + [
                f"_pk_c{d} * _pk_s{j}_{d}" for d in range(1, nd)]) + "\n" for j in arrays)
        head = (f"def {name}(_pk_n: i64, out: Ptr[R], {self._signature(pattern)}, {extra}):\n"
                f"    _pk_i = {index}(pk.block_idx.x) * {index}(pk.block_dim.x) + "
                f"{index}(pk.thread_idx.x)\n"
                f"    _pk_step = {index}(pk.grid_dim.x) * {index}(pk.block_dim.x)\n")
        if not vec:
            call = "FN(" + ", ".join(f"{p}[_pk_o{j}]" if arr else p
                                     for j, (p, arr) in enumerate(zip(self.params, pattern)))
            source = head + (f"    while i64(_pk_i) < _pk_n:\n"
                             f"        _pk_r = _pk_i\n"
                             f"{coords}{offsets}"
                             f"        out[_pk_i] = {call})\n"
                             f"        _pk_i += _pk_step\n")
        else:
            stride = dict(zip(arrays, inner))
            loads = "".join(
                (f"        {', '.join(f'_pk_{j}_{e}' for e in range(VEC))} = "
                 f"pk.load_vec({p}, _pk_o{j}, {VEC})\n") if stride[j] == 1 else
                f"        _pk_{j} = {p}[_pk_o{j}]\n"
                for j, (p, arr) in enumerate(zip(self.params, pattern)) if arr)

            results = self._vec_calls(pattern, lambda j, p, e: f"_pk_{j}_{e}"
                                      if stride[j] == 1 else f"_pk_{j}")
            source = head + (f"    while i64(_pk_i) < _pk_n // {VEC}:\n"
                             f"        _pk_r = _pk_i * {VEC}\n"
                             f"{coords}{offsets}{loads}"
                             f"        pk.store_vec(out, _pk_i * {VEC}, ({results}))\n"
                             f"        _pk_i += _pk_step\n")
        return define_kernel(name, source, self._namespace(), f"elementwise {self.name}")

    def _vec_calls(self, pattern: tuple, element) -> str:
        """"FN(..), FN(..), .." for the VEC outputs of a thread: array argument j's value for
        output e is element(j, name, e), scalars are passed as they are."""
        return ", ".join(
            "FN(" + ", ".join(element(j, p, e) if arr else p for j, (p, arr) in
                              enumerate(zip(self.params, pattern))) + ")"
            for e in range(VEC))

    def _generate(self, pattern: tuple, vec: bool):
        """Source of the kernel for `pattern` (True: that argument is an array), with VEC-wide
        vector accesses when `vec`, compiled through the ordinary front end."""
        name = f"{self.name}_elementwise"
        params = self._signature(pattern)

        def call(index: str) -> str:
            return "FN(" + ", ".join(f"{p}{index}" if arr else p
                                     for p, arr in zip(self.params, pattern)) + ")"
        # locals and the length are _pk_-prefixed: user parameter names cannot collide
        head = (f"def {name}(_pk_n: i64, out: Ptr[R], {params}):\n"
                f"    _pk_i = i64(pk.block_idx.x) * i64(pk.block_dim.x) + "
                f"i64(pk.thread_idx.x)\n"
                f"    _pk_step = i64(pk.grid_dim.x) * i64(pk.block_dim.x)\n")
        if not vec:
            source = head + (f"    while _pk_i < _pk_n:\n"
                             f"        out[_pk_i] = {call('[_pk_i]')}\n"
                             f"        _pk_i += _pk_step\n")
        else:
            loads = "".join(
                f"        {', '.join(f'_pk_{j}_{e}' for e in range(VEC))} = "
                f"pk.load_vec({p}, {VEC} * _pk_j, {VEC})\n"
                for j, (p, arr) in enumerate(zip(self.params, pattern)) if arr)
            results = self._vec_calls(pattern, lambda j, p, e: f"_pk_{j}_{e}")
            source = head + (f"    _pk_j = _pk_i\n"
                             f"    while _pk_j < _pk_n // {VEC}:\n"
                             f"{loads}"
                             f"        pk.store_vec(out, {VEC} * _pk_j, ({results}))\n"
                             f"        _pk_j += _pk_step\n"
                             f"    _pk_k = _pk_n // {VEC} * {VEC} + _pk_i\n"
                             f"    if _pk_k < _pk_n:\n"
                             f"        out[_pk_k] = {call('[_pk_k]')}\n")
        return define_kernel(name, source, self._namespace(), f"elementwise {self.name}")


def _coalesce(shape: tuple, shapes: list) -> tuple:
    """(extents, per-array element strides) of the broadcast of `shapes` to `shape`, with
    extent-1 dimensions dropped and adjacent dimensions merged wherever every array either
    walks both contiguously (outer stride = inner stride x inner extent) or broadcasts along
    both; at least one dimension."""
    nd = len(shape)
    strides = []
    for own in shapes:
        own = (1,) * (nd - len(own)) + tuple(own)
        step, st = 1, [0] * nd
        for d in range(nd - 1, -1, -1):
            st[d] = step if own[d] != 1 else 0
            step *= own[d]
        strides.append(st)
    keep = [d for d in range(nd) if shape[d] != 1] or [nd - 1] if nd else []
    extents, merged = [], [[] for _ in shapes]
    for d in reversed(keep):                # innermost first
        if extents and all(st[d] == m[0] * extents[0] for st, m in zip(strides, merged)):
            extents[0] *= shape[d]          # continues every array's walk: same group
            continue
        extents.insert(0, shape[d] if nd else 1)
        for st, m in zip(strides, merged):
            m.insert(0, st[d] if nd else 0)
    if not extents:
        extents, merged = [1], [[0] for _ in shapes]
    return extents, merged
