"""A parsed GGUF file -> human-readable text: metadata, tensor table, model summary.

Input: `GGUFFile`. Output: a string (for `pykernel info`). Long arrays and strings are shortened
unless `full`; the tensor table lists name, GGML type, shape (numpy order: rows, columns) and
bytes, with totals per type.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from llm.config import load_config
from llm.gguf_file import GGUFError, GGUFFile

SHORT_ARRAY = 8
SHORT_STRING = 200


def _format_value(value, full: bool) -> str:
    if isinstance(value, np.ndarray):
        if full or value.size <= SHORT_ARRAY:
            return f"[{', '.join(str(v) for v in value.tolist())}]"
        head = ", ".join(map(str, value[:4].tolist()))
        return f"[{value.dtype} array of {value.size}: {head}, ...]"
    if isinstance(value, list):
        if full or len(value) <= SHORT_ARRAY:
            return repr(value)
        head = ", ".join(repr(v) for v in value[:4])
        return f"[str array of {len(value)}: {head}, ...]"
    if isinstance(value, str):
        if not full and len(value) > SHORT_STRING:
            return repr(value[:SHORT_STRING]) + f"... ({len(value)} chars)"
        return repr(value)
    return str(value)


def _metadata_lines(g: GGUFFile, full: bool) -> list[str]:
    lines = [f"file: {g.path}", f"GGUF version {g.version}, {len(g.metadata)} keys, "
             f"{len(g.tensors)} tensors, alignment {g.alignment}", "", "metadata:"]
    width = max((len(k) for k in g.metadata), default=0)
    for key, value in g.metadata.items():
        lines.append(f"  {key:<{width}}  {_format_value(value, full)}")
    return lines


def _tensor_lines(g: GGUFFile) -> list[str]:
    rows = [(t.name, t.ggml_type.name, " x ".join(map(str, t.shape)), t.n_bytes)
            for t in g.tensors.values()]
    name_w = max((len(r[0]) for r in rows), default=4)
    shape_w = max((len(r[2]) for r in rows), default=5)
    lines = ["", "tensors (shape in numpy order: rows x columns):",
             f"  {'name':<{name_w}}  {'type':<6}  {'shape':<{shape_w}}  {'bytes':>12}"]
    per_type = defaultdict(lambda: [0, 0])
    for name, type_name, shape, n_bytes in rows:
        lines.append(f"  {name:<{name_w}}  {type_name:<6}  {shape:<{shape_w}}  {n_bytes:>12,}")
        per_type[type_name][0] += 1
        per_type[type_name][1] += n_bytes
    total = sum(r[3] for r in rows)
    n_params = sum(t.n_elements for t in g.tensors.values())
    summary = ", ".join(f"{k}: {c} ({b / 2**20:.1f} MiB)" for k, (c, b) in per_type.items())
    lines += ["", f"total: {len(rows)} tensors, {n_params:,} parameters, {total:,} bytes "
              f"({total / 2**20:.1f} MiB); {summary}"]
    return lines


def _config_lines(g: GGUFFile) -> list[str]:
    try:
        cfg = load_config(g)
    except GGUFError as exc:
        return ["", f"model: not runnable here ({exc.what}: {exc.expected})"]
    fields = ", ".join(f"{k}={v}" for k, v in vars(cfg).items() if k != "sliding_layers")
    return ["", f"model config: {fields}"]


def describe(g: GGUFFile, full: bool = False) -> str:
    return "\n".join(_metadata_lines(g, full) + _tensor_lines(g) + _config_lines(g)) + "\n"
