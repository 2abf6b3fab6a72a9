"""`@pk.kernel` and `@pk.func`: the user-facing objects. A Kernel compiles one specialization
per (arch, Const values, dtypes) and launches numba-style: `kernel[grid, block](*args)`."""
from __future__ import annotations

import dataclasses
import functools

from .device_function import DeviceFunction
from .errors import KernelSourceError
from .lower.context import Options
from .signature import normalize_const, read_signature, type_var_name
from .types import from_numpy


# launch configurations whose validated Launcher a kernel keeps (then it starts over)
MAX_LAUNCHERS = 256


class Kernel:
    is_kernel = True    # lower/calls.py rejects calling one from device code without importing
                        # this module (which imports the compiler)

    def __init__(self, fn, options: Options):
        self.fn, self.name, self.options = fn, fn.__name__, options
        functools.update_wrapper(self, fn)
        try:
            self.params = read_signature(fn)
        except KernelSourceError as err:
            raise err.with_traceback(None) from None
        self.runtime_params = [p for p in self.params if p.kind in ("scalar", "ptr", "array",
                                                                 "tensormap")]
        self.const_params = [p for p in self.params if p.kind in ("const", "dtype")]
        self._launch_cache = {}
        self._launchers = {}     # launch configuration -> its checked Launcher
        # the variant plain launches load: no PDL prologue (see launch_options)
        self._plain_options = dataclasses.replace(options, pdl=False)

    def launch_options(self, arch: str, programmatic: bool, options: Options | None = None):
        """The options a launch on `arch` compiles with. A kernel declared with pdl=True is
        compiled in two variants on sm_90+, each on first use: the one with the PDL prologue
        (`griddepcontrol.wait` / `launch_dependents`) only for launches that ask for
        programmatic dependent launch (`programmatic_launches()`, `capture_graph(pdl=True)`);
        plain launches load the prologue-free one, which costs nothing in a kernel that never
        overlaps its predecessor (a 3 GiB vector add: 2530 -> 3392 GB/s on an H200). Where
        the prologue is never emitted (pdl=False, the CPU target, before sm_90) there is one
        variant: `options` unchanged."""
        options = options or self.options
        if programmatic or not options.pdl or not pdl_arch(arch):
            return options
        return self._plain_options if options is self.options else \
            dataclasses.replace(options, pdl=False)

    # --- compilation ---------------------------------------------------------------------------
    def spec_from_kwargs(self, kwargs: dict) -> dict:
        spec = {}
        known = {p.name: p for p in self.const_params}
        typevars = {type_var_name(getattr(p.ann, "elem", p.ann)) for p in self.runtime_params}
        typevars.discard(None)
        for name, value in kwargs.items():
            try:
                if name in known:
                    spec[name] = normalize_const(known[name], value)
                elif name in typevars:
                    spec[name] = from_numpy(value)
                else:
                    self._spec_error(None, f"unknown compile-time argument '{name}' (Const "
                                     f"parameters: {', '.join(known) or 'none'})")
            except TypeError as exc:
                self._spec_error(name if name in known else None, str(exc))
        missing = [p.name for p in self.const_params if p.name not in spec]
        if missing:
            self._spec_error(missing[0], f"missing compile-time argument(s): "
                             f"{', '.join(missing)}",
                             hint=f"{self.name}.ptx(arch, {missing[0]}=...)")
        return spec

    def _spec_error(self, param, message, hint=None):
        """Raise a bad compile-time argument as a source error at the parameter (or `def`)."""
        from .signature import signature_error
        err = signature_error(self.fn, param, message, hint)
        raise err.with_traceback(None) from None

    def compile(self, arch: str = "sm_90", options: Options | None = None, **spec_kwargs):
        from . import cache
        spec, options = self.spec_from_kwargs(spec_kwargs), options or self.options
        key = cache.kernel_key(self, arch, spec, options)
        hit = cache.lookup(key, arch)        # warm path: no compiler or LLVM import
        if hit is not None:
            return hit
        from .compiler import compile_kernel
        return compile_kernel(self, arch, spec, options, key)

    def ptx(self, arch: str = "sm_90", **spec_kwargs) -> str:
        return self.compile(arch, **spec_kwargs).ptx

    def llvm_ir(self, arch: str = "sm_90", **spec_kwargs) -> str:
        compiled = self.compile(arch, **spec_kwargs)
        if not compiled.llvm_ir:   # loaded from the disk cache, which keeps no IR: lower again
            from . import cache
            from .compiler import compile_kernel
            spec = self.spec_from_kwargs(spec_kwargs)
            key = cache.kernel_key(self, arch, spec, self.options)
            compiled = compile_kernel(self, arch, spec, self.options, key, fresh=True)
        return compiled.llvm_ir

    # --- occupancy (runtime/occupancy.py) -----------------------------------------------------
    def max_active_blocks(self, block, shared_bytes=0, device=None, **spec) -> int:
        """Blocks of this kernel (block threads, shared_bytes of dynamic shared memory) that
        one multiprocessor holds at once on `device` (CUDA: the driver's occupancy
        calculator for the compiled kernel; CPU target: 1 per host worker thread)."""
        from .runtime.occupancy import occupancy
        return occupancy(self, block, shared_bytes, device, spec)[0]

    def co_resident_grid(self, block, shared_bytes=0, device=None, **spec) -> int:
        """The grid a persistent kernel launches: blocks per multiprocessor x multiprocessors,
        every block resident at once."""
        from .runtime.occupancy import co_resident_grid
        return co_resident_grid(self, block, shared_bytes, device, spec)

    # --- launch --------------------------------------------------------------------------------
    def __getitem__(self, config):
        """kernel[grid, block, stream, shared_bytes, cluster]: the Launcher of that
        configuration, validated once and reused (decode and prefill wrappers launch the same
        few configurations hundreds of times per forward)."""
        try:
            launcher = self._launchers.get(config)
        except TypeError:        # an unhashable part (a list): checked, not kept
            from .launch import Launcher
            return Launcher(self, config)
        if launcher is None:
            # imported here, not per call: an import statement costs ~1 us
            from .launch import Launcher
            launcher = Launcher(self, config)
            if len(self._launchers) >= MAX_LAUNCHERS:
                self._launchers.clear()
            self._launchers[config] = launcher
        return launcher

    def __call__(self, *args, **kwargs):
        raise TypeError(f"kernel '{self.name}' needs a launch configuration: "
                        f"{self.name}[blocks, threads](...)")

    def __repr__(self):
        return f"<pykernel kernel {self.name}>"


