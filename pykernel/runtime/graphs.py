"""Graph capture and replay for either device.

    with pk.capture_graph(stream) as g:     # launches are recorded, not run
        kernel_a[grid, block](...)           # stream=None inside the block means `stream`
        kernel_b[grid, block](...)
    g.replay()                               # runs the recorded launches again
    g.update_kernel_args(1, pos=17)          # new scalar/pointer for launch 1 in later replays

cuda: stream capture through cuda.core's GraphBuilder (relaxed mode) into an executable CUDA
graph; `update_kernel_args` rewrites one kernel node of the instantiated graph
(cuGraphExecKernelNodeSetParams), so a decode step is captured once and replayed per token.
Arguments read from device memory (e.g. a position in a 1-element array) need no update.
cpu: the launches are recorded in a list and replayed by calling the device again.
`capture_graph(stream, pdl=True)` (cuda, sm_90+): kernel-to-kernel edges become programmatic
(PDL): each kernel's blocks start launching while its predecessor drains and wait in their
prologue (`griddepcontrol.wait`) for its results, hiding most of the launch gap.

Input: a Stream (cuda: default a fresh one) and the launches made inside the `with` block.
Output: a Graph with .launches (names, geometry, args), .replay(), .update_kernel_args().
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from .array_args import caller_params
from .device import current_device
from .streams import Stream


@dataclass
class CapturedLaunch:
    name: str
    target: object       # cuda: the device's loaded kernel; cpu: the CompiledKernel
    params: list         # ParamABI list (to address arguments by name)
    grid: tuple
    block: tuple
    shared_bytes: int
    args: tuple          # kept alive: arrays used by the graph cannot be freed under it
    node: object = field(default=None, repr=False)  # cuda: the CUgraphNode
    cluster: tuple = (1, 1, 1)


class Graph:
    """A recorded sequence of launches (see the module docstring)."""

    def __init__(self, device, stream: Stream):
        self.device, self.stream = device, stream
        self.launches: list[CapturedLaunch] = []
        self._builder = None  # cuda: keeps the CUgraph (and its node handles) alive
        self._exec = None

    # called by CudaDevice.launch while capturing
    def record(self, kernel, grid, block, shared_bytes, handle, args, cluster=(1, 1, 1)):
        from cuda.bindings import driver as cu
        result = cu.cuStreamGetCaptureInfo(handle)
        dependencies = next((x for x in result[1:] if isinstance(x, (list, tuple))), None)
        node = dependencies[0] if not result[0] and dependencies and \
            len(dependencies) == 1 else None
        self.launches.append(CapturedLaunch(kernel.name, kernel, kernel.packer.params,
                                            tuple(grid), tuple(block), shared_bytes,
                                            tuple(args), node, tuple(cluster)))

    def replay(self, stream: Stream | None = None) -> None:
        """Run the captured launches (asynchronously on cuda; errors show at synchronize)."""
        if self.device.kind != "cuda":
            for launch in self.launches:
                extra = (launch.cluster,) if launch.cluster != (1, 1, 1) else ()
                self.device.launch(launch.target, launch.grid, launch.block, launch.args,
                                   None, launch.shared_bytes, *extra)
            return
        names = ", ".join(launch.name for launch in self.launches)
        self.device._recent.append(f"graph[{names}]")
        self._exec.launch((stream or self.stream)._core)

    def update_kernel_args(self, index: int, *args, **by_name) -> None:
        """Change the arguments of captured launch `index` for later replays: either all
        runtime arguments positionally, or some by parameter name."""
        launch = self.launches[index]
        values = list(args) if args else list(launch.args)
        names = [p.name for _, p in caller_params(launch.params)]   # pk.Array: one name
        for name, value in by_name.items():
            if name not in names:
                raise TypeError(f"{launch.name}(): no runtime parameter named {name!r} "
                                f"(runtime parameters: {', '.join(names)})")
            values[names.index(name)] = value
        if self.device.kind == "cuda":
            self._set_node_args(launch, values)
        launch.args = tuple(values)

    def _set_node_args(self, launch: CapturedLaunch, values: list) -> None:
        from cuda.bindings import driver as cu

        from .cuda import check
        if launch.node is None:
            raise RuntimeError(f"graph launch {launch.name}: its graph node was not identified "
                               "at capture; pass changing values through device memory")
        kernel = launch.target
        params = cu.CUDA_KERNEL_NODE_PARAMS()
        params.func = kernel.func
        params.gridDimX, params.gridDimY, params.gridDimZ = launch.grid
        params.blockDimX, params.blockDimY, params.blockDimZ = launch.block
        params.sharedMemBytes = launch.shared_bytes
        params.kernelParams = kernel.params_address
        with kernel.lock:   # the shared buffer: the driver copies the values during the call
            kernel.packer.pack(values)
            check(cu.cuGraphExecKernelNodeSetParams(self._exec.handle, launch.node, params),
                  f"updating graph node of {launch.name}")

    def __repr__(self) -> str:
        names = ", ".join(launch.name for launch in self.launches)
        return f"Graph({self.device.kind}, {len(self.launches)} launches: {names})"


@contextmanager
def capture_graph(stream: Stream | None = None, pdl: bool = False):
    """Record the launches of the `with` block into a Graph (see the module docstring)."""
    device = stream.device if stream is not None else current_device()
    stream = stream or Stream(device)
    graph = Graph(device, stream)
    if device.kind == "cuda":
        with _cuda_capture(device, stream, graph, pdl):
            yield graph
    else:
        with _host_capture(device, graph):
            yield graph


def is_capturing(device) -> bool:
    """Whether `device`'s launches are being recorded into a graph (so none of them runs)."""
    if device.kind == "cuda":
        return device._capture is not None
    return "launch" in vars(device)      # _host_capture's recorder shadows the method


