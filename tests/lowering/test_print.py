"""print() in kernels and device functions: Python's print for debugging, one formatted line
per call and thread (vprintf on the GPU, C printf on the CPU target): constants as literal
text, integers of every width, f16 / f32 values as %g, bools as True / False, sep= and end=,
f-strings with the printf-expressible part of Python's format specs;
on the CPU target in thread order and after what the host printed before the launch, on the
GPU by the next synchronization; the PTX assembles for every arch; misuse is a compile error."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f16, f32, i32, i64, u8
from pykernel.errors import KernelSourceError


@pk.func
def show_doubled(k: i32, v: f32):
    print("  func", k, v * 2.0, sep="|", end=";\n")


@pk.kernel
def print_values(x: Ptr[f32, "ro"], h: Ptr[f16, "ro"], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        print("thread", i, "x =", x[i], "half", h[i], "big", i64(1) << 40, u8(200), i < 2, 7,
              2.5, "100%")
        show_doubled(i, x[i])


def expected_lines(x, h):
    lines = []
    for i, (xv, hv) in enumerate(zip(x, h)):
        lines.append(f"thread {i} x = {'%g' % float(xv)} half {'%g' % float(hv)} big "
                     f"{1 << 40} 200 {i < 2} 7 2.5 100%")
        lines.append(f"  func|{i}|{'%g' % float(np.float32(xv) * np.float32(2))};")
    return lines


def test_print_writes_each_threads_values(device, rng, seed, capfd):
    n = int(rng.integers(1, 40))
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)).astype(np.float32)
    h = rng.standard_normal(n).astype(np.float16)
    print("host line before the launch")
    print_values[(n + 31) // 32, 32](pk.to_device(x), pk.to_device(h), n)
    pk.synchronize()
    out = capfd.readouterr().out.splitlines()
    want = expected_lines(x, h)
    assert out[0] == "host line before the launch"
    if device.kind == "cpu":     # threads run in order, each to the end of the kernel
        assert out[1:] == want, f"n={n} (seed {seed})"
    else:                        # GPU threads interleave: the same lines, in some order
        assert sorted(out[1:]) == sorted(want), f"n={n} (seed {seed})"


@pk.kernel
def print_formatted(x: Ptr[f32, "ro"], n: i32):
    i = pk.thread_idx.x
    if i < n:
        print(f"[{i:3d}|{i:<4d}|{i:04d}|{i * 37:x}|{i * 37:X}|{i:o}] {x[i]:.3f} {x[i]:+10.2e}",
              f"{x[i]:g} {x[i]:8.1f}% {u8(i + 250)} {i == 1} {2.5:.2f} {7:03d}", sep=" / ")


def formatted_lines(x):
    lines = []
    for i, v in enumerate(float(t) for t in x):
        lines.append(f"[{i:3d}|{i:<4d}|{i:04d}|{i * 37:x}|{i * 37:X}|{i:o}] {v:.3f} {v:+10.2e}"
                     f" / {v:g} {v:8.1f}% {(i + 250) % 256} {i == 1} 2.50 007")
    return lines


def test_print_f_strings_follow_pythons_format_specs(device, rng, seed, capfd):
    n = int(rng.integers(1, 32))
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 5, n)).astype(np.float32)
    print_formatted[1, 32](pk.to_device(x), n)
    pk.synchronize()
    out = capfd.readouterr().out.splitlines()
    want = formatted_lines(x)
    if device.kind == "cpu":
        assert out == want, f"n={n} (seed {seed})"
    else:
        assert sorted(out) == sorted(want), f"n={n} (seed {seed})"


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_print_ptx_assembles(arch, assemble):
    ptx = print_values.ptx(arch)
    assert "vprintf" in ptx
    assemble(ptx, arch)


@pk.kernel
def print_pointer(x: Ptr[f32]):
    print(x)


@pk.kernel
def print_to_file(x: Ptr[f32]):
    print(x[0], file=None)


@pk.kernel
def print_runtime_sep(x: Ptr[f32], s: i32):
    print(x[0], x[1], sep=s)


@pk.kernel
def print_bad_spec(x: Ptr[f32]):
    print(f"{x[0]:,}")


@pk.kernel
def print_int_as_float_type(x: Ptr[f32], i: i32):
    print(f"{x[0]:d}")


@pk.kernel
def print_conversion(x: Ptr[f32]):
    print(f"{x[0]!r}")


@pytest.mark.parametrize("kernel, message", [
    (print_bad_spec, "format spec ',' is not supported"),
    (print_int_as_float_type, "format type 'd' needs an integer"),
    (print_conversion, "conversions are not supported"),
    (print_pointer, "cannot print"),
    (print_to_file, "sep= and end= only, not file="),
    (print_runtime_sep, "sep= must be a constant string")])
def test_print_misuse_is_a_compile_error(kernel, message):
    with pytest.raises(KernelSourceError, match=message):
        kernel.ptx("sm_90")
