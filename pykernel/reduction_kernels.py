"""`@pk.reduction`: reduce every element of an array with a binary function (Numba's
`cuda.reduce`, CuPy's ReductionKernel), optionally mapping each element first.

    @pk.reduction(identity=0.0)
    def total(a: f32, b: f32) -> f32:
        return a + b

    s = total(x)                           # a 0-d array on the device: s.numpy()
    total(x, out=s)
    rows = total(m, axis=-1)               # along the last axis: shape m.shape[:-1]

    @pk.reduction(identity=0.0, map=square)    # square: a @pk.func (v: f16) -> f32
    def sum_of_squares(a: f32, b: f32) -> f32:
        return a + b

The function must be associative and commutative (sums, max, min, and, or, ...): partial results
are combined in a tree whose shape depends on the launch. Two launches of generated kernels:
the first has each thread fold a grid-stride slice of the (mapped) elements (4-wide vector loads
into 4 accumulators, two loads in flight per trip, when the array is aligned for them), then the
block's threads combine theirs through warp shuffles and shared memory into one partial per
block; the second folds the partials the same way in one block. Along the last axis one launch:
a warp per row for rows of up to WARP_ROW_MAX elements (shuffles only), else a block per row.
All deterministic for a given shape and device (no atomics). Accumulator types: 32- and 64-bit
ints and floats.
"""
from __future__ import annotations

import inspect
import math

from .errors import LaunchError
from .generated import define_kernel, vector_aligned
from .kernel import DeviceFunction
from .types import Ptr, ScalarType, i64

THREADS = 256            # per block: 8 warps
ITEMS_PER_THREAD = 8     # elements a thread folds before more blocks are worth launching
MAX_PARTIALS = 2048      # blocks of the first pass (partials of the second)
VEC = 4                  # elements per vector load (16 bytes of f32) on aligned inputs
WARP_ROW_MAX = 2048      # axis=-1: rows up to this long get a warp each, longer a block each


def reduction(fn=None, *, identity, map=None):
    """Decorator: see the module docstring. `identity` is op's neutral element (0 for sums,
    -inf for max, ...); `map` an optional one-argument @pk.func applied to each element."""
    def wrap(f):
        return Reduction(f, identity, map)
    return wrap if fn is None else wrap(fn)


def _annotations(func: DeviceFunction, what: str, count: int):
    params = list(inspect.signature(func.fn).parameters)
    ann = func.annotations()
    types = [ann.get(p) for p in params] + [ann.get("return")]
    if len(params) != count or not all(isinstance(t, ScalarType) for t in types):
        raise TypeError(f"@pk.reduction {what} '{func.name}' must take {count} argument(s) and "
                        f"return a value, every one annotated with a scalar type")
    return types