@contextmanager
def programmatic_launches(device=None, enabled: bool = True):
    """Eager launches in the `with` block use PDL as a `capture_graph(pdl=True)` would: kernels
    compiled with PDL support go through cuLaunchKernelEx with programmatic stream
    serialization, and libraries that pick kernel variants by `device.programmatic_launch`
    pick the PDL ones. So the eager run that precedes a PDL capture runs (and compiles) the
    kernels the graph will hold. No-op on other devices, or when `enabled` is False."""
    device = device or current_device()
    if device.kind != "cuda" or not enabled:
        yield
        return
    if device._capture is not None:
        raise RuntimeError("programmatic_launches: a capture is in progress on this device "
                           "(capture_graph(pdl=...) sets the mode for its launches)")
    saved, device.programmatic_launch = device.programmatic_launch, True
    try:
        yield
    finally:
        device.programmatic_launch = saved


@contextmanager
def _cuda_capture(device, stream: Stream, graph: Graph, pdl: bool):
    if device._capture is not None:
        raise RuntimeError("capture_graph: a capture is already in progress on this device")
    builder = stream._core.create_graph_builder()
    builder.begin_building("relaxed")
    capture_handle = builder.stream.handle
    saved = device._launch_handle, stream._launch_handle
    device._launch_handle = stream._launch_handle = capture_handle
    device._capture = graph
    device.programmatic_launch = pdl
    try:
        yield graph
    finally:
        device._launch_handle, stream._launch_handle = saved
        device._capture = None
        device.programmatic_launch = False
        builder.end_building()  # also on error: leaves the stream out of capture mode
    graph._builder = builder
    graph._exec = builder.complete()


@contextmanager
def _host_capture(device, graph: Graph):
    """Shadow the device's bound `launch` with a recorder for the duration of the block."""
    def record(compiled, grid, block, args, stream=None, shared_bytes=0, cluster=(1, 1, 1)):
        graph.launches.append(CapturedLaunch(compiled.name, compiled, list(compiled.params),
                                             tuple(grid), tuple(block), shared_bytes,
                                             tuple(args), cluster=tuple(cluster)))
    if "launch" in vars(device):
        raise RuntimeError("capture_graph: a capture is already in progress on this device")
    device.launch = record
    try:
        yield graph
    finally:
        del device.launch
