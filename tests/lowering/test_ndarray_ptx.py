"""N-d array parameters in the compiler: the expanded ABI (pointer, extents, strides), 64-bit
offset math in the IR and PTX (assembled by ptxas for every supported arch), per-dimension
bounds checks in PTX, the AOT manifest and C header, and source errors."""
import json
import re
import shutil
import subprocess

import pytest

import pykernel as pk
from pykernel import aot, f32, i32, i64


@pk.kernel
def add2(x: pk.Array[f32, 2, "ro"], y: pk.Array[f32, 2], out: pk.Array[f32, 2]):
    r = pk.block_idx.y * pk.block_dim.y + pk.thread_idx.y       # i32 indexes
    c = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i64(r) < out.shape[0] and i64(c) < out.shape[1]:
        out[r, c] = x[r, c] + y[r, c]


@pk.func
def row_sum(x: pk.Array[f32, 2, "ro"], r: i64) -> f32:
    acc = f32(0.0)
    for c in range(x.shape[1]):
        acc += x[r, c]
    return acc


@pk.kernel(bounds_check=True)
def sums(x: pk.Array[f32, 2, "ro"], out: pk.Array[f32, 1]):
    r = i64(pk.thread_idx.x)
    out[r] = row_sum(x, r)


def test_abi_expands_to_pointer_shape_strides():
    c = pk.compile(add2, "sm_80")
    assert [(p.name, p.kind, p.type_name) for p in c.params[:5]] == [
        ("x", "array", 'Array[f32, 2, "ro"]'), ("x_shape0", "scalar", "i64"),
        ("x_shape1", "scalar", "i64"), ("x_stride0", "scalar", "i64"),
        ("x_stride1", "scalar", "i64")]
    assert len(c.params) == 15 and c.params[0].rank == 2
    header = c.ptx[c.ptx.index(".entry add2"):c.ptx.index(")")]
    assert header.count(".param .u64 .ptr .global") == 3       # x, y, out
    assert header.count(".param .u64 add2_param_") == 12        # their extents and strides


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_offsets_are_64_bit_in_ir_and_ptx(arch, assemble):
    ir = add2.llvm_ir(arch)
    # each i32 index is sign-extended and multiplied by its i64 stride: no 32-bit wrap
    assert "sext i32" in ir and "mul i64" in ir
    ptx = pk.compile(add2, arch).ptx
    body = ptx[ptx.index(".entry add2"):]
    assert any(op in body for op in ("mul.lo.s64", "mad.lo.s64", "mul.wide.s32"))
    assert "ld.global.nc" in body                     # "ro" arrays read through the nc path
    assemble(ptx, arch)


@pytest.mark.parametrize("arch", ["sm_75", "sm_90", "sm_120"])
def test_bounds_check_ptx_checks_each_dimension(arch, assemble):
    c = pk.compile(sums, arch)
    assert not any(p.name.startswith("__nbytes_") for p in c.params)  # the shape suffices
    assert "vprintf" in c.ptx and "trap;" in c.ptx
    text = _ptx_strings(c.ptx)                # the vprintf formats, as the GPU prints them
    assert "kernel 'sums': index out of range in dimension 1 of 'x' at " in text  # in @pk.func
    assert "kernel 'sums': index out of range in dimension 0 of 'out' at " in text
    assert "test_ndarray_ptx.py:34:9 (index %lld, extent %lld)" in text     # out[r]
    assert "setp.ge.u64" in c.ptx or "setp.lt.u64" in c.ptx         # one compare, negatives too
    assemble(c.ptx, arch)


def _ptx_strings(ptx: str) -> str:
    """The constant strings of a PTX module (`.b8 str[N] = {112, 121, ...}`), decoded."""
    arrays = re.findall(r"\.b8 str\S*\[\d+\] = \{([\d, ]+)\}", ptx)
    return "\n".join(bytes(int(v) for v in a.split(",")).decode() for a in arrays)


FAKE_CUDA_H = """#pragma once
#include <stddef.h>
typedef int CUresult; typedef struct CUfunc_st* CUfunction; typedef struct CUstream_st* CUstream;
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void**, void**);
"""


