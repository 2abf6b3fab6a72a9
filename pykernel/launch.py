"""`kernel[grid, block, stream, shared_bytes, cluster](*args)`: split Const/dtype arguments
from runtime ones, pick (or compile) the specialization for the current device, and launch it."""
from __future__ import annotations

import functools

import numpy as np

from . import compile_pool
from .errors import LaunchError
from .runtime import device as _devices
from .runtime.device import current_device
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


class Launcher(functools.partial):
    """`kernel[grid, block, ...]`: one validated launch configuration, called with the
    kernel's arguments. A functools.partial subclass, so that a call goes from C straight
    into the function the partial holds (a Python `__call__` taking *args and **kwargs
    measured ~100 ns more per launch): first `_call`, the full path; once a plain call has
    picked its compiled variant on a device that offers one (`device.fast_launch`), that
    device's generated function, which checks the launch mode, packs and calls the driver,
    and hands anything else (keywords, another current device, a capture, a dry run) back to
    `_call`."""

    def __new__(cls, kernel, config):
        launcher = super().__new__(cls, _unbound)
        launcher._configure(kernel, config)
        launcher._fast = {}        # device -> its fast function for this launcher
        launcher._seen = None      # the device of a first plain call (no fast function yet)
        launcher._use(launcher._call)
        return launcher

    def _use(self, function):
        """Make `function` what a call of this launcher runs (partial's own setter)."""
        self.__setstate__((function, (), None, self.__dict__))

    def _configure(self, kernel, config):
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
        self._fixed = None     # (device, programmatic mode, compiled) of the last plain call

    def __repr__(self):
        return f"<launcher {self.kernel.name}[{self.grid}, {self.block}]>"

    def __reduce__(self):
        raise TypeError("a Launcher cannot be pickled: pickle the kernel's module and name")

    def _call(self, *args, **kwargs):
        """The general call: bind arguments, pick (or compile) the variant, launch; and, for a
        plain call on a device with `fast_launch`, switch to its fast function."""
        k = self.kernel
        if kwargs or k.const_params or len(args) != len(k.runtime_params) or _plan(k)[1]:
            args, spec_kwargs = self._bind(args, kwargs)
        else:
            spec_kwargs = _NO_SPEC
        device = current_device()
        programmatic = getattr(device, "programmatic_launch", False)
        fixed = self._fixed
        if fixed is not None and fixed[0] is device and fixed[1] == programmatic and \
                spec_kwargs is _NO_SPEC and compile_pool.RECORDING is None:
            compiled = fixed[2]
        else:
            compiled = self._specialize(device, programmatic, spec_kwargs)
            if compiled is None:
                return                      # recorded by pk.precompile's dry run
        if compiled.hidden_extents:
            args += tuple(_nbytes(k, a) for p, a in zip(k.runtime_params, args)
                          if p.kind == "ptr")
        if self.cluster is None:
            device.launch(compiled, self.grid, self.block, args, self.stream,
                          self.shared_bytes)
        else:
            device.launch(compiled, self.grid, self.block, args, self.stream,
                          self.shared_bytes, self.cluster)
        if spec_kwargs is _NO_SPEC and not programmatic and self.cluster is None and \
                not compiled.hidden_extents:
            self._switch_to_fast(device, compiled)

    def _switch_to_fast(self, device, compiled):
        """After a plain call went through: the device's fast function for the next calls
        (made once per device, at the second plain call: generating it takes ~0.2 ms, which
        a configuration launched once should not pay; it comes back to `_call` whenever the
        mode changed)."""
        make = getattr(device, "fast_launch", None)
        if make is None:
            return
        fast = self._fast.get(device)
        if fast is None:
            if self._seen is not device:        # its first plain call there
                self._seen = device
                return
            fast = make(compiled, self.grid, self.block, self.stream, self.shared_bytes,
                        fallback=self._call, guard=_FAST_GUARD)
            if fast is None:
                return
            self._fast[device] = fast
        if self.func is not fast:
            self._use(fast)

    def bind(self, *args, **kwargs) -> BoundLaunch:
        """This launch with these arguments, checked and packed once: `.launch()` then
        repeats it at the cost of the driver call (loops that launch the same kernel with
        the same arguments; the arrays are kept alive by the object)."""
        k = self.kernel
        runtime_args, spec_kwargs = self._bind(args, kwargs)
        device = current_device()
        compiled = self._specialize(device, getattr(device, "programmatic_launch", False),
                                    spec_kwargs or _NO_SPEC, record=False)
        if compiled.hidden_extents:
            runtime_args += tuple(_nbytes(k, a) for p, a in zip(k.runtime_params, runtime_args)
                                  if p.kind == "ptr")
        return BoundLaunch(device, compiled, self, runtime_args,
                           functools.partial(self, *args, **kwargs))

    def _bind(self, args, kwargs) -> tuple:
        """(runtime arguments in parameter order, Const and type-variable values)."""
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
                spec_kwargs[tv] = _element_type(k, p, tv, bound[p.name])
        return tuple(bound[p.name] for p in k.runtime_params), spec_kwargs

    def _specialize(self, device, programmatic, spec_kwargs, record=True):
        """The compiled variant for this device, launch mode and specialization (compiled on
        first use, then kept); None when pk.precompile's dry run recorded it instead."""
        k = self.kernel
        options = k.launch_options(device.arch, programmatic)
        if record and compile_pool.RECORDING is not None and \
                compile_pool.record(k, device.arch, spec_kwargs, options):
            return None
        # spec_kwargs is built in parameter order, so the key needs no sorting
        key = (device.arch, options.pdl,
               tuple((n, getattr(v, "name", v)) for n, v in spec_kwargs.items()))
        compiled = k._launch_cache.get(key)
        if compiled is None:
            compiled = _compile_for_device(k, device.arch, options, spec_kwargs)
            k._launch_cache[key] = compiled
        if spec_kwargs is _NO_SPEC:
            self._fixed = (device, programmatic, compiled)
        return compiled


