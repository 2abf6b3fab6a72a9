"""Small all-reduces without NCCL: each rank's GPU reads its peers' buffers over NVLink
(stdlib_kernels.peer_allreduce, the protocol and its memory-ordering argument).

Input: a rank's NCCL communicator (for everything else, and to exchange the handles), its
device, and the largest all-reduce to take this path (`max_bytes`). Output:
`PeerAllReduce`, a `Communicator` whose `all_reduce_sum` launches the one-shot kernel for an
f32 tensor of at most `max_bytes` (one launch, captured into a decode graph like any kernel)
and hands anything larger, or of another dtype, to NCCL.

Each rank allocates one buffer (`PeerLayout`: flags, then two data slots), exports it with
cuIpcGetMemHandle (64 bytes), and the ranks all-gather the handles and a host id through NCCL.
Every rank opens the others' handles (cuIpcOpenMemHandle, peer access enabled lazily: it works
with one visible GPU per process); if any rank is on another host or cannot open a peer's
handle, all ranks agree to stay on NCCL. No NVLink multicast object is ever made.

`LocalPeerGroup` is the CPU target's version for tests: N ranks in one process (threads, like
`LocalGroup`), host-memory buffers, and one launch of `allreduce_ranks` that runs all N
ranks' blocks interleaved at their spin waits (the CPU device runs launches from several
threads concurrently, but reports a spin wait on another launch that starts late as a
deadlock), on the same per-rank flags, epochs and slots that live across calls.
"""
from __future__ import annotations

import ctypes
import socket
from dataclasses import dataclass

import numpy as np

from llm.parallel.communicator import Communicator, LocalCommunicator, LocalGroup, host_view

BLOCK = 256            # threads per block of the one-shot kernel
BLOCKS = 16            # its fixed grid: every rank and every call (per-block epochs)
HANDLE_BYTES = 64      # sizeof(CUipcMemHandle)
HOST_ID_BYTES = 64


