"""`@pk.func` device functions: the object the decorator makes, which kernels calling it inline.
Its own module so that the lowering (lower/calls.py) and the cache key (cache.py) can know it
without importing kernel.py, which imports the compiler."""
from __future__ import annotations

import functools


class DeviceFunction:
    """A @pk.func: inlined into the kernels that call it."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__
        functools.update_wrapper(self, fn)
        self._parsed = None
        self._annotations = None

    def parsed(self):
        if self._parsed is None:
            from .frontend.parse import parse
            self._parsed = parse(self.fn)
        return self._parsed

    def annotations(self) -> dict:
        if self._annotations is None:
            from .signature import annotations
            self._annotations = annotations(self.fn)     # a bad one: a located error
        return self._annotations

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"@pk.func '{self.name}' can only be called from a kernel or another "
                           "@pk.func")