def _compile_for_device(kernel, arch, options, spec_kwargs):
    """Kernels compile for the device's plain arch; one that uses an arch-specific instruction
    (wgmma, setmaxnreg: ArchSpecificError) compiles for the variant, so only it gets
    `.target sm_90a`."""
    from .errors import ArchSpecificError
    try:
        return kernel.compile(arch, options, **spec_kwargs)
    except ArchSpecificError as err:
        if err.arch.rstrip("a") != arch:
            raise
        return kernel.compile(err.arch, options, **spec_kwargs)


_NO_SPEC: dict = {}     # a kernel without Const or type-variable parameters (never mutated)

# what a device's fast function checks besides its own mode (an expression over these names;
# `device` is the device itself): the current device, and no pk.precompile dry run
_FAST_GUARD = ("_devices._current is not device or _pool.RECORDING is not None",
               {"_devices": _devices, "_pool": compile_pool})


def _unbound(*args, **kwargs):
    raise RuntimeError("a Launcher is being constructed")


def _element_type(kernel, param, type_var, value):
    """The pykernel scalar type of an array argument's elements (torch dtypes by name)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        raise LaunchError(f"{kernel.name}(): parameter '{param.name}' needs an array to "
                          f"infer its element type {type_var}")
    if type(dtype).__module__ == "torch":
        dtype = str(dtype).removeprefix("torch.")
    try:
        return from_numpy(dtype)
    except TypeError as exc:
        raise LaunchError(f"{kernel.name}(): parameter '{param.name}': {exc}") from None


class BoundLaunch:
    """One launch (kernel variant, geometry, stream, arguments) prepared by
    `kernel[grid, block].bind(*args)`; `launch()` runs it again. On cuda it owns a copy of
    the packed parameters, so other launches of the kernel do not disturb it, and calls the
    driver directly; while a graph capture, a programmatic_launches() block or
    PYKERNEL_SYNC_LAUNCH is active it is the ordinary call `kernel[grid, block](*args)`
    (which picks the variant that mode loads)."""
    __slots__ = ("args", "block", "compiled", "grid", "launch")

    def __init__(self, device, compiled, launcher, args, as_a_call):
        self.compiled, self.args = compiled, args
        self.grid, self.block = launcher.grid, launcher.block
        extra = () if launcher.cluster is None else (launcher.cluster,)
        bind = getattr(device, "bind", None)
        if bind is not None:
            self.launch = bind(compiled, launcher.grid, launcher.block, args, launcher.stream,
                               launcher.shared_bytes, *extra, fallback=as_a_call)
        else:
            self.launch = functools.partial(device.launch, compiled, launcher.grid,
                                            launcher.block, args, launcher.stream,
                                            launcher.shared_bytes, *extra)

    def __repr__(self):
        return f"<bound launch of {self.compiled.name}[{self.grid}, {self.block}]>"


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
