"""Targets: everything target-specific (address spaces, special registers, barriers, warp
operations, emission). `get_target("sm_90")` or `get_target("cpu")`."""
from __future__ import annotations

from .archs import SUPPORTED_ARCHS

__all__ = ["SUPPORTED_ARCHS", "get_target"]


def get_target(arch: str):
    if arch in ("cpu", "host"):
        return _cpu_target()
    from .nvptx import NVPTXTarget
    return NVPTXTarget(arch)


_CPU = []


def _cpu_target():
    """One CPU target per process: it only holds the host's LLVM target machine, which every
    compile and every cached object load would otherwise create again."""
    if not _CPU:
        from .cpu import CPUTarget
        _CPU.append(CPUTarget())
    return _CPU[0]