class Reduction:
    def __init__(self, fn, identity, map_fn):
        self.op = fn if isinstance(fn, DeviceFunction) else DeviceFunction(fn)
        self.name = self.op.name
        a, b, result = _annotations(self.op, "function", 2)
        if not a == b == result:
            raise TypeError(f"@pk.reduction {self.name}: both arguments and the result must "
                            f"have one type (the accumulator's), got {a}, {b} -> {result}")
        if result.kind == "bool" or result.bits not in (32, 64):
            raise TypeError(f"@pk.reduction {self.name}: the accumulator must be a 32- or "
                            f"64-bit int or float (warp shuffles move it), got {result}")
        self.acc = result
        self.input = result
        self.map = None
        if map_fn is not None:
            self.map = map_fn if isinstance(map_fn, DeviceFunction) else DeviceFunction(map_fn)
            source, mapped = _annotations(self.map, "map", 1)
            if mapped != result:
                raise TypeError(f"@pk.reduction {self.name}: map '{self.map.name}' returns "
                                f"{mapped}, the accumulator is {result}")
            self.input = source
        if not isinstance(identity, (bool, int, float)):
            raise TypeError(f"@pk.reduction {self.name}: identity must be a number, got "
                            f"{identity!r}")
        self.identity = identity
        self._kernels = {}
        self._scratch = {}      # (device, stream) -> the partials buffer
        self.__doc__ = self.op.fn.__doc__

    def __call__(self, x, out=None, stream=None, axis=None):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise LaunchError(f"{self.name}(): expects an array, got {type(x).__name__}")
        from .runtime import empty
        if axis is not None:
            return self._rows(x, out, stream, axis)
        if out is None:
            out = empty((), self.acc.np_dtype)
        elif getattr(out, "size", None) != 1:
            raise LaunchError(f"{self.name}(): out must hold one element, got shape "
                              f"{tuple(out.shape)}")
        n = math.prod(x.shape)
        blocks = max(1, min(-(-n // (THREADS * ITEMS_PER_THREAD)), MAX_PARTIALS))
        vec = vector_aligned(x, self.input, VEC)
        if blocks == 1:
            self._kernel(True, vec)[1, THREADS, stream](n, out, x)
            return out
        partials = self._partials(stream)
        self._kernel(True, vec)[blocks, THREADS, stream](n, partials, x)
        self._kernel(False)[1, THREADS, stream](blocks, out, partials)
        return out

    def _rows(self, x, out, stream, axis):
        """Reduce along the last axis: out[r] = fold of row r, out shaped x.shape[:-1]."""
        from .runtime import empty
        ndim = len(x.shape)
        if ndim == 0 or axis not in (-1, ndim - 1):
            raise LaunchError(f"{self.name}(): axis must be None (the whole array) or the last "
                              f"axis ({ndim - 1} or -1), got {axis!r}")
        shape = tuple(x.shape[:-1])
        cols = int(x.shape[-1])
        rows = math.prod(shape)
        if out is None:
            out = empty(shape, self.acc.np_dtype)
        elif tuple(out.shape) != shape:
            raise LaunchError(f"{self.name}(): out must have shape {shape} (x without its last "
                              f"axis), got {tuple(out.shape)}")
        if rows == 0:
            return out
        vec = cols % VEC == 0 and vector_aligned(x, self.input, VEC)
        if cols <= WARP_ROW_MAX:        # a warp per row, THREADS // 32 rows per block
            per_block = THREADS // 32
            self._kernel(True, vec, "warp_rows")[-(-rows // per_block), THREADS, stream](
                cols, out, x, rows)
        else:                           # a block per row
            self._kernel(True, vec, "block_rows")[rows, THREADS, stream](cols, out, x)
        return out

    def _partials(self, stream):
        """The first pass's output, kept per device and stream: allocating (and freeing,
        which waits for the device) a buffer per call would cost more than a small sum."""
        from .runtime import current_device, empty
        device = current_device()
        key = (device.kind, getattr(device, "ordinal", 0), stream)
        buf = self._scratch.get(key)
        if buf is None:
            buf = self._scratch[key] = empty(MAX_PARTIALS, self.acc.np_dtype)
        return buf

    def kernel(self, first_pass: bool = True, vector: bool = False, mode: str = "whole"):
        """A generated @pk.kernel of this reduction: the first pass over the input (through
        map) or the second over the per-block partials; vector: 4-wide loads (taken for
        16-byte aligned inputs); mode "whole" (the whole array), "block_rows" or "warp_rows"
        (axis=-1: a block or a warp per row). Inspect it with `.ptx(arch)` / `.llvm_ir(arch)`."""
        if mode not in ("whole", "block_rows", "warp_rows"):
            raise ValueError(f"{self.name}.kernel(): mode is 'whole', 'block_rows' or "
                             f"'warp_rows', got {mode!r}")
        return self._kernel(first_pass, vector and first_pass and mode == "whole", mode)

    def ptx(self, arch: str = "sm_90", first_pass: bool = True, vector: bool = False,
            mode: str = "whole") -> str:
        """PTX of the kernel `kernel(first_pass, vector, mode)` names."""
        return self.kernel(first_pass, vector, mode).ptx(arch)

    def _kernel(self, mapped: bool, vec: bool = False, mode: str = "whole"):
        k = self._kernels.get((mapped, vec, mode))
        if k is None:
            k = self._kernels[(mapped, vec, mode)] = self._generate(mapped, vec, mode)
        return k

    def _generate(self, mapped: bool, vec: bool, mode: str = "whole"):
        """First pass (mapped: the input elements through map) or second (the partials); vec:
        VEC-wide vector loads into VEC accumulators (op is associative and commutative).
        mode "whole": the grid folds n elements into one partial per block; "block_rows": block
        b folds row b (n elements) into out[b]; "warp_rows": warp w of block b folds row
        WARPS * b + w of `rows` into its out."""
        name = f"{self.name}_reduce" + ("" if mapped else "_partials") + \
            ("" if mode == "whole" else f"_{mode}")
        fold = "OP(acc{e}, MAP({v}))" if mapped and self.map is not None else "OP(acc{e}, {v})"
        if vec:
            names = ", ".join(f"v{e}" for e in range(VEC))
            later = ", ".join(f"w{e}" for e in range(VEC))
            # two vectors per trip, both loads issued before the folds wait for either
            loop = (f"    j = i\n"
                    f"    while j + step < n // {VEC}:\n"
                    f"        {names} = pk.load_vec(x, {VEC} * j, {VEC})\n"
                    f"        {later} = pk.load_vec(x, {VEC} * (j + step), {VEC})\n" +
                    "".join(f"        acc{e} = {fold.format(e=e, v=f'v{e}')}\n"
                            f"        acc{e} = {fold.format(e=e, v=f'w{e}')}\n"
                            for e in range(VEC)) +
                    f"        j += 2 * step\n"
                    f"    if j < n // {VEC}:\n"
                    f"        {names} = pk.load_vec(x, {VEC} * j, {VEC})\n" +
                    "".join(f"        acc{e} = {fold.format(e=e, v=f'v{e}')}\n"
                            for e in range(VEC)) +
                    f"    k = n // {VEC} * {VEC} + i\n"
                    f"    if k < n:\n"
                    f"        acc0 = {fold.format(e=0, v='x[k]')}\n")
            accs = "".join(f"    acc{e} = A(IDENTITY)\n" for e in range(VEC))
            combine = "    acc = " + _tree([f"acc{e}" for e in range(VEC)]) + "\n"
        else:
            loop = (f"    while i < n:\n"
                    f"        acc0 = {fold.format(e=0, v='x[i]')}\n"
                    f"        i += step\n")
            accs = "    acc0 = A(IDENTITY)\n"
            combine = "    acc = acc0\n"
        element = 'S' if mapped else 'A'
        if mode == "whole":
            head = (f"def {name}(n: i64, out: Ptr[A], x: Ptr[{element}, 'ro']):\n"
                    f"{accs}"
                    f"    i = i64(pk.block_idx.x) * i64(pk.block_dim.x) + "
                    f"i64(pk.thread_idx.x)\n"
                    f"    step = i64(pk.grid_dim.x) * i64(pk.block_dim.x)\n")
        elif mode == "block_rows":
            head = (f"def {name}(n: i64, out: Ptr[A], rows_x: Ptr[{element}, 'ro']):\n"
                    f"{accs}"
                    f"    x = rows_x + i64(pk.block_idx.x) * n\n"
                    f"    i = i64(pk.thread_idx.x)\n"
                    f"    step = i64(pk.block_dim.x)\n")
        else:                       # warp_rows: no block-wide combine
            loop = "".join("    " + line + "\n" for line in loop.splitlines())
            return self._define(name, (
                f"def {name}(n: i64, out: Ptr[A], rows_x: Ptr[{element}, 'ro'], rows: i64):\n"
                f"    row = i64(pk.block_idx.x) * i64(pk.block_dim.x // 32) + "
                f"i64(pk.thread_idx.x // 32)\n"
                f"    if row < rows:\n"
                f"    {accs.replace(chr(10) + '    ', chr(10) + '        ')}"
                f"        x = rows_x + row * n\n"
                f"        i = i64(pk.thread_idx.x % 32)\n"
                f"        step = i64(32)\n"
                f"{loop}"
                f"    {combine}"
                f"        for k in pk.static_range(5):\n"
                f"            acc = OP(acc, pk.shfl_xor(acc, 16 >> k))\n"
                f"        if pk.thread_idx.x % 32 == 0:\n"
                f"            out[row] = acc\n"))
        source = (
            f"{head}"
            f"{loop}"
            f"{combine}"
            f"    for k in pk.static_range(5):\n"
            f"        acc = OP(acc, pk.shfl_xor(acc, 16 >> k))\n"
            f"    warps = pk.shared_array(A, 32)\n"
            f"    lane = pk.thread_idx.x % 32\n"
            f"    warp = pk.thread_idx.x // 32\n"
            f"    if lane == 0:\n"
            f"        warps[warp] = acc\n"
            f"    pk.syncthreads()\n"
            f"    if warp == 0:\n"
            f"        acc = warps[lane] if lane < pk.block_dim.x // 32 else A(IDENTITY)\n"
            f"        for k in pk.static_range(5):\n"
            f"            acc = OP(acc, pk.shfl_xor(acc, 16 >> k))\n"
            f"        if lane == 0:\n"
            f"            out[pk.block_idx.x] = acc\n")
        return self._define(name, source)

    def _define(self, name: str, source: str):
        import pykernel as pk
        namespace = {"pk": pk, "Ptr": Ptr, "i64": i64, "A": self.acc, "S": self.input,
                     "OP": self.op, "MAP": self.map, "IDENTITY": self.identity}
        return define_kernel(name, source, namespace, f"reduction {self.name}")


def _tree(terms: list) -> str:
    """OP(OP(a, b), OP(c, d)): the accumulators combined pairwise."""
    while len(terms) > 1:
        terms = [f"OP({terms[i]}, {terms[i + 1]})" for i in range(0, len(terms), 2)]
    return terms[0]
