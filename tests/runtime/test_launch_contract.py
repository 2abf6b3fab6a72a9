"""The runtime behind real `@pk.kernel` launches, same bodies on both devices: arrays and
views, argument errors, streams/events, graph capture with replay, device-memory scalars and
argument updates."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32


@pk.kernel
def saxpy(n: i32, a: f32, x: Ptr[f32, "ro"], y: Ptr[f32]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        y[i] = a * x[i] + y[i]


@pk.kernel
def axpy_scale_from_memory(n: i32, scale: Ptr[f32, "ro"], x: Ptr[f32, "ro"], y: Ptr[f32]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        y[i] = scale[0] * x[i] + y[i]


def test_saxpy_into_a_view_of_a_pool(device, rng, seed):
    n = 100 + int(rng.integers(0, 200))
    hx = rng.standard_normal(n).astype(np.float32)
    pool = pk.full((3, n), np.nan, np.float32)
    pool[1] = 1.0
    saxpy[(n + 63) // 64, 64](n, 2.0, pk.to_device(hx), pool[1])
    out = pool.numpy()
    assert np.isnan(out[0]).all() and np.isnan(out[2]).all(), f"wrote outside the view {seed}"
    np.testing.assert_allclose(out[1], 2.0 * hx + 1.0, rtol=1e-6, err_msg=f"seed={seed}")


def test_argument_errors(device):
    y = pk.zeros(8)
    with pytest.raises(pk.LaunchError, match=r"saxpy\(\): parameter 'x'.*float64"):
        saxpy[1, 32](8, 1.0, pk.zeros(8, np.float64), y)
    with pytest.raises(pk.LaunchError, match=r"parameter 'n'"):
        saxpy[1, 32](2**40, 1.0, y, y)
    if device.kind == "cuda":
        with pytest.raises(pk.LaunchError, match=r"pk.to_device"):
            saxpy[1, 32](8, 1.0, np.zeros(8, np.float32), y)


def test_launch_configurations_are_validated_once_and_reused(device):
    from pykernel.kernel import MAX_LAUNCHERS
    y = pk.zeros(8)
    assert saxpy[1, 32] is saxpy[1, 32] and saxpy[1, 32] is not saxpy[1, 64]
    saxpy[1, 32](8, 1.0, y, y)
    with pytest.raises(pk.LaunchError, match="grid must be"):
        saxpy[[1], 32]                         # unhashable: checked as before, not kept
    with pytest.raises(pk.LaunchError, match="grid"):
        saxpy[0, 32]                           # invalid ones raise every time, never kept
    with pytest.raises(pk.LaunchError, match="grid"):
        saxpy[0, 32]
    for grid in range(1, MAX_LAUNCHERS + 10):  # the cache is bounded
        saxpy[grid, 32]
    assert len(saxpy._launchers) <= MAX_LAUNCHERS


def test_stream_event_and_synchronize(device, rng, seed):
    hx = rng.standard_normal(4096).astype(np.float32)
    x, y = pk.to_device(hx), pk.zeros(4096)
    stream, start, end = pk.Stream(), pk.Event(), pk.Event()
    start.record(stream)
    for _ in range(3):
        saxpy[64, 64, stream](4096, 1.0, x, y)
    end.record(stream)
    stream.synchronize()
    pk.synchronize()
    assert start.elapsed_ms(end) >= 0.0
    np.testing.assert_allclose(y.numpy(), 3 * hx, rtol=1e-5, err_msg=f"seed={seed}")


def test_graph_capture_replay_and_updates(device, rng, seed):
    n = 300
    hx = rng.standard_normal(n).astype(np.float32)
    x, y, scale = pk.to_device(hx), pk.zeros(n), pk.full(1, 0.0, np.float32)
    stream = pk.Stream()
    with pk.capture_graph(stream) as graph:
        axpy_scale_from_memory[5, 64](n, scale, x, y)
        saxpy[5, 64](n, 1.0, x, y)
    pk.synchronize()
    np.testing.assert_array_equal(y.numpy(), 0.0, err_msg="capture must not run the launches")
    expected = np.zeros(n, np.float32)
    for position in range(1, 4):        # like a decode step: the new value lives in memory
        scale.copy_from(np.float32([position]))
        graph.replay()
        stream.synchronize()
        expected = expected + np.float32(position) * hx + hx
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, err_msg=f"seed={seed}")
    graph.update_kernel_args(1, a=-4.0)
    graph.replay()
    stream.synchronize()
    expected = expected + np.float32(3.0) * hx - np.float32(4.0) * hx
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5,
                               err_msg=f"seed={seed}")
