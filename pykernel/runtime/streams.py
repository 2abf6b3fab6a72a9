"""Streams and events for either device.

cuda: a Stream is a cuda.core stream created *blocking* (it orders with the legacy default
stream that pykernel's copies use, so `x.numpy()` after a launch on any pykernel stream sees
the result); an Event is a timing-enabled cuda.core event.
cpu: launches run synchronously, so a Stream only carries identity and an Event records the
host clock when recorded.

Input: the device (default: current). Output: objects with .synchronize(), .record(),
elapsed times in milliseconds.
"""
from __future__ import annotations

import time

from .device import get_device


class Stream:
    """An ordered queue of launches (`kernel[grid, block, stream](...)`)."""

    def __init__(self, device=None):
        self.device = get_device(device)
        self._core = None
        self._launch_handle = None  # what CudaDevice.launch passes to cuLaunchKernel
        if self.device.kind == "cuda":
            from cuda.core import StreamOptions
            self._core = self.device.core.create_stream(options=StreamOptions(nonblocking=False))
            self._launch_handle = self._core.handle

    @property
    def handle(self) -> int:
        """The raw CUstream as an int (0 on cpu)."""
        return int(self._core.handle) if self._core is not None else 0

    def __cuda_stream__(self) -> tuple[int, int]:
        if self._core is None:
            raise AttributeError("__cuda_stream__ exists on cuda streams only")
        return 0, int(self._core.handle)

    def synchronize(self) -> None:
        """Wait for this stream's work; a failed kernel raises here, with its name."""
        if self._core is not None:
            self.device.synchronize_stream(self._core.handle)

    def wait(self, event: "Event") -> None:
        """Later work on this stream waits for `event` (cross-stream ordering)."""
        if self._core is not None:
            self._core.wait(event._core)

    def __repr__(self) -> str:
        return f"Stream({self.device.kind}, handle=0x{self.handle:x})"


class Event:
    """A point in a stream; two recorded events give the time between them."""

    def __init__(self, device=None):
        self.device = get_device(device)
        self._core = None
        self._host_time = None
        if self.device.kind == "cuda":
            from cuda.core import EventOptions
            self._core = self.device.core.create_event(EventOptions(timing_enabled=True))

    def record(self, stream: Stream | None = None) -> "Event":
        if self._core is None:
            self._host_time = time.perf_counter()
            return self
        from cuda.bindings import driver as cu

        from .cuda import check
        handle = self.device._launch_handle if stream is None else stream._launch_handle
        check(cu.cuEventRecord(self._core.handle, handle), "cuEventRecord")
        return self

    def synchronize(self) -> None:
        if self._core is not None:
            self._core.sync()

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end` (waits for `end`)."""
        return Event.elapsed(self, end)

    @staticmethod
    def elapsed(start: "Event", end: "Event") -> float:
        if start._core is None:
            if start._host_time is None or end._host_time is None:
                raise RuntimeError("Event.elapsed: both events must be recorded first")
            return (end._host_time - start._host_time) * 1e3
        from cuda.bindings import driver as cu

        from .cuda import check
        end.synchronize()
        return float(check(cu.cuEventElapsedTime(start._core.handle, end._core.handle),
                           "cuEventElapsedTime (were both events recorded?)"))
