"""Compile cache: in memory, then on disk (`~/.cache/pykernel`, or $PYKERNEL_CACHE_DIR) for
PTX and for the CPU target's native object code (keyed with the host CPU too). Keys hash the
kernel's source, every @pk.func it reaches, the global constants it reads, the specialization,
arch, options and the compiler's own source. Disk writes are atomic
(temp file + rename) so concurrent processes are safe; a corrupt entry is recompiled."""
from __future__ import annotations

import hashlib
import json
import marshal
import os
import types
from pathlib import Path

import numpy as np

from .types import ScalarType

_MEMORY: dict = {}
_FINGERPRINT = None


def compiler_fingerprint() -> str:
    """The compiler's identity: its version and the contents of its source files (their
    names relative to the package, ~0.5 MB read in ~1-2 ms), so a changed compiler never
    reuses old code while a fresh checkout of the same sources (new mtimes, as CI's clean
    clones have) still finds the cache it left."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        from . import __version__
        h = hashlib.sha256(__version__.encode())
        root = os.path.dirname(os.path.abspath(__file__))
        stack = [root]
        while stack:
            folder = stack.pop()
            with os.scandir(folder) as entries:
                for e in sorted(entries, key=lambda e: e.name):
                    if e.is_dir() and e.name not in ("runtime", "__pycache__"):
                        stack.append(e.path)
                    elif e.name.endswith(".py"):
                        h.update(os.path.relpath(e.path, root).encode())
                        with open(e.path, "rb") as source:
                            h.update(source.read())
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


def cache_dir() -> Path:
    """$PYKERNEL_CACHE_DIR, else $PYKERNEL_CACHE/ptx (the runner keeps models beside it in
    $PYKERNEL_CACHE/models), else ~/.cache/pykernel/ptx."""
    explicit = os.environ.get("PYKERNEL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    root = os.environ.get("PYKERNEL_CACHE", os.path.join(os.path.expanduser("~"), ".cache",
                                                         "pykernel"))
    return Path(root) / "ptx"


def _dependencies(fn, h, seen):
    """Hash a function's code object (bytecode, constants, names, line table, file), its
    annotations and defaults, and, through the names it uses, every @pk.func it reaches and the
    global constants it reads. Marshalling code objects is microseconds; re-reading and
    tokenizing source would cost tens of ms."""
    from .device_function import DeviceFunction
    code = fn.__code__
    h.update(marshal.dumps(code))
    # annotations (Ptr[f32, "ro"], Const[int], scalar types) and defaults live on the function,
    # not in its code object, and they change the generated code
    h.update(repr(sorted(getattr(fn, "__annotations__", {}).items())).encode())
    h.update(repr((fn.__defaults__, fn.__kwdefaults__)).encode())
    scope = fn.__globals__
    closure = {}
    if fn.__closure__:
        closure = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__)))
    names = sorted(set(_all_names(code)))
    for name in names:
        obj = closure.get(name, scope.get(name, _MISSING))
        candidates = [(name, obj)]
        if obj is not _MISSING and not isinstance(obj, _NO_ATTRIBUTES + (DeviceFunction,)):
            # a module, class or object: kernels read its attributes (`cfg.WIDTH`)
            candidates += [(f"{name}.{a}", _attribute(obj, a)) for a in names]
        for label, value in candidates:
            if isinstance(value, DeviceFunction) and id(value) not in seen:
                seen.add(id(value))
                _dependencies(value.fn, h, seen)
            elif isinstance(value, _VALUES):
                # numpy scalars and type aliases (ACC = f32) are compile-time values too
                h.update(f"{label}={type(value).__name__}:{value!r}".encode())
            elif hasattr(type(value), "cache_token"):      # pk.const_array tables
                h.update(f"{label}={value.cache_token()}".encode())


_MISSING = object()


def _attribute(obj, name: str):
    """obj.name, or _MISSING (a property that raises must not break hashing: the compiler
    reports what the kernel does with the object)."""
    try:
        return getattr(obj, name, _MISSING)
    except Exception:
        return _MISSING
_VALUES = (bool, int, float, str, np.generic, ScalarType)
# values, and functions (intrinsics, builtins): no attributes a kernel reads
_NO_ATTRIBUTES = _VALUES + (types.FunctionType, types.BuiltinFunctionType)


def _all_names(code):
    yield from code.co_names
    yield from code.co_freevars
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _all_names(const)


def code_hash(fn) -> str:
    """What a function compiles from: the compiler's own files and, through `_dependencies`,
    its code and everything it reaches. (Keys of derived artifacts, e.g. autotune choices.)"""
    h = hashlib.sha256()
    h.update(compiler_fingerprint().encode())
    _dependencies(fn, h, set())
    return h.hexdigest()


def kernel_key(kernel, arch, spec, options) -> str:
    h = hashlib.sha256()
    h.update(compiler_fingerprint().encode())
    _dependencies(kernel.fn, h, set())
    h.update(repr(sorted((k, getattr(v, "name", v)) for k, v in spec.items())).encode())
    h.update(f"{arch}|{options!r}".encode())
    if arch in ("cpu", "host"):
        from .targets.cpu import CPUTarget
        h.update(_host_identity(CPUTarget).encode())
    return h.hexdigest()[:32]


_HOST = None


def _host_identity(target_cls) -> str:
    global _HOST
    if _HOST is None:
        _HOST = target_cls.host_identity()
    return _HOST


def lookup(key: str, arch: str):
    hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    return _load_disk(key, arch)


def store(key: str, arch: str, compiled) -> None:
    _MEMORY[key] = compiled
    if compiled.target == "nvptx" or getattr(compiled.cpu, "object", b""):
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
        if compiled.target == "nvptx":
            body, suffix = compiled.ptx.encode(), "ptxcache"
        else:
            body, suffix = compiled.cpu.object, "cpucache"
            meta["cpu_coroutine"] = compiled.cpu.coroutine
        meta["sha256"] = hashlib.sha256(body).hexdigest()
        payload = json.dumps(meta).encode() + b"\n" + body
        import tempfile
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, d / f"{key}.{suffix}")
    except OSError:
        pass  # a read-only home directory only costs recompiles


def _load_disk(key, arch: str = "sm_90"):
    from .compiled import CompiledKernel, ParamABI
    from .compiled import Site
    import numpy as np
    cpu = arch in ("cpu", "host")
    path = cache_dir() / f"{key}.{'cpucache' if cpu else 'ptxcache'}"
    try:
        head, body = path.read_bytes().split(b"\n", 1)
        meta = json.loads(head)
        if not _valid_header(meta, cpu) or hashlib.sha256(body).hexdigest() != meta.pop("sha256"):
            return None   # corrupt or from elsewhere: a miss, recompiled and overwritten
        params = [ParamABI(**dict(p, dtype=p["dtype"] if p["dtype"] == "bfloat16"
                                  else np.dtype(p["dtype"]))) for p in meta.pop("params")]
        sites = [Site(**s) for s in meta.pop("sites")]
        uses = frozenset(meta.pop("uses"))
        if cpu:
            from .targets import get_target
            program = get_target("cpu").load_object(body, meta["entry"],
                                                    meta.pop("cpu_coroutine"),
                                                    meta["shared_bytes"])
            compiled = CompiledKernel(**meta, params=params, sites=sites, uses=uses,
                                      cpu=program)
        else:
            compiled = CompiledKernel(**meta, params=params, sites=sites, uses=uses,
                                      ptx=body.decode())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError):
        return None
    _MEMORY[key] = compiled
    return compiled


# the header's fields and their JSON types (CompiledKernel's fields plus the body's checksum)
_HEADER = {"name": str, "entry": str, "target": str, "arch": str, "shared_bytes": int,
           "cache_key": str, "min_arch": str, "source_hash": str, "hidden_extents": int,
           "sha256": str, "params": list, "sites": list, "uses": list}
_PARAM = {"name": str, "kind": str, "dtype": str, "size": int, "align": int, "readonly": bool,
          "type_name": str, "rank": int}
_SITE = {"kind": str, "file": str, "line": int, "col": int, "text": str}


def _valid_header(meta, cpu: bool) -> bool:
    """Whether a decoded header has exactly the fields `_store_disk` writes, of their types: a
    file truncated, hand-edited or written by another version (`null`, a list, a missing key)
    is a cache miss, never an exception in every later compile."""
    fields = dict(_HEADER, cpu_coroutine=bool) if cpu else _HEADER
    return _fields_ok(meta, fields) and \
        all(_fields_ok(p, _PARAM) for p in meta["params"]) and \
        all(_fields_ok(s, _SITE) for s in meta["sites"]) and \
        all(isinstance(u, str) for u in meta["uses"])


def _fields_ok(obj, fields: dict) -> bool:
    return isinstance(obj, dict) and obj.keys() == fields.keys() and \
        all(isinstance(obj[k], t) for k, t in fields.items())
