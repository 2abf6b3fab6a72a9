"""The CPU device: runs kernels compiled by the CPU target (targets/cpu.py) on host threads.
Blocks of the grid are split between worker threads (ctypes releases the GIL during the call);
each worker has its own context (shared memory, warp-exchange slots, coroutine handles, error
record). Errors found by the generated code (out-of-bounds access, divergent barriers, failed
asserts) are raised as KernelRuntimeError naming the kernel and the source line.

Launches from several Python threads run concurrently, each on a launch context set of its
own (the workers' contexts and a copy of the packed arguments), taken from a free list and
given back when the launch returns; a launch that finds the list empty makes a new set. So a
launch never waits for another one, and two launches never share a context."""
from __future__ import annotations

import ctypes
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import KernelRuntimeError, LaunchError
from ..targets import cpu_abi as abi
from .device import register_device_kind
from .limits import check_geometry
from .packer import ArgPacker

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                          ctypes.c_int64)
# shared memory starts each launch as 0xFF bytes (NaN as f16 / f32 / f64, -1 as integers), as
# undefined as a GPU's: a kernel that reads shared memory it did not write gets poison, not
# zeros or the previous kernel's values, so the tests see it (PYKERNEL_CPU_POISON_SHARED=0:
# left as the previous launch left it)
POISON_SHARED = os.environ.get("PYKERNEL_CPU_POISON_SHARED", "1") not in ("", "0")


class _Worker:
    """One worker thread's launch context and buffers (grown on demand, reused)."""

    def __init__(self):
        self.ctx = np.zeros(abi.CTX_SLOTS, np.int64)
        self.scratch = np.zeros(64, np.uint8)
        self.buffers = {}

    def buffer(self, name, nbytes):
        buf = self.buffers.get(name)
        if buf is None or buf.nbytes < nbytes:
            buf = np.zeros(max(nbytes, 64), np.uint8)
            self.buffers[name] = buf
        return buf.ctypes.data


class _LaunchContexts:
    """What one launch in flight owns: a context per worker and its packed arguments."""

    def __init__(self, workers_n: int):
        self.workers = [_Worker() for _ in range(workers_n)]
        self.args = np.zeros(64, np.uint8)

    def copy_args(self, address: int, nbytes: int) -> int:
        """The packer's buffer, copied here (64-byte aligned) before another launch repacks it."""
        if self.args.nbytes < nbytes + 64:
            self.args = np.zeros(nbytes + 64, np.uint8)
        start = self.args.ctypes.data + (-self.args.ctypes.data) % 64
        ctypes.memmove(start, address, nbytes)
        return start


