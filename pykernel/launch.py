"""`kernel[grid, block, stream, shared_bytes, cluster](*args)`: split Const/dtype arguments
from runtime ones, pick (or compile) the specialization for the current device, and launch it."""
from __future__ import annotations

import numpy as np

from . import compile_pool
from .errors import LaunchError
from .runtime.limits import check_geometry
from .signature import type_var_name
from .types import from_numpy


def _dim3(value, what, kernel_name):
    if type(value) is int and value >= 1:       # the common case, cheaply
        return (value, 1, 1)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),)
    if not isinstance(value, tuple) or not 1 <= len(value) <= 3 or \
            not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
                    for v in value):
        raise LaunchError(f"{kernel_name}[...]: {what} must be a positive int or a tuple of 1-3 "
                          f"positive ints, got {value!r}")
    return tuple(int(v) for v in value) + (1,) * (3 - len(value))


def _shared_bytes(value, kernel_name) -> int:
    """The dynamic shared-memory size: a non-negative int (None: 0)."""
    if value is None:
        return 0
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise LaunchError(f"{kernel_name}[...]: shared_bytes (dynamic shared memory per "
                          f"block) must be a non-negative int, got {value!r}")
    return int(value)


MAX_CLUSTER = 16     # blocks per cluster on sm_90 with the non-portable opt-in (8 without)


def _cluster(value, grid, kernel_name):
    """Cluster dims (x, y, z): positive, at most MAX_CLUSTER blocks, dividing the grid."""
    dims = _dim3(value, "cluster", kernel_name)
    size = dims[0] * dims[1] * dims[2]
    if size > MAX_CLUSTER:
        raise LaunchError(f"{kernel_name}: a cluster of {dims} is {size} blocks; at most "
                          f"{MAX_CLUSTER} blocks per cluster (8 portable)")
    if any(g % c for g, c in zip(grid, dims)):
        raise LaunchError(f"{kernel_name}: grid {grid} is not a whole number of clusters "
                          f"{dims}: each grid extent must be a multiple of the cluster's")
    return dims


class Launcher:
    def __init__(self, kernel, config):
        if not isinstance(config, tuple):
            config = (config,)
        if not 2 <= len(config) <= 5:
            raise LaunchError(f"{kernel.name}[...] takes grid, block[, stream[, shared_bytes"
                              f"[, cluster]]]")
        self.kernel = kernel
        self.grid = _dim3(config[0], "grid", kernel.name)
        self.block = _dim3(config[1], "block", kernel.name)
        self.stream = config[2] if len(config) > 2 else None
        self.shared_bytes = _shared_bytes(config[3], kernel.name) if len(config) > 3 else 0
        check_geometry(kernel.name, self.grid, self.block, self.shared_bytes)
        self.cluster = _cluster(config[4], self.grid, kernel.name) \
            if len(config) > 4 and config[4] is not None else None
        limit, threads = kernel.options.max_threads, self.block[0] * self.block[1] * self.block[2]
        if limit and threads > limit:
            raise LaunchError(f"{kernel.name}[grid={self.grid}, block={self.block}]: {threads} "
                              f"threads per block, but the kernel is declared with "
                              f"max_threads={limit}")

    def __call__(self, *args, **kwargs):
        k = self.kernel
        names, typevars = _plan(k)
        if len(args) > len(names):
            raise LaunchError(f"{k.name}(): takes {len(names)} arguments "
                              f"({', '.join(names)}), got {len(args)}")
        bound = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise LaunchError(f"{k.name}(): unknown parameter '{key}'")
            if key in bound:
                raise LaunchError(f"{k.name}(): parameter '{key}' given twice")
            bound[key] = value
        missing = [n for n in names if n not in bound]
        if missing:
            raise LaunchError(f"{k.name}(): missing argument(s) {', '.join(missing)}")
        spec_kwargs = {p.name: bound[p.name] for p in k.const_params}
        for p, tv in typevars:       # infer type variables from array arguments
            if tv not in spec_kwargs:
                dtype = getattr(bound[p.name], "dtype", None)
                if dtype is None:
                    raise LaunchError(f"{k.name}(): parameter '{p.name}' needs an array to "
                                      f"infer its element type {tv}")
                spec_kwargs[tv] = from_numpy(dtype)
        runtime_args = tuple(bound[p.name] for p in k.runtime_params)
        from .runtime.device import current_device
        device = current_device()
        if compile_pool.RECORDING is not None and \
                compile_pool.record(k, device.arch, spec_kwargs, None):
            return
        # spec_kwargs is built in parameter order, so the key needs no sorting
        key = (device.arch, tuple((n, getattr(v, "name", v)) for n, v in spec_kwargs.items()))
        compiled = k._launch_cache.get(key)
        if compiled is None:
            compiled = k.compile(device.arch, **spec_kwargs)
            k._launch_cache[key] = compiled
        if compiled.hidden_extents:
            runtime_args += tuple(_nbytes(k, a) for p, a in zip(k.runtime_params, runtime_args)
                                  if p.kind == "ptr")
        if self.cluster is None:
            device.launch(compiled, self.grid, self.block, runtime_args, stream=self.stream,
                          shared_bytes=self.shared_bytes)
        else:
            device.launch(compiled, self.grid, self.block, runtime_args, stream=self.stream,
                          shared_bytes=self.shared_bytes, cluster=self.cluster)


def _plan(kernel):
    """Per kernel, once: parameter names, and the pointer parameters whose element type is a
    type variable (inferred from the array passed). Launches are on the runner's hot path."""
    plan = kernel.__dict__.get("_launch_plan")
    if plan is None:
        typevars = []
        for p in kernel.runtime_params:
            tv = type_var_name(getattr(p.ann, "elem", None)) \
                if p.kind in ("ptr", "array") else None
            if tv is not None:
                typevars.append((p, tv))
        plan = kernel._launch_plan = ([p.name for p in kernel.params], tuple(typevars))
    return plan


def _nbytes(kernel, value) -> int:
    nbytes = getattr(value, "nbytes", None)
    if nbytes is None and hasattr(value, "__cuda_array_interface__"):
        cai = value.__cuda_array_interface__
        nbytes = int(np.prod(cai["shape"])) * np.dtype(cai["typestr"]).itemsize
    if nbytes is None:
        raise LaunchError(f"{kernel.name}(): bounds checks need arrays with a known size")
    return int(nbytes)