def test_aot_manifest_and_header_describe_the_expanded_abi(tmp_path):
    src = tmp_path / "kern.py"
    src.write_text("import pykernel as pk\nfrom pykernel import f32\n\n@pk.kernel\n"
                   "def copy2(x: pk.Array[f32, 2, 'ro'], out: pk.Array[f32, 2], n: pk.i32):\n"
                   "    out[0, 0] = x[0, 0]\n")
    aot.build(str(src), ["sm_80"], str(tmp_path / "out"), [])
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    params = manifest["kernels"][0]["params"]
    assert [(p["name"], p["kind"], p["type"], p.get("rank")) for p in params] == [
        ("x", "array", 'Array[f32, 2, "ro"]', 2), ("x_shape0", "scalar", "i64", None),
        ("x_shape1", "scalar", "i64", None), ("x_stride0", "scalar", "i64", None),
        ("x_stride1", "scalar", "i64", None), ("out", "array", "Array[f32, 2]", 2),
        ("out_shape0", "scalar", "i64", None), ("out_shape1", "scalar", "i64", None),
        ("out_stride0", "scalar", "i64", None), ("out_stride1", "scalar", "i64", None),
        ("n", "scalar", "i32", None)]
    header = (tmp_path / "out" / "kernels.h").read_text()
    assert ("const float* x, int64_t x_shape0, int64_t x_shape1, int64_t x_stride0, "
            "int64_t x_stride1, float* out,") in header
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler: header generated but not compiled")
    (tmp_path / "out" / "cuda.h").write_text(FAKE_CUDA_H)
    (tmp_path / "use.c").write_text('#include "kernels.h"\nint main(void) { return 0; }\n')
    proc = subprocess.run([cc, "-fsyntax-only", "-Wall", "-Werror", "-I",
                           str(tmp_path / "out"), str(tmp_path / "use.c")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _source_error(fn) -> str:
    with pytest.raises(pk.KernelSourceError) as err:
        pk.kernel(fn).ptx("sm_80")
    return str(err.value)


def test_source_errors():
    def wrong_rank(x: pk.Array[f32, 2]):
        x[1] = 0.0
    assert "'x' is a 2-d array (Array[f32, 2]) indexed with 1 index" in _source_error(wrong_rank)

    def no_attr(x: pk.Array[f32, 2], out: pk.Array[i64, 1]):
        out[0] = x.size
    assert "has no attribute 'size' (it has shape, strides, ndim)" in _source_error(no_attr)

    def store_ro(x: pk.Array[f32, 1, "ro"]):
        x[0] = 1.0
    assert "cannot store through a read-only pointer" in _source_error(store_ro)

    def float_index(x: pk.Array[f32, 2]):
        x[0, 1.0] = 1.0
    assert "index must be an integer, got f32" in _source_error(float_index)

    def clash(x: pk.Array[f32, 1], x_shape0: i32):
        x[0] = 1.0
    assert "also the name of an array parameter's shape/stride" in _source_error(clash)


def test_annotation_errors():
    for bad, text in [((f32,), "takes an element type and a rank"),
                      ((f32, 0), "rank must be an int in 1..8"),
                      ((f32, 2, "rw"), "unknown pk.Array flag 'rw'")]:
        with pytest.raises(TypeError, match=text):
            pk.Array[bad]
    assert pk.ReadOnly[pk.Array[f32, 2]] == pk.Array[f32, 2, "ro"]


@pytest.mark.parametrize("arch", ["sm_80", "cpu"])
def test_disk_cache_keeps_the_array_abi(arch):
    """A warm load (disk cache header) restores the array entry's rank, which the packer's
    argument expansion reads."""
    from pykernel import cache
    c = pk.compile(add2, arch)
    cache._MEMORY.pop(c.cache_key, None)
    hit = cache.lookup(c.cache_key, arch)
    if hit is None:
        pytest.skip("the disk cache is off in this environment")
    assert [(p.name, p.kind, p.rank) for p in hit.params[:2]] == [
        ("x", "array", 2), ("x_shape0", "scalar", 0)]