class CpuDevice:
    kind = "cpu"
    arch = "cpu"
    name = "host CPU (pykernel CPU target)"
    ordinal = 0
    programmatic_launch = False     # no PDL on the CPU target: launches are synchronous

    def __init__(self, ordinal: int = 0):
        self.workers_n = max(1, min(int(os.environ.get("PYKERNEL_CPU_THREADS", 0)) or
                                    (os.cpu_count() or 1), 8))
        # launch context sets not in use; list.pop / list.append are atomic, so taking one
        # needs no lock (module docstring)
        self._free_contexts = [_LaunchContexts(self.workers_n)]
        self._pool = ThreadPoolExecutor(self.workers_n) if self.workers_n > 1 else None
        self._pack_lock = threading.Lock()       # a packer writes one buffer per kernel
        self._packers = {}
        self._entries = {}

    def __repr__(self):
        return "<pykernel device cpu>"

    def synchronize(self):
        pass  # launches are synchronous on the CPU

    def launch(self, compiled, grid, block, args, stream=None, shared_bytes=0,
               cluster=(1, 1, 1)):
        try:
            own = self._free_contexts.pop()
        except IndexError:                   # every set is in another thread's launch
            own = _LaunchContexts(self.workers_n)
        try:
            args_addr, extents = self._pack(compiled, args, own)
            check_geometry(compiled.name, grid, block, shared_bytes)   # as a GPU would refuse
            self._run(compiled, grid, block, shared_bytes, cluster, own, args_addr, extents)
        finally:
            self._free_contexts.append(own)

    def _pack(self, compiled, args, own):
        """(the launch's own copy of its packed arguments, the pointer extents table)."""
        with self._pack_lock:
            packer = self._packers.get(compiled.cache_key)
            if packer is None:
                packer = ArgPacker(compiled, "cpu", device=self)
                self._packers[compiled.cache_key] = packer
            args_addr = own.copy_args(packer.pack(args), packer.size)
        extents = np.zeros(2 * max(1, len(packer.params)), np.int64)   # per ABI parameter
        for k, ext in enumerate(packer.pointer_extents(args)):
            if ext is not None:
                extents[2 * k], extents[2 * k + 1] = ext
        return args_addr, extents

    def _run(self, compiled, grid, block, shared_bytes, cluster, own, args_addr, extents):
        nthreads = block[0] * block[1] * block[2]
        entry = self._entry(compiled)
        if "print" in compiled.uses:    # the kernel's lines come after what Python printed
            sys.stdout.flush()
            sys.stderr.flush()
        nblocks = grid[0] * grid[1] * grid[2]
        # a kernel whose cluster's blocks must live together runs whole clusters per worker
        together = cluster[0] * cluster[1] * cluster[2] \
            if "cluster_together" in compiled.uses else 1
        # pk.grid_sync, and spin waits (pk.nanosleep yields): the whole grid lives at once
        if "grid_sync" in compiled.uses or "grid_resident" in compiled.uses:
            cluster, together = _grid_as_cluster(compiled, grid, cluster)
        elif "cluster" not in compiled.uses:
            cluster = (1, 1, 1)       # blocks that never look at their cluster are independent
        chunks = self._chunks(nblocks // together, compiled.cpu.coroutine,
                              nthreads * together)
        workers = own.workers[:len(chunks)]
        contexts = [self._prepare(w, compiled, grid, block, shared_bytes, extents, cluster,
                                  together) for w in workers]
        if len(chunks) == 1:
            entry(args_addr, contexts[0], chunks[0][0], chunks[0][1])
        else:
            futures = [self._pool.submit(entry, args_addr, c, lo, hi)
                       for c, (lo, hi) in zip(contexts, chunks)]
            for f in futures:
                f.result()
        for w in workers:
            if w.ctx[abi.ERROR_CODE]:
                raise self._error(compiled, w.ctx)

    def occupancy(self, compiled, threads: int, shared_bytes: int) -> tuple[int, int]:
        """(1, worker threads): the CPU target's answer to an occupancy query
        (runtime/occupancy.py). Any grid runs here, and one whose blocks wait on each other
        (pk.grid_sync, spin waits with pk.nanosleep) runs as one cluster of coroutines, so the
        number is the grid that gives each host worker one block, not a limit."""
        return 1, self.workers_n

    def _entry(self, compiled):
        fn = self._entries.get(compiled.cache_key)
        if fn is None:
            fn = self._entries[compiled.cache_key] = _ENTRY(compiled.cpu.address)
        return fn

    def _chunks(self, nblocks, coroutine, nthreads):
        work = nblocks * nthreads * (20 if coroutine else 1)
        n = self.workers_n if work >= 20000 else 1
        n = min(n, nblocks)
        step = -(-nblocks // n)
        return [(lo, min(nblocks, lo + step)) for lo in range(0, nblocks, step)]

    def _prepare(self, w, compiled, grid, block, dyn_bytes, extents, cluster, together):
        nthreads = block[0] * block[1] * block[2] * together
        dyn = (int(dyn_bytes) + 15) // 16 * 16
        stride = (dyn + compiled.cpu.shared_bytes + 16 + 15) // 16 * 16
        c = w.ctx
        c[:] = 0
        c[abi.GRID:abi.GRID + 3] = grid
        c[abi.BLOCK:abi.BLOCK + 3] = block
        c[abi.CLUSTER:abi.CLUSTER + 3] = cluster
        c[abi.SHARED_STRIDE] = stride
        c[abi.SHARED_PTR] = w.buffer("shared", stride * together)
        if POISON_SHARED:
            w.buffers["shared"][:stride * together] = 0xFF
        c[abi.DYN_BYTES] = dyn
        c[abi.SCRATCH_PTR] = w.scratch.ctypes.data
        w.extents = extents
        c[abi.EXTENTS_PTR] = extents.ctypes.data
        c[abi.EXCHANGE_PTR] = w.buffer("exchange", 2 * 16 * 8 * nthreads)
        c[abi.STATE_PTR] = w.buffer("state", 4 * nthreads)
        c[abi.HANDLES_PTR] = w.buffer("handles", 8 * nthreads)
        return c.ctypes.data

    def _error(self, compiled, ctx) -> KernelRuntimeError:
        code, site = int(ctx[abi.ERROR_CODE]), int(ctx[abi.ERROR_SITE])
        what = abi.ERRORS.get(code, f"error {code}")
        where = compiled.sites[site].describe() if 0 <= site < len(compiled.sites) else ""
        detail = ""
        if code == 1:
            detail = (f" (byte offset {int(ctx[abi.ERROR_VALUE])} from the start of the array, "
                      f"thread {int(ctx[abi.ERROR_THREAD])} of block {int(ctx[abi.ERROR_BLOCK])})")
        elif code == 10:
            detail = (f" (index {int(ctx[abi.ERROR_VALUE])}, extent {int(ctx[abi.ERROR_EXTENT])}"
                      f", thread {int(ctx[abi.ERROR_THREAD])} of block "
                      f"{int(ctx[abi.ERROR_BLOCK])})")
        return KernelRuntimeError(f"kernel '{compiled.name}': {what}{detail}\n{where}")

    # memory operations: host memory (arrays.HostMemory is used when absent)
    memory = None


def _grid_as_cluster(compiled, grid, cluster):
    """A kernel with pk.grid_sync or pk.nanosleep runs its grid as one cluster of coroutines
    (one worker): each grid_sync is that cluster's barrier, and a thread in pk.nanosleep
    yields to the other blocks (a spin wait on another block's write cannot deadlock)."""
    if cluster is not None and tuple(cluster) != (1, 1, 1):
        what = "pk.grid_sync()" if "grid_sync" in compiled.uses else "pk.nanosleep()"
        raise LaunchError(f"{compiled.name}: a kernel with {what} cannot be launched "
                          f"with clusters (cluster={tuple(cluster)})")
    return tuple(grid), grid[0] * grid[1] * grid[2]


register_device_kind("cpu", CpuDevice)