@dataclass(frozen=True)
class PeerLayout:
    """One rank's buffer: flags (blocks * world u32, padded to 256 B), then two slots of cap
    f32 each. cap: the most values one call may reduce."""
    world: int
    cap: int
    blocks: int = BLOCKS

    def __post_init__(self):
        from stdlib_kernels.peer_allreduce import MAX_WORLD
        if not 2 <= self.world <= MAX_WORLD:
            raise ValueError(f"the peer all-reduce takes 2..{MAX_WORLD} ranks, got {self.world}")
        if self.cap < 1 or self.blocks < 1:
            raise ValueError(f"cap and blocks must be >= 1, got {self.cap}, {self.blocks}")

    @property
    def flag_bytes(self) -> int:
        return -(-self.blocks * self.world * 4 // 256) * 256

    @property
    def nbytes(self) -> int:
        return self.flag_bytes + 2 * self.cap * 4

    @classmethod
    def for_bytes(cls, world: int, max_bytes: int, blocks: int = BLOCKS) -> PeerLayout:
        return cls(world, max(1, max_bytes // 4), blocks)


def padded(table: list) -> list:
    """A per-rank pointer table padded to MAX_WORLD parameters with rank 0's entry (never
    read: the kernels' W is a compile-time value)."""
    from stdlib_kernels.peer_allreduce import MAX_WORLD
    return [*table, *[table[0]] * (MAX_WORLD - len(table))]


class DevicePointer:
    """A peer's mapped buffer as a kernel argument (__cuda_array_interface__)."""

    def __init__(self, ptr: int, count: int, typestr: str):
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": typestr,
                                         "data": (ptr, False), "strides": None, "version": 3}


def host_id() -> bytes:
    """This host's identity (boot id, else host name), padded: handles mean nothing elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            ident = f.read().strip()
    except OSError:
        ident = socket.gethostname().encode()
    return ident[:HOST_ID_BYTES].ljust(HOST_ID_BYTES, b"\0")


class PeerAllReduce(Communicator):
    """`inner` (NCCL) plus the one-shot kernel for f32 tensors of at most layout.cap values.
    Built by `open_peer_allreduce` (collective), which returns `inner` itself when a peer is
    unreachable."""

    def __init__(self, inner: Communicator, layout: PeerLayout, own, datas, flags, opened):
        self.inner, self.layout = inner, layout
        self.rank, self.world_size = inner.rank, inner.world_size
        self._own, self._datas, self._flags, self._opened = own, datas, flags, opened
        import pykernel as pk
        self._epochs = pk.zeros(layout.blocks, np.uint32, own.device)

    def takes(self, x) -> bool:
        return (getattr(x, "dtype", None) == np.float32 and x.size <= self.layout.cap
                and getattr(getattr(x, "device", None), "kind", None) == "cuda")

    def all_reduce_sum(self, x, stream=None):
        """The one-shot kernel on the launch stream (the one `stream` names in the kernels
        backend), or NCCL for what it does not take."""
        if not self.takes(x):
            return self.inner.all_reduce_sum(x, stream=stream)
        from stdlib_kernels.peer_allreduce import allreduce_oneshot
        lay = self.layout
        datas, flags, rank = self._datas, self._flags, self.rank
        allreduce_oneshot[lay.blocks, BLOCK](
            x, datas[rank], *padded(datas), flags[rank], *padded(flags), self._epochs,
            x.size, lay.cap, rank, W=self.world_size, BLOCK=BLOCK)
        return x

    def all_gather_host(self, x: np.ndarray) -> list[np.ndarray]:
        return self.inner.all_gather_host(x)

    def close(self) -> None:
        from cuda.bindings import driver as cu
        for ptr in self._opened:
            cu.cuIpcCloseMemHandle(ptr)
        self._opened = []
        self.inner.close()


def open_peer_allreduce(inner: Communicator, device, max_bytes: int,
                        blocks: int = BLOCKS) -> Communicator:
    """Collective over `inner`'s ranks (every rank calls it): a PeerAllReduce when every rank
    is on this host and opens every peer's buffer, else `inner` on every rank."""
    from cuda.bindings import driver as cu

    import pykernel as pk
    layout = PeerLayout.for_bytes(inner.world_size, max_bytes, blocks)
    own = pk.zeros(layout.nbytes, np.uint8, device)      # cuMemAlloc: exportable
    pk.synchronize(device)                               # zeroed before any peer writes
    err, handle = cu.cuIpcGetMemHandle(own.ptr)
    mine = np.frombuffer(host_id() + (_handle_bytes(handle) if not err else
                                      bytes(HANDLE_BYTES)), np.uint8)
    rows = inner.all_gather_host(mine)
    same_host = all(bytes(r[:HOST_ID_BYTES]) == host_id() for r in rows)
    bases, opened = [], []
    for rank, row in enumerate(rows):
        if rank == inner.rank or not same_host:
            bases.append(own.ptr)
            continue
        ptr = _open_handle(bytes(row[HOST_ID_BYTES:]))
        if ptr is not None:
            opened.append(ptr)
        bases.append(ptr)
    ok = np.array([int(same_host and not err and None not in bases)], np.uint8)
    if not all(int(r[0]) for r in inner.all_gather_host(ok)):
        for ptr in opened:
            cu.cuIpcCloseMemHandle(ptr)
        return inner
    datas = [DevicePointer(b + layout.flag_bytes, 2 * layout.cap, "<f4") for b in bases]
    flags = [DevicePointer(b, layout.flag_bytes // 4, "<u4") for b in bases]
    datas[inner.rank] = own[layout.flag_bytes:].view(np.float32)
    flags[inner.rank] = own[:layout.flag_bytes].view(np.uint32)
    return PeerAllReduce(inner, layout, own, datas, flags, opened)


def _handle_bytes(handle) -> bytes:
    return ctypes.string_at(handle.getPtr(), HANDLE_BYTES)


def _open_handle(data: bytes):
    """A peer's buffer mapped here (device pointer), or None when the driver refuses."""
    from cuda.bindings import driver as cu
    handle = cu.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), data, HANDLE_BYTES)
    err, ptr = cu.cuIpcOpenMemHandle(
        handle, cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    return None if err else int(ptr)


class LocalPeerGroup(LocalGroup):
    """N ranks in one process (the CPU target) whose all-reduces of at most `max_bytes` of f32
    go through the one-shot protocol: per-rank host buffers, flags and epochs that live across
    calls, all ranks' blocks in one launch of `allreduce_ranks` (made by rank 0 once every
    rank has posted its partial)."""

    def __init__(self, world_size: int, max_bytes: int, blocks: int = BLOCKS):
        super().__init__(world_size)
        self.layout = lay = PeerLayout.for_bytes(world_size, max_bytes, blocks)
        # slots poisoned: a read of a slot this call did not write shows as NaN
        self.datas = [np.full(2 * lay.cap, np.nan, np.float32) for _ in range(world_size)]
        self.flags = [np.zeros(lay.flag_bytes // 4, np.uint32) for _ in range(world_size)]
        self.epochs = np.zeros((world_size, lay.blocks), np.uint32)
        self._sums = None
        self.launches = 0        # one per all-reduce that took the one-shot kernel

    def communicators(self) -> list[LocalPeerCommunicator]:
        return [LocalPeerCommunicator(self, r) for r in range(self.world_size)]

    def reduce(self, rank: int, values: np.ndarray) -> np.ndarray:
        """Rank `rank`'s result of the one-shot all-reduce of every rank's `values` (f32,
        1-D, the same size on every rank)."""
        self._slots[rank] = values
        self.wait()
        if rank == 0:
            self._sums = self.launch(np.stack(self._slots))
        self.wait()
        return self._sums[rank].copy()

    def launch(self, xs: np.ndarray) -> np.ndarray:
        """xs (world, n) f32 -> each rank's sums, through one launch of all ranks' blocks."""
        import pykernel as pk
        from stdlib_kernels.peer_allreduce import allreduce_ranks
        if pk.current_device().kind != "cpu":
            raise RuntimeError("LocalPeerGroup runs the one-shot kernel on the CPU target: "
                               "pk.set_device('cpu') first")
        lay, xs = self.layout, np.ascontiguousarray(xs, np.float32)
        allreduce_ranks[(lay.blocks, self.world_size), BLOCK](
            xs, *padded(self.datas), *padded(self.flags), self.epochs, xs.shape[1], lay.cap,
            W=self.world_size, BLOCK=BLOCK)
        self.launches += 1
        return xs


class LocalPeerCommunicator(LocalCommunicator):
    def all_reduce_sum(self, x, stream=None):
        host, write_back = host_view(x)
        if host.dtype != np.float32 or host.size > self.group.layout.cap:
            return super().all_reduce_sum(x, stream)
        total = self.group.reduce(self.rank, host.reshape(-1).copy()).reshape(host.shape)
        if write_back is None:
            host[...] = total
        else:
            write_back(total)
        return x