@functools.lru_cache(maxsize=None)
def pdl_arch(arch: str) -> bool:
    """Whether kernels for `arch` get the PDL prologue (sm_90 and later)."""
    digits = arch[3:].rstrip("af") if arch.startswith("sm_") else ""
    return digits.isdigit() and int(digits) >= 90


def kernel(fn=None, *, debug: bool = False, bounds_check: bool = False, lineinfo: bool = True,
           fp_contract: bool = False, max_threads: int = 0, min_blocks: int = 0,
           pdl: bool = True):
    """Decorator: `@pk.kernel` or `@pk.kernel(debug=True, bounds_check=True, fp_contract=True,
    max_threads=256, min_blocks=2, pdl=False)` (options: docs/language.md, "Kernel options")."""
    if not (isinstance(max_threads, int) and 0 <= max_threads <= 1024):
        raise ValueError(f"max_threads must be an int in 1..1024 (0 = no bound), got "
                         f"{max_threads!r}")
    if not (isinstance(min_blocks, int) and min_blocks >= 0):
        raise ValueError(f"min_blocks must be a non-negative int, got {min_blocks!r}")
    if min_blocks and not max_threads:
        raise ValueError("min_blocks needs max_threads: the blocks-per-SM bound is computed "
                         "for a known block size")
    options = Options(debug=debug, bounds_check=bounds_check, lineinfo=lineinfo,
                      fp_contract=fp_contract, max_threads=max_threads, min_blocks=min_blocks,
                      pdl=bool(pdl))
    if fn is None:
        return lambda f: Kernel(f, options)
    return Kernel(fn, options)


def func(fn):
    """Decorator: a device function, callable from kernels (inlined)."""
    return DeviceFunction(fn)
