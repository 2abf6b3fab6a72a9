"""Ahead-of-time builds: load a Python file's kernels, compile every requested specialization
for every arch, and write `<entry>.<arch>.ptx`, `manifest.json` (the ABI) and `kernels.h` (C
launch helpers over the CUDA driver API) so any host language can load the PTX."""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

from .kernel import Kernel
from .types import SCALARS

C_TYPES = {"bool_": "uint8_t", "i8": "int8_t", "i16": "int16_t", "i32": "int32_t",
           "i64": "int64_t", "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t",
           "u64": "uint64_t", "f16": "uint16_t /* f16 bits */", "bf16": "uint16_t /* bf16 bits */",
           "f32": "float", "f64": "double"}


def load_kernels(path: str) -> dict[str, Kernel]:
    """Import FILE.py and return its @pk.kernel objects by name."""
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    name = "pykernel_user_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    return {n: k for n, k in vars(module).items() if isinstance(k, Kernel)}


def parse_consts(items: list[str]) -> dict[str, list]:
    """`--const BLOCK=128 --const BLOCK=256 --const T=f16` -> {BLOCK: [128, 256], T: ['f16']}"""
    out: dict[str, list] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--const expects NAME=VALUE, got {item!r}")
        out.setdefault(name.strip(), []).append(_const_value(value.strip()))
    return out


def _const_value(text: str):
    if text in SCALARS:
        return SCALARS[text]
    if text in ("True", "true", "False", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    try:
        return np.dtype(text)
    except TypeError:
        raise ValueError(f"--const value {text!r} is not a number, bool or type") from None


def specializations(kernel: Kernel, consts: dict[str, list]) -> list[dict]:
    names = [p.name for p in kernel.const_params]
    missing = [n for n in names if n not in consts]
    if missing:
        raise ValueError(f"kernel '{kernel.name}' needs --const for: {', '.join(missing)}")
    return [dict(zip(names, combo)) for combo in itertools.product(*(consts[n] for n in names))]


def build(path: str, archs: list[str], out_dir: str, const_items: list[str]) -> dict:
    kernels = load_kernels(path)
    consts = parse_consts(const_items)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries, skipped = [], []
    for name, kernel in sorted(kernels.items()):
        try:
            specs = specializations(kernel, consts)
        except ValueError as exc:
            skipped.append(str(exc))
            continue
        for spec in specs:
            for arch in archs:
                c = kernel.compile(arch, **spec)
                filename = f"{c.entry}.{arch}.ptx"
                (out / filename).write_text(c.ptx)
                entries.append(manifest_entry(c, filename, spec))
    manifest = {"pykernel_version": _version(), "source": os.path.abspath(path),
                "kernels": entries, "skipped": skipped}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    (out / "kernels.h").write_text(c_header(entries))
    return manifest


def manifest_entry(c, filename, spec) -> dict:
    return {"name": c.name, "entry": c.entry, "arch": c.arch, "ptx": filename,
            "consts": {k: getattr(v, "name", v) if not isinstance(v, np.dtype) else str(v)
                       for k, v in spec.items()},
            "params": [_manifest_param(p) for p in c.params],
            "shared_bytes": c.shared_bytes, "source_hash": c.source_hash,
            "min_arch": c.min_arch,
            # true: the PTX waits for its predecessor in its prologue, so a host may launch it
            # with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (docs/language.md)
            "pdl": "pdl" in c.uses}


def _manifest_param(p) -> dict:
    """One ABI parameter. An array parameter (kind "array", `rank` r) is its data pointer; the
    r extents and r strides (i64, in elements) follow it as scalar parameters NAME_shapeD and
    NAME_strideD."""
    entry = {"name": p.name, "type": p.type_name, "kind": p.kind, "size": p.size,
             "align": p.align, "readonly": p.readonly}
    if p.kind == "array":
        entry["rank"] = p.rank
    return entry


def _c_param(p: dict) -> str:
    if p["kind"] in ("ptr", "array"):      # "Ptr[f32, "ro"]", "Array[f32, 2]"
        elem = p["type"].split("[", 1)[1].split(",")[0].rstrip("]").strip()
        const = "const " if p["readonly"] else ""
        return f"{const}{C_TYPES[elem].split(' ')[0]}* {p['name']}"
    return f"{C_TYPES[p['type']].split(' ')[0]} {p['name']}"


def c_header(entries: list[dict]) -> str:
    lines = ["/* Generated by `pykernel build`: launch helpers for the PTX in this folder.",
             " * Load a .ptx with cuModuleLoadData, get the entry with cuModuleGetFunction(",
             " * &f, module, <name>_ENTRY), then call <name>_launch. */",
             "#pragma once", "#include <stdint.h>", "#include <cuda.h>", ""]
    seen = set()
    for e in entries:
        if e["entry"] in seen:
            continue
        seen.add(e["entry"])
        params = [_c_param(p) for p in e["params"]]
        sig = ", ".join(["CUfunction f", "unsigned gx", "unsigned gy", "unsigned gz",
                         "unsigned bx", "unsigned by", "unsigned bz",
                         "unsigned dynamic_shared_bytes", "CUstream stream"] + params)
        refs = ", ".join(f"(void*)&{p['name']}" for p in e["params"]) or "NULL"
        lines += [f'#define {e["entry"]}_ENTRY "{e["entry"]}"',
                  f'/* static shared memory: {e["shared_bytes"]} bytes */',
                  f"static inline CUresult {e['entry']}_launch({sig}) {{",
                  f"    void* args[] = {{{refs}}};",
                  "    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, dynamic_shared_bytes, "
                  "stream, args, NULL);", "}", ""]
    return "\n".join(lines)


def _version() -> str:
    from . import __version__
    return __version__
