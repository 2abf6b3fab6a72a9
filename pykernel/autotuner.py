"""`@pk.autotune`: launch a kernel with whichever of several configurations runs fastest.

Input: a `@pk.kernel`, candidate configurations (dicts of its Const parameters and of values
only the launch uses, such as a block size), the argument names whose values select a tuning
(`key`), and `launch(args, config) -> (grid, block[, shared_bytes[, cluster]])`. Output: a
callable taking the kernel's other arguments; its first call for a new key (the key
arguments' values, every array argument's dtype and shape when named in key, the device)
times each configuration on the device and launches the fastest; later calls launch that one.

Timing: one untimed launch per configuration (it compiles and loads the kernel), then batches
of launches bracketed by events (cuda) or the host clock (cpu, where launches are synchronous),
sized to about TARGET_MS each; a configuration's time is its best batch's mean. A
configuration that fails to compile or launch is skipped and its error kept; the tuning fails
only when all do. Arrays named in `restore` are copied before tuning and copied back before
the real launch, so a kernel that updates its output in place (`y += ...`) still runs on it
once. Inside a graph capture nothing can be timed: a key already tuned launches its choice, a
new one raises. Under `pk.precompile` recording every configuration's specialization is
recorded, so the workers compile all candidates in parallel. With `persist=True` each choice
is also written to the compile cache's folder (`autotune/`, one JSON file per kernel code,
compiler, configs, key and device name) and read back by later processes instead of timing.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Callable, Iterable, Sequence

from . import compile_pool
from .errors import KernelSourceError, LaunchError
from .kernel import Kernel
from .runtime.device import current_device
from .runtime.graphs import is_capturing

TARGET_MS = 10.0      # launches per timed batch: about this long, at least one
MIN_BATCHES = 3       # best of this many batches per configuration
MAX_LAUNCHES = 1000   # per batch (a kernel of a few microseconds)


class AutotuneError(RuntimeError):
    """No configuration could run, or a new key must be tuned where nothing can be timed."""


def autotune(configs: Sequence[dict], key: Iterable[str] = (), launch: Callable = None,
             restore: Iterable[str] = (), verbose: bool = False, persist: bool = False):
    """Decorator over a `@pk.kernel`: see the module docstring and docs/runtime.md."""
    def wrap(kernel):
        if not isinstance(kernel, Kernel):
            raise TypeError("@pk.autotune(...) goes above @pk.kernel (it tunes a kernel's "
                            f"launches), got {kernel!r}")
        return Autotuned(kernel, configs, key, launch, restore, verbose, persist)
    return wrap


class Autotuned:
    def __init__(self, kernel: Kernel, configs, key, launch, restore, verbose: bool,
                 persist: bool = False):
        self.kernel, self.verbose, self.persist = kernel, verbose, persist
        names = [p.name for p in kernel.params]
        self.configs = [dict(c) for c in configs]
        if not self.configs or not all(isinstance(c, dict) and c for c in configs):
            raise ValueError(f"autotune({kernel.name}): configs must be a non-empty list of "
                             "non-empty dicts")
        runtime = {p.name for p in kernel.runtime_params}
        consts = {p.name for p in kernel.const_params}
        for c in self.configs:
            clash = sorted(set(c) & runtime)
            if clash:
                raise ValueError(f"autotune({kernel.name}): config {c} sets runtime "
                                 f"parameter(s) {', '.join(clash)}; configs hold Const "
                                 "parameters and launch-only values")
        self.tuned = set().union(*self.configs)
        # Const parameters that some config sets must be set by all (else a launch lacks one)
        partial = sorted(n for n in self.tuned & consts if not all(n in c for c in self.configs))
        if partial:
            raise ValueError(f"autotune({kernel.name}): Const parameter(s) {', '.join(partial)} "
                             "set by some configs but not all")
        self.params = [n for n in names if n not in self.tuned]   # what a call passes
        self._names = names                                       # the kernel's, in order
        self._arrays = [p.name for p in kernel.runtime_params if p.kind in ("ptr", "array")]
        self.key = tuple(key)
        unknown = [k for k in self.key if k not in self.params]
        if unknown:
            raise ValueError(f"autotune({kernel.name}): key name(s) {', '.join(unknown)} are "
                             f"not parameters passed at the call ({', '.join(self.params)})")
        if not callable(launch):
            raise TypeError(f"autotune({kernel.name}): launch must be a callable "
                            "(args, config) -> (grid, block[, shared_bytes[, cluster]])")
        self.launch, self.restore = launch, tuple(restore)
        missing = [r for r in self.restore if r not in self._arrays]
        if missing:
            raise ValueError(f"autotune({kernel.name}): restore names {', '.join(missing)}, "
                             "not array parameters")
        self.cache: dict = {}      # key -> the chosen config
        self.timings: dict = {}    # key -> [(config, ms or None, error or None)]
        self.__name__ = kernel.name
        self.__doc__ = kernel.__doc__

    # --- calls ---------------------------------------------------------------------------------
    def __call__(self, *args, stream=None, **kwargs):
        bound = self._bind(args, kwargs)
        device = current_device()
        key = self._key(bound, device)
        config = self.cache.get(key) or self._load(key, device)
        if config is None:
            if compile_pool.RECORDING is not None:   # pk.precompile: compile every candidate
                for c in self.configs:
                    self._launch(bound, c, stream)
                return
            if is_capturing(device):
                raise AutotuneError(
                    f"autotune({self.kernel.name}): key {self._shown(key)} is not tuned yet "
                    "and nothing runs during a graph capture; call the kernel once with these "
                    "arguments before capturing")
            config = self._tune(bound, key, device, stream)
        self._launch(bound, config, stream)

    def best_config(self, *args, **kwargs) -> dict:
        """The configuration these arguments launch with (tuning now if their key is new; the
        arrays in `restore` are put back afterwards)."""
        bound = self._bind(args, kwargs)
        device = current_device()
        key = self._key(bound, device)
        if key not in self.cache and self._load(key, device) is None:
            self._tune(bound, key, device, None)
        return dict(self.cache[key])

    # --- internals -----------------------------------------------------------------------------
    def _bind(self, args, kwargs) -> dict:
        if not kwargs and len(args) == len(self.params):     # the common call, cheaply
            return dict(zip(self.params, args))
        name = self.kernel.name
        if len(args) > len(self.params):
            raise LaunchError(f"{name}(): takes {len(self.params)} arguments when autotuned "
                              f"({', '.join(self.params)}), got {len(args)}")
        bound = dict(zip(self.params, args))
        for k, v in kwargs.items():
            if k in self.tuned:
                raise LaunchError(f"{name}(): '{k}' is chosen by autotune; do not pass it")
            if k not in self.params:
                raise LaunchError(f"{name}(): unknown parameter '{k}'")
            if k in bound:
                raise LaunchError(f"{name}(): parameter '{k}' given twice")
            bound[k] = v
        missing = [n for n in self.params if n not in bound]
        if missing:
            raise LaunchError(f"{name}(): missing argument(s) {', '.join(missing)}")
        return bound

    def _key(self, bound: dict, device) -> tuple:
        def part(value):
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                return (tuple(value.shape), str(value.dtype))
            return value
        values = tuple(part(bound[k]) for k in self.key)
        dtypes = tuple(getattr(bound[n], "dtype", None) for n in self._arrays)
        return (values, dtypes, device.kind, device.arch, getattr(device, "ordinal", 0))

    def _shown(self, key) -> str:
        return ", ".join(f"{k}={v}" for k, v in zip(self.key, key[0])) or "(no key)"

    def _launch(self, bound: dict, config: dict, stream) -> None:
        """One launch of `config`."""
        self._launcher(bound, config, stream)(*self._positional(bound, config))

    def _positional(self, bound: dict, config: dict) -> list:
        """The call's arguments and the config's Const values in the kernel's order."""
        return [bound[n] if n in bound else config[n] for n in self._names]

    def _launcher(self, bound: dict, config: dict, stream):
        shape = self.launch({**bound, **config}, dict(config))
        if not isinstance(shape, tuple) or not 2 <= len(shape) <= 4:
            raise LaunchError(f"autotune({self.kernel.name}): launch() must return (grid, "
                              f"block[, shared_bytes[, cluster]]), got {shape!r}")
        return self.kernel[(shape[0], shape[1], stream) + tuple(shape[2:])]

    def _tune(self, bound: dict, key, device, stream) -> dict:
        from .runtime.arrays import empty
        saved = {}
        for name in self.restore:
            arr = bound[name]
            saved[name] = empty(arr.shape, arr.dtype, device).copy_from(arr)
        results = []
        for config in self.configs:
            try:
                ms = self._time(bound, config, device, stream)
                results.append((config, ms, None))
            except (KernelSourceError, LaunchError, MemoryError) as exc:
                results.append((config, None, f"{type(exc).__name__}: {exc}"))
        for name, copy in saved.items():
            bound[name].copy_from(copy)
        self.timings[key] = results
        if self.verbose:
            for config, ms, error in results:
                shown = f"{ms:.4f} ms" if ms is not None else error
                print(f"autotune {self.kernel.name} [{self._shown(key)}] {config}: {shown}")
        ran = [(ms, i) for i, (_, ms, _) in enumerate(results) if ms is not None]
        if not ran:
            lines = "\n".join(f"  {c}: {e}" for c, _, e in results)
            raise AutotuneError(f"autotune({self.kernel.name}): no configuration ran for key "
                                f"{self._shown(key)}:\n{lines}")
        best = self.configs[min(ran)[1]]
        self.cache[key] = best
        if self.persist:
            self._save(key, device, best, results)
        return best

    # --- persist=True: choices on disk -----------------------------------------------------------
    def _path(self, key, device):
        from .cache import cache_dir, code_hash
        h = hashlib.sha256(code_hash(self.kernel.fn).encode())
        h.update(repr((self.configs, key, getattr(device, "name", ""))).encode())
        return cache_dir() / "autotune" / f"{self.kernel.name}-{h.hexdigest()[:24]}.json"

    def _load(self, key, device):
        """The persisted choice for key (cached in memory), or None."""
        if not self.persist:
            return None
        try:
            with open(self._path(key, device)) as f:
                config = json.load(f)["config"]
        except (OSError, ValueError, KeyError, TypeError):
            return None                 # absent or unreadable: tune again
        if config not in self.configs:
            return None
        self.cache[key] = config
        return config

    def _save(self, key, device, best: dict, results) -> None:
        path = self._path(key, device)
        record = {"kernel": self.kernel.name, "key": repr(key), "config": best,
                  "timings": [[c, ms, error] for c, ms, error in results]}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record, indent=1, default=str))
            os.replace(tmp, path)       # atomic: a reader sees the old file or the new one
        except OSError:
            pass                        # a read-only cache only loses the reuse

    def _time(self, bound: dict, config: dict, device, stream) -> float:
        from .runtime.streams import Event
        launcher = self._launcher(bound, config, stream)
        args = self._positional(bound, config)
        launcher(*args)                         # compiles, loads; not timed
        start, end = Event(device), Event(device)

        def batch(n: int) -> float:
            start.record(stream)
            for _ in range(n):
                launcher(*args)
            end.record(stream)
            return Event.elapsed(start, end) / n

        estimate = batch(1)
        n = max(1, min(MAX_LAUNCHES, int(TARGET_MS / max(estimate, 1e-6))))
        return min(batch(n) for _ in range(MIN_BATCHES))
