"""Kernel signatures: parameter kinds from annotations (scalars, Ptr, Const, dtype generics)
and the binding of launch/compile arguments to one specialization."""
from __future__ import annotations

import ast
import inspect
import typing
from dataclasses import dataclass

from .errors import KernelSourceError
from .types import (ArrayAnnotation, ArrayPtrType, ConstAnnotation, PtrAnnotation, PtrType,
                    ScalarType, TensorMapType, dtype as DTYPE, from_numpy, i64)


@dataclass(frozen=True)
class Param:
    name: str
    kind: str              # "scalar" | "ptr" | "array" | "tensormap" | "const" | "dtype"
    ann: object            # ScalarType | PtrAnnotation | ArrayAnnotation | ConstAnnotation
                           # | TypeVar


def _reject_parameter_tricks(fn) -> None:
    """Kernels take plain positional-or-keyword parameters: no *args, **kwargs, keyword-only,
    positional-only or default values (the launch ABI is the ordered parameter list)."""
    bad = {inspect.Parameter.VAR_POSITIONAL: "*args", inspect.Parameter.VAR_KEYWORD: "**kwargs",
           inspect.Parameter.KEYWORD_ONLY: "keyword-only parameters",
           inspect.Parameter.POSITIONAL_ONLY: "positional-only parameters"}
    for p in inspect.signature(fn).parameters.values():
        what = bad.get(p.kind) or ("default values" if p.default is not p.empty else None)
        if what:
            raise signature_error(fn, p.name, f"{what} are not supported in kernel signatures "
                                  f"(parameter '{p.name}')",
                                  hint="list every parameter positionally; use Const[...] "
                                       "for compile-time options")


def signature_error(fn, param: str | None, message: str, hint: str | None = None):
    """A KernelSourceError at parameter `param` of `fn` (at the `def` when None or not
    found); a TypeError when the source cannot be read (a function built by exec)."""
    from .frontend.parse import parse
    try:
        fast = parse(fn)
    except TypeError:
        return TypeError(f"{fn.__name__}: {message}")
    node = next((a for a in ast.walk(fast.tree.args) if isinstance(a, ast.arg)
                 and a.arg == param), fast.tree)
    return fast.error(node, message, hint)


def annotations(fn) -> dict:
    """The parameter annotations, evaluated; a failing one is named with its location."""
    try:
        return inspect.get_annotations(fn, eval_str=True)
    except Exception:   # noqa: BLE001 - find which one, for the message
        pass
    anns = {}
    for name, ann in inspect.get_annotations(fn).items():
        try:
            anns[name] = eval(ann, fn.__globals__) if isinstance(ann, str) else ann
        except Exception as exc:   # noqa: BLE001 - any failure is the user's annotation
            detail = exc.message if isinstance(exc, KernelSourceError) else exc
            hint = getattr(exc, "hint", None) or ("a type variable needs `T = typing.TypeVar"
                                                  "('T')` in the module; a dtype is f32, "
                                                  "Ptr[f32], ...")
            raise signature_error(fn, name, f"cannot evaluate the annotation {ann!r} of "
                                  f"parameter '{name}': {detail}", hint=hint) from None
    return anns


def read_signature(fn) -> list[Param]:
    _reject_parameter_tricks(fn)
    anns = annotations(fn)
    params = []
    for name in inspect.signature(fn).parameters:
        ann = anns.get(name)
        if isinstance(ann, ScalarType):
            params.append(Param(name, "scalar", ann))
        elif isinstance(ann, PtrAnnotation):
            params.append(Param(name, "ptr", ann))
        elif isinstance(ann, ArrayAnnotation):
            params.append(Param(name, "array", ann))
        elif isinstance(ann, TensorMapType):
            params.append(Param(name, "tensormap", ann))
        elif isinstance(ann, ConstAnnotation):
            params.append(Param(name, "dtype" if ann.kind is DTYPE else "const", ann))
        elif isinstance(ann, typing.TypeVar):
            params.append(Param(name, "scalar", ann))
        elif ann is None:
            raise signature_error(fn, name, f"parameter '{name}' needs a type annotation "
                                  "(e.g. f32, Ptr[f32], pk.Array[f32, 2], Const[int])")
        else:
            raise signature_error(fn, name, f"parameter '{name}' has unsupported annotation "
                                  f"{ann!r}")
    return params


def type_var_name(elem) -> str | None:
    if isinstance(elem, typing.TypeVar):
        return elem.__name__
    if isinstance(elem, str):
        return elem
    return None


def resolve_elem(elem, spec: dict) -> ScalarType:
    if isinstance(elem, ScalarType):
        return elem
    name = type_var_name(elem)
    if name is not None and isinstance(spec.get(name), ScalarType):
        return spec[name]
    raise TypeError(f"element type {elem!r} is not bound; pass it as a Const[pk.dtype] "
                    "argument or let it be inferred from an array argument")


def concrete_params(params: list[Param], spec: dict, fn=None) -> list[tuple[str, object]]:
    """The runtime parameters of one specialization, as the kernel ABI lists them:
    (name, PtrType | ScalarType); an array parameter `x` of rank r expands to
    (x, ArrayPtrType), (x_shape0, i64) .. (x_shape{r-1}, i64), (x_stride0, i64) .. in
    elements. An unbound type variable is a source error at its parameter of `fn`."""
    out = []
    for p in params:
        try:
            if p.kind == "ptr":
                out.append((p.name, PtrType(resolve_elem(p.ann.elem, spec), p.ann.readonly)))
            elif p.kind == "array":
                out += array_abi(p, resolve_elem(p.ann.elem, spec))
            elif p.kind == "scalar":
                out.append((p.name, resolve_elem(p.ann, spec)))
            elif p.kind == "tensormap":
                out.append((p.name, p.ann))
        except TypeError as exc:
            if fn is None:
                raise
            raise signature_error(fn, p.name, f"parameter '{p.name}': {exc}") from None
    names = [name for name, _ in out]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash is not None:
        message = (f"parameter name '{clash}' is also the name of an array parameter's "
                   "shape/stride argument")
        if fn is None:
            raise TypeError(message)
        raise signature_error(fn, clash, message, hint="rename the parameter")
    return out


def array_abi(param: Param, elem: ScalarType) -> list[tuple[str, object]]:
    """An array parameter's ABI: data pointer, `rank` extents, `rank` strides (elements)."""
    rank = param.ann.rank
    return ([(param.name, ArrayPtrType(elem, param.ann.readonly, rank=rank))]
            + [(f"{param.name}_shape{d}", i64) for d in range(rank)]
            + [(f"{param.name}_stride{d}", i64) for d in range(rank)])


def normalize_const(param: Param, value):
    if param.kind == "dtype":
        try:
            return from_numpy(value)
        except TypeError:
            raise TypeError(f"parameter '{param.name}' expects a dtype (f32, np.float16, ...), "
                            f"got {value!r}") from None
    kind = param.ann.kind
    if kind in (int, float, bool) and not isinstance(value, (int, float, bool)):
        raise TypeError(f"Const parameter '{param.name}' expects {kind.__name__}, got {value!r}")
    if kind is int and (isinstance(value, float) or isinstance(value, bool)):
        if isinstance(value, float) and value != int(value):
            raise TypeError(f"Const[int] parameter '{param.name}' got {value!r}")
        value = int(value)
    if kind is float:
        value = float(value)
    if kind is bool:
        value = bool(value)
    return value
