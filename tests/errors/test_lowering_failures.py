"""Issue 45, item 7: whatever goes wrong while lowering a kernel reaches the user as a
KernelSourceError at the construct (file:line:col, caret), raised `from None`: Python's own
refusals during constant folding, constants of the wrong kind in a store, bad annotations and
bad compile-time arguments, never a bare ValueError/TypeError from pykernel's frames."""
import os
import traceback
import typing

import pytest

import pykernel as pk
from tests.errors.markers import line_of as marker_line
from pykernel import Const, Ptr, f32, i32

THIS_FILE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marker_line(THIS_FILE, marker)


def check_located(err: pk.KernelSourceError, marker: str, underlined: str):
    """At the marked line, the caret under `underlined`, no compiler frames in the text."""
    text = str(err)
    assert (err.file, err.line) == (THIS_FILE, line_of(marker)), text
    assert text.splitlines()[0].startswith(f"{THIS_FILE}:{err.line}:{err.col + 1}: error: ")
    assert err.source_line[err.col:].startswith(underlined), text
    assert err.__cause__ is None and err.__suppress_context__
    rendered = "".join(traceback.format_exception_only(type(err), err))
    assert "pykernel/lower" not in rendered and "Traceback" not in rendered


@pk.kernel
def negative_shift(x: Ptr[i32]):
    x[0] = 1 << -1  # MARK-shift


@pk.kernel
def string_store(x: Ptr[f32]):
    x[0] = 'a'  # MARK-str


@pk.kernel
def string_arith(x: Ptr[f32]):
    x[0] = x[1] + "a" * 3  # MARK-strarith


@pk.kernel
def huge_power(x: Ptr[i32]):
    x[0] = 10 ** 1000000000  # MARK-pow


@pk.kernel
def huge_shift(x: Ptr[i32]):
    x[0] = 1 << 1000000000  # MARK-bigshift


@pk.kernel
def float_modulo_zero(x: Ptr[f32]):
    x[0] = 1.5 % 0.0  # MARK-fmod


@pk.kernel
def huge_unroll(x: Ptr[i32]):
    for i in pk.static_range(10**12):  # MARK-unroll
        x[0] = i


@pk.kernel
def huge_string(x: Ptr[f32]):
    x[0] = "ab" * 10**12  # MARK-string


CASES = [
    (negative_shift, "MARK-shift", "negative shift count", "1 << -1"),
    (string_store, "MARK-str", "the constant 'a' cannot be used as a f32", "x[0] = 'a'"),
    (string_arith, "MARK-strarith", "'aaa' cannot be used as a f32", "x[1] + "),
    (huge_power, "MARK-pow", "too large to fold", "10 ** 1000000000"),
    (huge_shift, "MARK-bigshift", "too large to fold", "1 << 1000000000"),
    (float_modulo_zero, "MARK-fmod", "cannot fold constant expression", "1.5 % 0.0"),
    (huge_unroll, "MARK-unroll", "unrolls 1000000000000 iterations", "pk.static_range("),
    (huge_string, "MARK-string", "too large to fold", '"ab" * 10**12'),
]


@pytest.mark.parametrize("arch", ["sm_90", "cpu"])
@pytest.mark.parametrize("kernel,marker,message,underlined", CASES, ids=[c[1] for c in CASES])
def test_lowering_failure_is_a_located_source_error(kernel, marker, message, underlined, arch):
    with pytest.raises(pk.KernelSourceError, match=message) as info:
        kernel.compile(arch)
    check_located(info.value, marker, underlined)


def test_unexpected_exception_names_the_construct(monkeypatch):
    """A compiler bug in a handler still comes out located, saying what was being lowered."""
    from pykernel.lower import expressions

    def broken(fl, node):
        raise KeyError("boom")
    monkeypatch.setitem(expressions.EXPRESSIONS, __import__("ast").BinOp, broken)

    @pk.kernel
    def adds(x: Ptr[f32]):
        x[0] = x[1] + 1.0  # MARK-internal
    with pytest.raises(pk.KernelSourceError,
                       match="internal error while lowering arithmetic: KeyError") as info:
        adds.ptx("sm_90")
    check_located(info.value, "MARK-internal", "x[1] + 1.0")


T = typing.TypeVar("T")


def test_annotation_that_does_not_evaluate():
    def body(x: Ptr[f32], n: "Undefined"):  # noqa: F821  MARK-ann
        pass
    with pytest.raises(pk.KernelSourceError, match="cannot evaluate the annotation") as info:
        pk.kernel(body)
    check_located(info.value, "MARK-ann", "n: \"Undefined\"")


def test_string_type_variable_without_a_binding():
    @pk.kernel
    def k(x: Ptr[f32], n: "T"):  # MARK-typevar
        x[0] = 1.0
    with pytest.raises(pk.KernelSourceError, match="element type ~T is not bound") as info:
        k.ptx("sm_90")
    check_located(info.value, "MARK-typevar", "n: \"T\"")


def test_bad_const_value_is_located():
    @pk.kernel
    def k(x: Ptr[f32], N: Const[int]):  # MARK-const
        x[0] = f32(N)
    with pytest.raises(pk.KernelSourceError, match="expects int") as info:
        k.ptx("sm_90", N="three")
    check_located(info.value, "MARK-const", "N: Const[int]")


def test_library_function_hint_names_the_intrinsic():
    import math

    @pk.kernel
    def k(x: Ptr[f32]):
        x[0] = math.exp(x[0])  # MARK-exp
    with pytest.raises(pk.KernelSourceError, match="cannot call Python function 'exp'") as info:
        k.ptx("sm_90")
    assert "hint: use pk.exp(...)" in str(info.value) and "@pk.func" not in str(info.value)
    check_located(info.value, "MARK-exp", "math.exp(x[0])")
