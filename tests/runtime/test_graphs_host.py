"""Streams, events and graph capture on a host device: launches inside capture_graph are
recorded, not run; replay runs them; update_kernel_args changes later replays."""
import time

import numpy as np

from pykernel.runtime import arrays as ar
from pykernel.runtime.graphs import capture_graph
from pykernel.runtime.streams import Event, Stream
from tests.runtime.fakes import FakeCompiled, FakeHostDevice, ptr, scalar


def axpy_kernel():
    def run(n, a, x, y):
        y[:n] += a * x[:n]
    return FakeCompiled("axpy", [scalar("n", np.int32), scalar("a", np.float32),
                                 ptr("x", np.float32), ptr("y", np.float32)], run=run)


def test_capture_records_then_replays(rng, seed):
    dev = FakeHostDevice()
    kernel = axpy_kernel()
    host_x = rng.standard_normal(16).astype(np.float32)
    x, y = ar.to_device(host_x, device=dev), ar.zeros(16, np.float32, device=dev)
    stream = Stream(dev)
    with capture_graph(stream) as graph:
        dev.launch(kernel, (1, 1, 1), (16, 1, 1), (16, 2.0, x, y))
        dev.launch(kernel, (1, 1, 1), (16, 1, 1), (8, 1.0, x, y))
    assert not dev.launched, "capture must record launches, not run them"
    assert [launch.name for launch in graph.launches] == ["axpy", "axpy"]
    graph.replay()
    graph.replay()
    expected = 2 * (2.0 * host_x)
    expected[:8] += 2 * host_x[:8]
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6, err_msg=f"seed={seed}")
    graph.update_kernel_args(1, a=-1.0)
    graph.update_kernel_args(0, 4, 0.0, x, y)
    before = y.numpy()
    graph.replay()
    after = before.copy()
    after[:8] -= host_x[:8]
    np.testing.assert_allclose(y.numpy(), after, rtol=1e-6, err_msg=f"seed={seed}")
    assert "launch" not in vars(dev), "the capture must restore the device's launch"


def test_events_measure_host_time():
    dev = FakeHostDevice()
    start, end = Event(dev), Event(dev)
    start.record()
    time.sleep(0.01)
    end.record(Stream(dev))
    assert 5.0 <= start.elapsed_ms(end) == Event.elapsed(start, end) < 1000.0
    Stream(dev).synchronize()
