"""Issue 45, item 6: a launch the GPU would refuse is a LaunchError naming the kernel and the
grid, block or size on every device: the CPU device used to run 2**31 blocks, hang on
(2**31, 65536, 65536), raise OverflowError for 2**63 and KernelRuntimeError for too many
threads; a negative dynamic shared size and a bool for an i32 were accepted."""
import time

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32
from pykernel.runtime.limits import check_geometry


@pk.kernel
def fill(out: Ptr[f32], n: i32, v: f32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        out[i] = v


BAD_LAUNCHES = [
    ((2**31, 1), r"grid x = 2147483648, must be in 1\.\.2147483647"),
    (((2**31 - 1, 65536), 1), r"grid y = 65536, must be in 1\.\.65535"),
    (((2**31, 65536, 65536), 1), r"grid x = 2147483648"),
    (((1, 1, 65536), 1), r"grid z = 65536"),
    ((2**63, 1), r"grid x = 9223372036854775808"),
    ((1, 1025), r"block x = 1025, must be in 1\.\.1024"),
    ((1, (1, 1025)), r"block y = 1025"),
    ((1, (1, 1, 65)), r"block z = 65, must be in 1\.\.64"),
    ((1, (64, 32)), r"2048 threads per block; at most 1024"),
    ((1, 32, None, -1), r"shared_bytes .* non-negative int, got -1"),
    ((1, 32, None, 1.5), r"shared_bytes .* non-negative int, got 1\.5"),
    ((1, 32, None, 2**40), r"dynamic shared memory of 1099511627776 bytes"),
    ((True, 32), r"grid must be a positive int"),
]


@pytest.mark.parametrize("config,message", BAD_LAUNCHES, ids=[str(c[0]) for c in BAD_LAUNCHES])
def test_launch_beyond_cuda_limits_is_a_launch_error(device, config, message):
    out = pk.zeros(4, np.float32)
    start = time.perf_counter()
    with pytest.raises(pk.LaunchError, match=message) as info:
        fill[config](out, 4, 1.0)
    assert str(info.value).startswith("fill["), info.value      # names the kernel
    assert time.perf_counter() - start < 5                      # refused, not run
    assert not out.numpy().any()


def test_limits_themselves_launch(device):
    """The largest legal extents are accepted (checked without running 2**31 blocks)."""
    check_geometry("k", (2**31 - 1, 65535, 65535), (1024, 1, 1), 227 * 1024)
    check_geometry("k", (1, 1, 1), (1, 16, 64), 0)
    out = pk.zeros(32, np.float32)
    fill[1, (16, 1, 64)](out, 32, 2.0)       # 1024 threads, block z at its limit
    assert (out.numpy()[:16] == 2.0).all() and not out.numpy()[16:].any()


def test_cpu_device_checks_direct_launches_too():
    """Code that calls device.launch itself (graphs, stdlib wrappers) meets the same check:
    LaunchError, where the CPU device raised KernelRuntimeError for too many threads."""
    dev = pk.set_device("cpu")
    compiled = fill.compile("cpu")
    out = pk.zeros(4, np.float32)
    for grid, block in (((1, 1, 1), (2048, 1, 1)), ((2**31, 1, 1), (1, 1, 1)),
                        ((1, 0, 1), (1, 1, 1))):
        with pytest.raises(pk.LaunchError, match=r"^fill\[grid="):
            dev.launch(compiled, grid, block, (out, 4, 1.0))


@pytest.mark.parametrize("param,value,expected", [
    ("n", True, r"parameter 'n' expects an integer \(i32\), got bool True"),
    ("v", False, r"parameter 'v' expects a float \(f32\), got bool False"),
])
def test_bool_for_a_number_is_rejected(device, param, value, expected):
    out = pk.zeros(4, np.float32)
    args = {"out": out, "n": 4, "v": 1.0, param: value}
    with pytest.raises(pk.LaunchError, match=expected):
        fill[1, 32](**args)
