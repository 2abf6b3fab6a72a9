"""Compile cache: in memory, then on disk (`~/.cache/pykernel`, or $PYKERNEL_CACHE_DIR) for
PTX. Keys hash the kernel's source, every @pk.func it reaches, the global constants it reads,
the specialization, arch, options and the compiler's own source. Disk writes are atomic
(temp file + rename) so concurrent processes are safe; a corrupt entry is recompiled."""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import tempfile
import types
from pathlib import Path

_MEMORY: dict = {}
_FINGERPRINT = None


def compiler_fingerprint() -> str:
    """Hash of the compiler's own source files: a changed compiler never reuses old PTX."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        h = hashlib.sha256()
        root = Path(__file__).parent
        for path in sorted(root.rglob("*.py")):
            if "runtime" in path.parts:
                continue
            h.update(path.name.encode())
            h.update(path.read_bytes())
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


def cache_dir() -> Path:
    return Path(os.environ.get("PYKERNEL_CACHE_DIR",
                               os.path.join(os.path.expanduser("~"), ".cache", "pykernel")))


def _dependencies(fn, h, seen):
    from .kernel import DeviceFunction
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = repr(fn)
    h.update(src.encode())
    try:
        tree = ast.parse(__import__("textwrap").dedent(src))
    except SyntaxError:
        return
    scope = dict(fn.__globals__)
    if fn.__closure__:
        scope.update(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
    for node in ast.walk(tree):
        obj = None
        if isinstance(node, ast.Name) and node.id in scope:
            obj = scope[node.id]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                isinstance(scope.get(node.value.id), types.ModuleType):
            obj = getattr(scope[node.value.id], node.attr, None)
        if isinstance(obj, DeviceFunction) and id(obj) not in seen:
            seen.add(id(obj))
            _dependencies(obj.fn, h, seen)
        elif isinstance(obj, (bool, int, float, str)):
            h.update(f"{getattr(node, 'id', getattr(node, 'attr', ''))}={obj!r}".encode())


def kernel_key(kernel, arch, spec, options) -> str:
    h = hashlib.sha256()
    h.update(compiler_fingerprint().encode())
    _dependencies(kernel.fn, h, set())
    h.update(repr(sorted((k, getattr(v, "name", v)) for k, v in spec.items())).encode())
    h.update(f"{arch}|{options!r}".encode())
    return h.hexdigest()[:32]


def lookup(key: str, arch: str):
    hit = _MEMORY.get(key)
    if hit is not None or arch in ("cpu", "host"):
        return hit
    return _load_disk(key)


def store(key: str, arch: str, compiled) -> None:
    _MEMORY[key] = compiled
    if compiled.target == "nvptx":
        _store_disk(key, compiled)


def _store_disk(key, compiled):
    try:
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        meta = {k: v for k, v in vars(compiled).items()
                if k not in ("cpu", "ptx", "llvm_ir", "params", "sites", "uses")}
        meta["params"] = [dict(vars(p), dtype=str(p.dtype)) for p in compiled.params]
        meta["sites"] = [vars(s) for s in compiled.sites]
        meta["uses"] = sorted(compiled.uses)
        meta["ptx_sha256"] = hashlib.sha256(compiled.ptx.encode()).hexdigest()
        payload = json.dumps(meta) + "\n" + compiled.ptx
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(payload)
        os.replace(tmp, d / f"{key}.ptxcache")
    except OSError:
        pass  # a read-only home directory only costs recompiles


def _load_disk(key):
    from .compiler import CompiledKernel, ParamABI
    from .lower.context import Site
    import numpy as np
    path = cache_dir() / f"{key}.ptxcache"
    try:
        text = path.read_text()
        head, ptx = text.split("\n", 1)
        meta = json.loads(head)
        if hashlib.sha256(ptx.encode()).hexdigest() != meta.pop("ptx_sha256"):
            return None   # corrupt: recompile
        params = [ParamABI(**dict(p, dtype=p["dtype"] if p["dtype"] == "bfloat16"
                                  else np.dtype(p["dtype"]))) for p in meta.pop("params")]
        sites = [Site(**s) for s in meta.pop("sites")]
        uses = frozenset(meta.pop("uses"))
        compiled = CompiledKernel(**meta, params=params, sites=sites, uses=uses, ptx=ptx)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _MEMORY[key] = compiled
    return compiled
