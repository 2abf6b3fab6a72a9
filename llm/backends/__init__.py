"""Backend registry: (device, backend name) -> a `Backend` instance.

"numpy" (the float32 CPU reference) is always available; "kernels" (pykernel's own kernels, on
the GPU or the CPU target) is provided by `llm.backends.kernels_backend` once it exists.
"""
from __future__ import annotations

import importlib

from llm.backends.base import Backend
from llm.options import RunnerOptions

DEVICES = ("cpu", "cuda")
DEFAULT_BACKEND = {"cpu": "numpy", "cuda": "kernels"}


class BackendUnavailable(NotImplementedError):
    """The requested device/backend pair is not available in this build or on this machine."""


def create_backend(device: str = "cpu", backend: str | None = None, **options) -> Backend:
    """A backend; `options` are its constructor's (e.g. options=RunnerOptions(...), the
    performance switches; RunnerOptions.from_env() when not given)."""
    options.setdefault("options", RunnerOptions.from_env())
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r} (expected one of {', '.join(DEVICES)})")
    name = backend or DEFAULT_BACKEND[device]
    if name == "numpy":
        if device != "cpu":
            raise BackendUnavailable("the numpy backend runs on the CPU only (device='cpu')")
        from llm.backends.numpy_backend import NumpyBackend
        return NumpyBackend(**options)
    if name == "kernels":
        try:
            module = importlib.import_module("llm.backends.kernels_backend")
        except ImportError as exc:
            if exc.name != "llm.backends.kernels_backend":
                raise
            raise BackendUnavailable(
                f"the 'kernels' backend (device={device!r}) is not available in this build yet; "
                "use device='cpu', backend='numpy'") from None
        try:
            return module.create(device=device, **options)
        except RuntimeError as exc:  # e.g. no usable GPU / driver on this machine
            raise BackendUnavailable(f"the 'kernels' backend cannot run on {device!r}: "
                                     f"{exc}") from exc
    raise ValueError(f"unknown backend {name!r} (expected 'numpy' or 'kernels')")
