"""pykernel's device runtime: device selection, arrays, streams, events, graphs, launches.

Input: the user's choice of device (or PYKERNEL_DEVICE / GPU detection) and host data.
Output: the public runtime API that pykernel/__init__.py re-exports; `current_device().launch`
is what the kernel launcher calls. See docs/runtime.md.
"""
from .arrays import Array, empty, full, pinned_empty, to_device, zeros
from .device import (current_device, get_device, gpu_available, register_device_kind,
                     set_device, synchronize)
from .graphs import Graph, capture_graph, programmatic_launches
from .streams import Event, Stream

__all__ = ["set_device", "current_device", "get_device", "to_device", "empty", "zeros", "full",
           "pinned_empty", "Array", "Stream", "Event", "capture_graph", "Graph", "synchronize",
           "programmatic_launches",
           "gpu_available",
           "register_device_kind"]
