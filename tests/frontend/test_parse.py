"""Stage 1 (parse): a Python function -> FunctionAST with absolute file/line/column."""
import os

import pykernel as pk
from pykernel import Ptr, f32
from pykernel.frontend.parse import parse


class Holder:
    @staticmethod
    def indented(x: Ptr[f32]):
        x[0] = 1.0


def test_parse_records_absolute_positions():
    fast = parse(Holder.indented)
    assert fast.file == os.path.abspath(__file__)
    assert fast.name == "indented"
    assert fast.col_offset == 4                  # the method body was dedented by 4
    stmt = fast.tree.body[0]
    err = fast.error(stmt, "probe")
    assert err.line == Holder.indented.__code__.co_firstlineno + 2
    assert err.col == 8                          # absolute column in the file
    assert "x[0] = 1.0" in err.source_line


def test_source_hash_changes_with_source():
    def a(x: Ptr[f32]):
        x[0] = 1.0

    def b(x: Ptr[f32]):
        x[0] = 2.0
    assert parse(a).source_hash != parse(b).source_hash


def test_kernel_signature_kinds():
    @pk.kernel
    def k(x: Ptr[f32, "ro"], n: pk.i32, N: pk.Const[int], T: pk.Const[pk.dtype]):
        pass
    kinds = [(p.name, p.kind) for p in k.params]
    assert kinds == [("x", "ptr"), ("n", "scalar"), ("N", "const"), ("T", "dtype")]
