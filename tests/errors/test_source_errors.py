"""Kernel source errors: printed like a compiler (absolute file:line:col, the line, a caret
under the node, a hint), one exception type, and no compiler internals in the message."""
import os
import traceback

import pytest

import pykernel as pk
from tests.errors.markers import line_of as marker_line
from pykernel import Const, Ptr, f32, i32

THIS_FILE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    return marker_line(THIS_FILE, marker)


@pk.kernel
def mixes_types(x: Ptr[f32], n: i32):
    y = x[0] + n  # MARK-mix
    x[0] = y


@pk.kernel
def uses_list(x: Ptr[f32]):
    vals = [1.0, 2.0]  # MARK-list
    x[0] = vals[0]


@pk.kernel
def unknown_name(x: Ptr[f32]):
    x[0] = undefined_thing  # noqa: F821  MARK-name


@pk.kernel
def int_division(x: Ptr[i32], n: i32):
    x[0] = n / 2  # MARK-div


@pk.kernel
def retype(x: Ptr[f32], n: i32):
    v = n
    v = x[0]  # MARK-retype
    x[1] = f32(v)


@pk.kernel
def try_block(x: Ptr[f32]):
    try:  # MARK-try
        x[0] = 1.0
    except Exception:
        pass


@pk.func
def recursive(n: i32) -> i32:
    return recursive(n - 1)  # MARK-rec


@pk.kernel
def calls_recursive(x: Ptr[i32]):
    x[0] = recursive(3)


@pk.kernel
def store_readonly(x: Ptr[f32, "ro"]):
    x[0] = 1.0  # MARK-ro


@pk.kernel
def static_needs_const(x: Ptr[f32], n: i32):
    for i in pk.static_range(n):  # MARK-static
        x[i] = 0.0


@pk.kernel
def literal_too_big(x: Ptr[i32]):
    x[0] = pk.bitcast(f32(1.0), i32) + 5000000000  # MARK-big


@pk.kernel
def int_accumulator(x: Ptr[f32], n: i32):
    acc = 0  # MARK-acc
    for i in range(n):
        acc += x[i]
    x[0] = acc


CASES = [
    # the mistake is where acc became an integer, not the += that finds it
    (int_accumulator, "MARK-acc", "'acc' became i32 here (from a literal), but line", "acc",
     "start it as f32: acc = 0.0"),
    (mixes_types, "MARK-mix", "operands have different types: f32 and i32", "x[0] + n",
     "convert explicitly"),
    (uses_list, "MARK-list", "lists are not supported in kernels", "[1.0, 2.0]", None),
    (unknown_name, "MARK-name", "name 'undefined_thing' is not defined", "undefined_thing", None),
    (int_division, "MARK-div", "'/' on integers", "n / 2", "use //"),
    (retype, "MARK-retype", "a variable keeps one type", "v", None),
    (try_block, "MARK-try", "try/except is not supported", "try:", None),
    (calls_recursive, "MARK-rec", "recursive call of 'recursive'", "recursive(n - 1)", None),
    (store_readonly, "MARK-ro", "read-only pointer", "x[0]", None),
    (static_needs_const, "MARK-static", "compile-time integer", "pk.static_range(n)", None),
    (literal_too_big, "MARK-big", "does not fit in i32", None, None),
]


@pytest.mark.parametrize("kernel,marker,message,underlined,hint", CASES,
                         ids=[c[1] for c in CASES])
def test_error_format(kernel, marker, message, underlined, hint):
    with pytest.raises(pk.KernelSourceError) as info:
        kernel.ptx("sm_90")
    err = info.value
    text = str(err)
    line = line_of(marker)
    assert err.file == THIS_FILE
    assert err.line == line, text
    first = text.splitlines()[0]
    assert first.startswith(f"{THIS_FILE}:{line}:{err.col + 1}: error: "), first
    assert message in first, text
    src_line, caret_line = text.splitlines()[1:3]
    assert marker in src_line
    if underlined is not None:
        # the caret sits under the offending node and the underline covers it
        start = caret_line.index("^")
        width = len(caret_line.strip())
        assert src_line[start:start + width].startswith(underlined[:width]), (src_line, caret_line)
    if hint:
        assert f"hint: {hint}" in text
    # No compiler internals: the exception is raised `from None` at the choke point.
    assert err.__cause__ is None and err.__suppress_context__
    assert "pykernel/lower" not in text and "Traceback" not in text


def test_error_is_raised_without_internal_frames_in_message():
    try:
        mixes_types.ptx("sm_80")
    except pk.KernelSourceError as err:
        rendered = "".join(traceback.format_exception_only(type(err), err))
        assert "codegen.py" not in rendered and "llvmlite" not in rendered


def test_unsupported_arch_is_an_error_not_an_abort():
    @pk.kernel
    def mma_kernel(out: Ptr[f32]):
        d0, d1, d2, d3 = pk.mma_m16n8k16_f16(0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0)
        out[0] = d0
    with pytest.raises(pk.UnsupportedArchError) as info:
        mma_kernel.ptx("sm_75")
    assert "needs sm_80" in str(info.value)
    assert "sm_80" in mma_kernel.ptx("sm_80")


