"""What the GPU leaves undefined after some threads returned is an error on the CPU target,
naming the kernel and file:line:col, instead of a silent zero: a shuffle reading a lane that
returned (or one outside its mask), a warp operation whose mask names a returned lane, a
syncthreads that threads which returned never reach. The same kernels without the returns
run clean (the checks do not fire on correct code)."""
import re

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, i32, u32


pytestmark = pytest.mark.usefixtures("cpu_device")


@pk.kernel
def shuffle_after_return(out: Ptr[i32], gone: i32):
    t = pk.thread_idx.x
    if t >= gone:
        return
    out[t] = pk.shfl_down(t, 1)                       # SHUFFLE-RETURNED-LINE


@pk.kernel
def shuffle_outside_mask(out: Ptr[i32], mask: u32):
    t = pk.thread_idx.x
    out[t] = pk.shfl_xor(t, 1, mask=mask)             # MASK-SHUFFLE-LINE


@pk.kernel
def ballot_after_return(out: Ptr[u32], gone: i32):
    t = pk.thread_idx.x
    if t >= gone:
        return
    out[t] = pk.ballot(t % 2 == 0)                    # BALLOT-LINE


@pk.kernel
def redux_after_return(out: Ptr[u32], gone: i32):
    t = pk.thread_idx.x
    if t >= gone:
        return
    out[t] = pk.redux_sync("add", u32(0xFFFFFFFF), u32(t))   # REDUX-LINE


@pk.kernel
def barrier_after_return(out: Ptr[i32], gone: i32):
    t = pk.thread_idx.x
    if t >= gone:
        return
    pk.syncthreads()                                  # BARRIER-LINE
    out[t] = t


def _location(kernel, marker: str) -> str:
    """file:line:col of the pk.* call on the line of this file tagged `marker`."""
    with open(__file__) as source:
        lines = source.read().splitlines()
    for number, text in enumerate(lines, start=1):
        if marker in text and not text.lstrip().startswith(("_raises", "\"")):
            col = re.search(r"pk\.\w+\(", text).start() + 1
            return f"{__file__}:{number}:{col}"
    raise AssertionError(marker)


def _raises(launch, kernel, marker, words):
    with pytest.raises(pk.KernelRuntimeError) as info:
        launch()
    text = str(info.value)
    assert f"kernel '{kernel.name}'" in text and _location(kernel, marker) in text, text
    for word in words:
        assert word in text, text


def test_shuffle_reading_a_returned_lane():
    out = pk.full(32, -1, np.int32)
    _raises(lambda: shuffle_after_return[1, 32](out, 20), shuffle_after_return,
            "SHUFFLE-RETURNED-LINE", ["shuffle", "returned"])
    shuffle_after_return[1, 32](out, 32)              # nobody returned: fine
    want = np.arange(32) + 1
    want[31] = 31                                     # past the warp: its own value
    np.testing.assert_array_equal(out.numpy(), want)


def test_shuffle_outside_its_mask():
    out = pk.full(32, -1, np.int32)
    _raises(lambda: shuffle_outside_mask[1, 32](out, 0x0000FFFF), shuffle_outside_mask,
            "MASK-SHUFFLE-LINE", ["mask"])
    shuffle_outside_mask[1, 32](out, 0xFFFFFFFF)
    np.testing.assert_array_equal(out.numpy(), np.arange(32) ^ 1)


@pytest.mark.parametrize("kernel,marker", [(ballot_after_return, "BALLOT-LINE"),
                                           (redux_after_return, "REDUX-LINE")])
def test_warp_operation_naming_returned_lanes(kernel, marker):
    out = pk.full(32, 7, np.uint32)
    _raises(lambda: kernel[1, 32](out, 11), kernel, marker, ["mask", "returned"])
    kernel[1, 32](out, 32)
    want = 0x55555555 if kernel is ballot_after_return else sum(range(32))
    assert (out.numpy() == want).all()


def test_partial_last_warp_is_not_an_error():
    """Lanes past the block's end never existed: a full mask over them is fine."""
    out = pk.full(40, 7, np.uint32)
    ballot_after_return[1, 40](out, 40)
    np.testing.assert_array_equal(out.numpy(), [0x55555555] * 32 + [0x55] * 8)


def test_syncthreads_after_some_threads_returned():
    out = pk.full(64, -1, np.int32)
    _raises(lambda: barrier_after_return[1, 64](out, 40), barrier_after_return,
            "BARRIER-LINE", ["syncthreads", "returned"])
    barrier_after_return[1, 64](out, 64)
    np.testing.assert_array_equal(out.numpy(), np.arange(64))
