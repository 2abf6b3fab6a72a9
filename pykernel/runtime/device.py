"""Device selection: a registry of device kinds ("cuda", "cpu") and the process-wide current
device.

Input: a device spec ("cuda", "cuda:1", "cpu", or a Device object), the PYKERNEL_DEVICE
environment variable (read once, when no device was set explicitly).
Output: Device objects, one per (kind, ordinal), created lazily by the kind's factory.

Kinds register themselves: pykernel.runtime.cuda registers "cuda", the CPU target's
pykernel.runtime.cpu registers "cpu"; asking for a kind imports its module on first use.
"""
from __future__ import annotations

import importlib
import os
import threading

_MODULE_OF_KIND = {"cuda": "pykernel.runtime.cuda", "cpu": "pykernel.runtime.cpu"}
_factories: dict[str, object] = {}
_instances: dict[tuple[str, int], object] = {}
_current = None
_lock = threading.RLock()
_gpu_usable: bool | None = None


def register_device_kind(kind: str, factory) -> None:
    """`factory(ordinal: int) -> Device`; called once per (kind, ordinal)."""
    _factories[kind] = factory


def gpu_available() -> bool:
    """True when the CUDA driver loads and reports at least one device. Never raises."""
    global _gpu_usable
    if _gpu_usable is None:
        _gpu_usable = _probe_gpu()
    return _gpu_usable


def _probe_gpu() -> bool:
    try:
        from cuda.bindings import driver
        (err,) = driver.cuInit(0)
        if err:
            return False
        err, count = driver.cuDeviceGetCount()
        return not err and count > 0
    except Exception:  # no driver library, no cuda-python, broken install: all mean "no GPU"
        return False


def _parse_spec(spec: str) -> tuple[str, int]:
    kind, _, ordinal = spec.strip().lower().partition(":")
    if kind not in _MODULE_OF_KIND and kind not in _factories:
        known = sorted(set(_MODULE_OF_KIND) | set(_factories))
        raise ValueError(f"unknown device {spec!r}; expected one of {known} "
                         f"(optionally with ':N', e.g. 'cuda:1')")
    if ordinal and not ordinal.isdigit():
        raise ValueError(f"device {spec!r}: the ordinal after ':' must be a number")
    return kind, int(ordinal or 0)


def _factory(kind: str):
    if kind not in _factories:
        module = _MODULE_OF_KIND.get(kind)
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise RuntimeError(f"device kind {kind!r} is unavailable: cannot import "
                               f"{module} ({exc})") from None
    if kind not in _factories:
        raise RuntimeError(f"{_MODULE_OF_KIND[kind]} did not register device kind {kind!r}")
    return _factories[kind]


def get_device(spec=None):
    """The Device for `spec` (a string like "cuda:0" or a Device); None -> current device."""
    if spec is None:
        return current_device()
    if not isinstance(spec, str):
        return spec
    kind, ordinal = _parse_spec(spec)
    with _lock:
        key = (kind, ordinal)
        if key not in _instances:
            if kind == "cuda" and not gpu_available():
                raise RuntimeError(f"device {spec!r} requested but no usable CUDA GPU was found "
                                   "(driver missing or no device); use 'cpu'")
            _instances[key] = _factory(kind)(ordinal)
        return _instances[key]


def set_device(spec):
    """Make `spec` the current device for every later array and launch; returns it."""
    global _current
    device = get_device(spec)
    with _lock:
        _current = device
    return device


def default_device_spec() -> str:
    """PYKERNEL_DEVICE if set, else "cuda" when a GPU is usable, else "cpu"."""
    return os.environ.get("PYKERNEL_DEVICE") or ("cuda" if gpu_available() else "cpu")


def current_device():
    global _current
    device = _current
    if device is None:
        with _lock:
            if _current is None:
                _current = get_device(default_device_spec())
            device = _current
    return device


def synchronize(device=None) -> None:
    """Wait for all work on `device` (default: current); raises if a kernel failed."""
    get_device(device).synchronize()
