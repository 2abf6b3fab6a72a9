"""Stand-ins for the compiler's output and the CPU device, so runtime tests do not depend on
the compiler: `FakeCompiled` has the CompiledKernel attributes the runtime reads, and
`FakeHostDevice` runs a Python function on numpy views of the arguments."""
from __future__ import annotations

import ctypes
import itertools
from collections import namedtuple
from dataclasses import dataclass, field

import numpy as np

ParamABI = namedtuple("ParamABI", "name kind dtype size align readonly")
_keys = itertools.count()


def ptr(name, dtype, readonly=False):
    return ParamABI(name, "ptr", np.dtype(dtype) if dtype != "bfloat16" else dtype, 8, 8,
                    readonly)


def scalar(name, dtype):
    size = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    return ParamABI(name, "scalar", np.dtype(dtype) if dtype != "bfloat16" else dtype, size,
                    size, False)


@dataclass
class FakeCompiled:
    name: str
    params: list
    ptx: str = ""
    entry: str = ""
    target: str = "nvptx"
    arch: str = "sm_75"
    shared_bytes: int = 0
    cache_key: str = field(default_factory=lambda: f"fake-{next(_keys)}")
    run: object = None  # FakeHostDevice: run(*args) with arrays as numpy views

    def __post_init__(self):
        self.entry = self.entry or self.name


def host_view(array):
    """A numpy view of a host Array's memory (the fake device's 'kernel' writes through it)."""
    buffer = (ctypes.c_uint8 * array.nbytes).from_address(array.ptr)
    return np.frombuffer(buffer, dtype=array.dtype).reshape(array.shape)


class FakeHostDevice:
    kind, arch, name = "cpu", "host", "fake host device"

    def __init__(self):
        self.launched = []

    def launch(self, compiled, grid, block, args, stream=None, shared_bytes=0):
        self.launched.append(compiled.name)
        views = [host_view(a) if hasattr(a, "ptr") else a for a in args]
        compiled.run(*views)

    def synchronize(self):
        pass
