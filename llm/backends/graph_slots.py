"""A graph captured on one slot of a KV pool, replayed on any other slot of the same pool.

A prompt graph is recorded against one cache: its RoPE / KV-write and attention launches take
that slot's K and V layers as arguments. Capturing the same bucket again for every slot of a
server costs each slot's first prompt an eager run plus a recording (~96 ms per prompt on the
8B model, where the graph replay takes a few; benchmarks/RESULTS.md "Prompts on any slot").
Instead, the launches whose arguments are the slot's layers are re-pointed at another slot's
(`pk.Graph.update_kernel_args`: cuGraphExecKernelNodeSetParams on cuda, the recorded launch
list on the CPU target) before a replay for that slot: a few dozen node updates.

Input: a captured graph and the cache it was recorded on. Output: a `SlotBinding`, or None when
the graph cannot move (it holds pool memory other than whole layer views of its cache, a launch
whose graph node was not identified at capture, or a q8_0 cache): such a graph stays with its
cache. Buffers of the cache outside the pool (split workspaces) stay as captured: they are
scratch that one step fills and reads, and the steps of a pool run in order on one stream.
"""
from __future__ import annotations

import pykernel as pk


class SlotBinding:
    """The launches of one graph that read or write its cache's K / V layers."""

    def __init__(self, refs: dict, cache):
        self.refs = refs          # launch index -> [(parameter, "k" | "v", layer, shape, dtype)]
        self.cache = cache        # the slot the graph's launches point at now

    def bind(self, graph, cache) -> None:
        """Point the graph's cache arguments at `cache` (a slot of the same pool)."""
        if cache is self.cache:
            return
        for index, params in self.refs.items():
            graph.update_kernel_args(index, **{
                name: getattr(cache, kind)[layer].view_as(shape, dtype)
                for name, kind, layer, shape, dtype in params})
        self.cache = cache


def slot_binding(graph, cache) -> SlotBinding | None:
    """The binding of a graph captured on `cache`, or None where it cannot move (above)."""
    if cache.q8:
        return None
    layers = {}               # address -> ("k" | "v", layer, bytes) of the cache's layer views
    for kind in ("k", "v"):
        for layer, array in enumerate(getattr(cache, kind)):
            layers[array.ptr] = (kind, layer, array.nbytes)
    pool = [(a.ptr, a.ptr + a.nbytes) for a in cache.pool.k + cache.pool.v]
    refs: dict = {}
    for index, launch in enumerate(graph.launches):
        for param, arg in zip(launch.params, launch.args):
            if not isinstance(arg, pk.Array):
                continue
            hit = layers.get(arg.ptr)
            if hit is not None and arg.nbytes <= hit[2]:
                refs.setdefault(index, []).append(
                    (param.name, hit[0], hit[1], tuple(arg.shape), arg.dtype))
            elif any(lo < arg.ptr + arg.nbytes and arg.ptr < hi for lo, hi in pool):
                return None
    if graph.device.kind == "cuda" and any(graph.launches[i].node is None for i in refs):
        return None
    return SlotBinding(refs, cache)
