"""Kernel signatures: parameter kinds from annotations (scalars, Ptr, Const, dtype generics)
and the binding of launch/compile arguments to one specialization."""
from __future__ import annotations

import ast
import inspect
import typing
from dataclasses import dataclass

from .types import ConstAnnotation, PtrAnnotation, PtrType, ScalarType, dtype as DTYPE, from_numpy


@dataclass(frozen=True)
class Param:
    name: str
    kind: str              # "scalar" | "ptr" | "const" | "dtype"
    ann: object            # ScalarType | PtrAnnotation | ConstAnnotation | TypeVar


def _reject_parameter_tricks(fn) -> None:
    """Kernels take plain positional-or-keyword parameters: no *args, **kwargs, keyword-only,
    positional-only or default values (the launch ABI is the ordered parameter list)."""
    bad = {inspect.Parameter.VAR_POSITIONAL: "*args", inspect.Parameter.VAR_KEYWORD: "**kwargs",
           inspect.Parameter.KEYWORD_ONLY: "keyword-only parameters",
           inspect.Parameter.POSITIONAL_ONLY: "positional-only parameters"}
    for p in inspect.signature(fn).parameters.values():
        what = bad.get(p.kind) or ("default values" if p.default is not p.empty else None)
        if what:
            from .frontend.parse import parse
            fast = parse(fn)
            node = next((a for a in ast.walk(fast.tree.args) if isinstance(a, ast.arg)
                         and a.arg == p.name), fast.tree)
            raise fast.error(node, f"{what} are not supported in kernel signatures "
                             f"(parameter '{p.name}')",
                             hint="list every parameter positionally; use Const[...] for "
                                  "compile-time options")


def read_signature(fn) -> list[Param]:
    _reject_parameter_tricks(fn)
    try:
        anns = inspect.get_annotations(fn, eval_str=True)
    except Exception as exc:  # a bad annotation is a source error the user must see
        raise TypeError(f"{fn.__name__}: cannot evaluate parameter annotations: {exc}") from None
    params = []
    for name in inspect.signature(fn).parameters:
        ann = anns.get(name)
        if isinstance(ann, ScalarType):
            params.append(Param(name, "scalar", ann))
        elif isinstance(ann, PtrAnnotation):
            params.append(Param(name, "ptr", ann))
        elif isinstance(ann, ConstAnnotation):
            params.append(Param(name, "dtype" if ann.kind is DTYPE else "const", ann))
        elif isinstance(ann, typing.TypeVar):
            params.append(Param(name, "scalar", ann))
        elif ann is None:
            raise TypeError(f"{fn.__name__}: parameter '{name}' needs a type annotation "
                            "(e.g. f32, Ptr[f32], Const[int])")
        else:
            raise TypeError(f"{fn.__name__}: parameter '{name}' has unsupported annotation "
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


def concrete_params(params: list[Param], spec: dict) -> list[tuple[str, object]]:
    """The runtime parameters of one specialization: (name, PtrType | ScalarType)."""
    out = []
    for p in params:
        if p.kind == "ptr":
            out.append((p.name, PtrType(resolve_elem(p.ann.elem, spec), p.ann.readonly)))
        elif p.kind == "scalar":
            out.append((p.name, resolve_elem(p.ann, spec)))
    return out


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
