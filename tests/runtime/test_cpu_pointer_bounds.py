"""A pointer chosen at run time among several arrays keeps the bounds of the array it points
into on the CPU target: through a reassigned variable, a conditional expression and a @pk.func
that returns one of its pointer parameters. An access inside the chosen array is fine however
small the other arrays are; one past its end is an out-of-bounds error naming file:line:col."""
import re

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32

pytestmark = pytest.mark.usefixtures("cpu_device")

SIZES = (3, 11, 7)          # array k has SIZES[k] elements; the first is the smallest but one


@pk.kernel
def read_reassigned(a: Ptr[f32], b: Ptr[f32], c: Ptr[f32], out: Ptr[f32], k: i32, at: i32):
    p = a
    if k == 1:
        p = b
    elif k == 2:
        p = c
    out[pk.thread_idx.x] = p[at + pk.thread_idx.x]          # REASSIGNED-LINE


@pk.kernel
def write_conditional(a: Ptr[f32], b: Ptr[f32], k: i32, at: i32, v: f32):
    p = a if k == 0 else b
    p[at] = v                                                 # CONDITIONAL-LINE


@pk.func
def pick(k: i32, a, b, c):
    if k == 0:
        return a
    elif k == 1:
        return b
    return c


@pk.kernel
def read_picked(a: Ptr[f32], b: Ptr[f32], c: Ptr[f32], out: Ptr[f32], k: i32, at: i32):
    out[0] = pick(k, a, b, c)[at]                             # PICKED-LINE


@pk.kernel
def read_rotating(a: Ptr[f32], b: Ptr[f32], c: Ptr[f32], out: Ptr[f32], at: i32):
    """The variable is read in a loop before it is rebound: every trip checks the array it
    points into on that trip."""
    p = a
    for k in range(3):
        out[k] = p[at]                                        # ROTATING-LINE
        if k == 0:
            p = b
        else:
            p = c


def _arrays(rng):
    host = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    return host, [pk.to_device(h) for h in host]


def _line_of(marker):
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line)


def _assert_names_line(info, kernel, marker):
    text = str(info.value)
    assert kernel in text and "out-of-bounds" in text, text
    assert re.search(rf"test_cpu_pointer_bounds\.py:{_line_of(marker)}:\d+", text), text


@pytest.mark.parametrize("k", [0, 1, 2])
def test_reassigned_pointer_checks_its_own_array(rng, k):
    host, dev = _arrays(rng)
    n = SIZES[k]
    out = pk.to_device(np.full(n, np.nan, np.float32))
    read_reassigned[1, n](*dev, out, k, 0)                    # the whole array k, in bounds
    np.testing.assert_array_equal(out.numpy(), host[k])
    with pytest.raises(pk.KernelRuntimeError) as info:
        read_reassigned[1, 1](*dev, out, k, n)                # one past the end of array k
    _assert_names_line(info, "read_reassigned", "REASSIGNED-LINE")


@pytest.mark.parametrize("k", [0, 1])
def test_conditional_expression_pointer_checks_its_own_array(rng, k):
    host, dev = _arrays(rng)
    n, v = SIZES[k], np.float32(rng.standard_normal())
    write_conditional[1, 1](dev[0], dev[1], k, n - 1, v)      # the last element of array k
    want = host[k].copy()
    want[n - 1] = v
    np.testing.assert_array_equal(dev[k].numpy(), want)
    np.testing.assert_array_equal(dev[1 - k].numpy(), host[1 - k])
    with pytest.raises(pk.KernelRuntimeError) as info:
        write_conditional[1, 1](dev[0], dev[1], k, n, v)
    _assert_names_line(info, "write_conditional", "CONDITIONAL-LINE")


@pytest.mark.parametrize("k", [0, 1, 2])
def test_pointer_returned_by_func_checks_its_own_array(rng, k):
    host, dev = _arrays(rng)
    n = SIZES[k]
    out = pk.to_device(np.full(1, np.nan, np.float32))
    read_picked[1, 1](*dev, out, k, n - 1)
    assert out.numpy()[0] == host[k][n - 1]
    with pytest.raises(pk.KernelRuntimeError) as info:
        read_picked[1, 1](*dev, out, k, n)
    _assert_names_line(info, "read_picked", "PICKED-LINE")


def test_pointer_rebound_in_a_loop(rng):
    host, dev = _arrays(rng)
    out = pk.to_device(np.full(3, np.nan, np.float32))
    read_rotating[1, 1](*dev, out, SIZES[0] - 1)              # a's last, then b's and c's
    np.testing.assert_array_equal(out.numpy(), [h[SIZES[0] - 1] for h in host])
    with pytest.raises(pk.KernelRuntimeError) as info:
        read_rotating[1, 1](*dev, out, SIZES[2])              # in b, past the end of c
    _assert_names_line(info, "read_rotating", "ROTATING-LINE")
