"""The persistent decode step's weight buffer: every tensor of decode_schedule's layout in one
byte buffer, matrices in their GGUF formats (row groups back to back), norm vectors F32.

    flat = pack_decode_weights(sched, tensors)        # numpy uint8, from host tensors
    dev = upload_decode_weights(sched, sources)       # device uint8, from device row groups

tensors / sources: name -> an f32 array (a tensor of one F32 group: norms, F32 matrices) or a
sequence of uint8 arrays, one per row group, each holding the group's rows in the GGUF type
the schedule gave it (the runner's DeviceMatrix groups: RowGroup.raw). The buffer is
weight_bytes long (a multiple of 16), bytes between groups zero.
"""
from __future__ import annotations

import numpy as np

import pykernel as pk

from .decode_schedule import DecodeSchedule


def _pieces(sched: DecodeSchedule, name: str, value) -> list:
    """[(byte offset, expected bytes, the group's data)] of one tensor."""
    place = sched.weights[name]
    if isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [value]
        if place.groups[0][0] != "F32" or len(place.groups) != 1:
            raise ValueError(f"decode weights: {name} is {[g[0] for g in place.groups]} row "
                             f"groups; give one uint8 array per group")
    if len(parts) != len(place.groups):
        raise ValueError(f"decode weights: {name} has {len(place.groups)} row groups, got "
                         f"{len(parts)} arrays")
    out = []
    for (type_name, rows, off, row_bytes), part in zip(place.groups, parts):
        if type_name == "F32" and part.dtype == np.float32:
            if tuple(part.shape) not in (place.shape, (rows, place.shape[-1])):
                raise ValueError(f"decode weights: {name} must be {place.shape}, got "
                                 f"{tuple(part.shape)}")
        elif part.dtype != np.uint8:
            raise ValueError(f"decode weights: {name}'s {type_name} rows must be uint8 bytes "
                             f"(or float32 for F32), got {part.dtype}")
        if part.nbytes != rows * row_bytes:
            raise ValueError(f"decode weights: {name}'s {type_name} group holds {rows} rows of "
                             f"{row_bytes} bytes, got {part.nbytes} bytes")
        out.append((off, part))
    return out


def _check_names(sched: DecodeSchedule, given) -> None:
    missing = sorted(set(sched.weights) - set(given))
    if missing:
        raise ValueError(f"decode weights: missing tensors {missing}")


def pack_decode_weights(sched: DecodeSchedule, tensors: dict) -> np.ndarray:
    """The weight buffer (uint8, sched.weight_bytes) from host tensors (module docstring)."""
    _check_names(sched, tensors)
    flat = np.zeros(sched.weight_bytes, np.uint8)
    for name in sched.weights:
        value = tensors[name]
        value = [np.asarray(v) for v in value] if isinstance(value, (list, tuple)) else \
            np.asarray(value, np.float32)
        for off, part in _pieces(sched, name, value):
            raw = np.ascontiguousarray(part).reshape(-1).view(np.uint8)
            flat[off:off + raw.size] = raw
    return flat


def upload_decode_weights(sched: DecodeSchedule, sources: dict, device=None):
    """The weight buffer on the device, each group copied device to device from its source
    (a device Array) or uploaded (a numpy array): no host copy of the whole model."""
    _check_names(sched, sources)
    flat = pk.zeros(sched.weight_bytes, np.uint8, device)
    for name in sched.weights:
        for off, part in _pieces(sched, name, sources[name]):
            dst = flat[off:off + part.nbytes]
            if isinstance(part, np.ndarray):
                dst.copy_from(np.ascontiguousarray(part).reshape(-1).view(np.uint8))
            else:
                dst.copy_from(part.reshape(-1).view(np.uint8))
    return flat
