"""`@pk.elementwise`: a scalar function applied to every element of arrays (Numba's
`@vectorize(target="cuda")`, CuPy's ElementwiseKernel), without writing the kernel.

    @pk.elementwise
    def axpb(x: f32, y: f32, a: f32) -> f32:
        return a * x + y

    z = axpb(x, y, 2.0)            # arrays of one shape and scalars -> a new array of that shape
    axpb(x, y, 2.0, out=z)         # or into an existing one (may be an input)

The function is an ordinary @pk.func (its body follows the kernel language, its parameters and
result are annotated scalar types). Each call pattern (which arguments are arrays) gets one
generated kernel: thread i of a grid-stride loop computes out[i] = f(x[i], y[i], a), arrays
flat and contiguous, scalars passed by value. The generated source is registered with
linecache, so the compiler, its disk cache and its error messages treat it like a file; errors
in the function's body point at the user's own lines.
"""
from __future__ import annotations

import hashlib
import inspect
import linecache

from .errors import LaunchError
from .kernel import DeviceFunction, kernel
from .types import Ptr, ScalarType, i64

THREADS = 256
MAX_BLOCKS = 65535 * 8   # the grid-stride loop covers larger arrays


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
        shapes = {tuple(a.shape) for a, is_arr in zip(args, pattern) if is_arr}
        if out is not None:
            shapes.add(tuple(out.shape))
        if not shapes:
            raise LaunchError(f"{self.name}(): needs at least one array argument (or out=)")
        if len(shapes) > 1:
            given = ", ".join(f"{n} {tuple(a.shape)}" for n, a, is_arr in
                              zip(self.params, args, pattern) if is_arr)
            given += f", out {tuple(out.shape)}" if out is not None else ""
            raise LaunchError(f"{self.name}(): array arguments must have one shape (no "
                              f"broadcasting), got {given}")
        shape = shapes.pop()
        if out is None:
            from .runtime import empty
            out = empty(shape, self.result.np_dtype)
        n = 1
        for extent in shape:
            n *= extent
        if n == 0:
            return out
        blocks = min(-(-n // self.threads), MAX_BLOCKS)
        self._kernel(pattern)[blocks, self.threads, stream](n, out, *args)
        return out

    def _kernel(self, pattern: tuple):
        k = self._kernels.get(pattern)
        if k is None:
            k = self._kernels[pattern] = self._generate(pattern)
        return k

    def _generate(self, pattern: tuple):
        """Source of the kernel for `pattern` (True: that argument is an array), compiled
        through the ordinary front end."""
        name = f"{self.name}_elementwise"
        params = ", ".join(f"{p}: Ptr[T{j}, 'ro']" if arr else f"{p}: T{j}"
                           for j, (p, arr) in enumerate(zip(self.params, pattern)))
        call = ", ".join(f"{p}[i]" if arr else p for p, arr in zip(self.params, pattern))
        source = (f"def {name}(n: i64, out: Ptr[R], {params}):\n"
                  f"    i = i64(pk.block_idx.x) * i64(pk.block_dim.x) + i64(pk.thread_idx.x)\n"
                  f"    step = i64(pk.grid_dim.x) * i64(pk.block_dim.x)\n"
                  f"    while i < n:\n"
                  f"        out[i] = FN({call})\n"
                  f"        i += step\n")
        digest = hashlib.sha256(source.encode()).hexdigest()[:12]
        filename = f"<pykernel elementwise {self.name} {digest}>"
        import pykernel as pk
        namespace = {"__name__": f"pykernel.elementwise.generated.{digest}", "pk": pk,
                     "Ptr": Ptr, "i64": i64, "R": self.result, "FN": self.func,
                     **{f"T{j}": t for j, t in enumerate(self.types)}}
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
        return kernel(namespace[name])