def test_unknown_arch_rejected():
    @pk.kernel
    def k(out: Ptr[f32]):
        out[0] = 1.0
    with pytest.raises(ValueError, match="unsupported arch"):
        k.ptx("sm_61")


def test_missing_annotation_is_reported():
    def body(x, n: i32):
        pass
    with pytest.raises(pk.KernelSourceError, match="parameter 'x' needs a type annotation") \
            as info:
        pk.kernel(body)
    assert (info.value.file, info.value.line) == (THIS_FILE, body.__code__.co_firstlineno)
    assert info.value.source_line[info.value.col:].startswith("x, n: i32")


def test_const_arguments_checked():
    @pk.kernel
    def k(out: Ptr[f32], N: Const[int]):
        out[0] = f32(N)
    with pytest.raises(pk.KernelSourceError, match="missing compile-time argument") as info:
        k.ptx("sm_90")
    assert info.value.file == THIS_FILE and info.value.source_line[info.value.col:] \
        .startswith("N: Const[int]")
    with pytest.raises(pk.KernelSourceError, match="unknown compile-time argument") as info:
        k.ptx("sm_90", N=3, M=4)
    assert "def k(" in info.value.source_line


def test_closure_over_mutable_python_object_is_rejected():
    data = [1.0, 2.0]

    @pk.kernel
    def reads_list(x: Ptr[f32]):
        x[0] = data[0]
    with pytest.raises(pk.KernelSourceError, match="'data' is a Python list") as info:
        reads_list.ptx("sm_90")
    assert "hint: pass the data as a Ptr argument" in str(info.value)


def test_keyword_only_and_varargs_parameters_are_rejected():
    def kw_only(x: Ptr[f32], *, n: i32):
        pass

    def var_args(x: Ptr[f32], *rest):
        pass
    with pytest.raises(pk.KernelSourceError, match="keyword-only parameters") as info:
        pk.kernel(kw_only)
    assert info.value.line == kw_only.__code__.co_firstlineno
    with pytest.raises(pk.KernelSourceError, match=r"\*args"):
        pk.kernel(var_args)


@pytest.mark.parametrize("annotation, message, underlined", [
    ('Ptr[f32, "rw"]', "unknown Ptr flag 'rw'", 'Ptr[f32, "rw"]'),
    ("pk.Array[f32, 0]", "pk.Array rank must be an int in 1..8", "pk.Array[f32, 0]"),
    ('pk.Array[f32, 2, "w"]', "unknown pk.Array flag 'w'", 'pk.Array[f32, 2, "w"]'),
])
def test_malformed_annotation_is_located_at_the_annotation(tmp_path, annotation, message,
                                                           underlined):
    """Python evaluates annotations before @pk.kernel runs, so the error is located from the
    defining frame: file:line:col of the annotation, its line and a caret under it; still a
    TypeError, as Python's own annotation errors are."""
    path = tmp_path / "bad_annotation.py"
    source = ("import pykernel as pk\nfrom pykernel import Ptr, f32\n\n\n@pk.kernel\n"
              f"def k(x: Ptr[f32], y: {annotation}):\n    x[0] = 1.0\n")
    path.write_text(source)
    code = compile(source, str(path), "exec")
    with pytest.raises(pk.KernelSourceError) as info:
        exec(code, {"__name__": "bad_annotation"})
    err = info.value
    assert isinstance(err, TypeError)
    col = source.splitlines()[5].index(annotation)
    if not hasattr(code, "co_positions"):       # Python 3.10: the line only
        col = 0
    assert (err.file, err.line, err.col) == (str(path), 6, col)
    text = str(err)
    assert text.startswith(f"{path}:6:{col + 1}: error: {message}")
    if hasattr(code, "co_positions"):
        assert "    " + " " * col + "^" + "~" * (len(underlined) - 1) in text


@pytest.mark.parametrize("decorator", ["pk.kernel", "pk.func"])
def test_malformed_string_annotation_is_located_at_its_parameter(tmp_path, decorator):
    """With `from __future__ import annotations` pykernel evaluates the annotation itself (at
    compile time): the error names the parameter's file:line:col, not eval's '<string>'."""
    path = tmp_path / "bad_string_annotation.py"
    source = ("from __future__ import annotations\nimport pykernel as pk\n"
              "from pykernel import Ptr, f32\n\n\n"
              f"@{decorator}\ndef helper(v: f32, s: Ptr[f32, \"rw\"]) -> f32:\n    return v\n\n\n"
              "@pk.kernel\ndef k(x: Ptr[f32]):\n    x[0] = helper(x[0], x)\n")
    path.write_text(source)
    module = {"__name__": "bad_string_annotation"}
    with pytest.raises(pk.KernelSourceError) as info:     # a kernel's signature: at @pk.kernel
        exec(compile(source, str(path), "exec"), module)
        module["k"].compile("cpu")                        # a @pk.func's: when a kernel calls it
    err = info.value
    assert (err.file, err.line) == (str(path), 7), str(err)
    assert "unknown Ptr flag 'rw'" in str(err) and "<string>" not in str(err)
