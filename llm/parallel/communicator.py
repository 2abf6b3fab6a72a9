"""Collectives between tensor-parallel ranks: the interface and the in-process group.

Input: each rank's partial results (backend activations: numpy arrays on the numpy backend,
pykernel arrays on the kernels backend). Output: the same buffers holding the sum over ranks
(`all_reduce_sum`), or every rank's host array (`all_gather_host`, for logits shards and
argmax candidates).

`LocalGroup(n)` is N ranks in one process, each rank's forward in its own thread: the CPU CI
path. Ranks take turns (one runs at a time, the others wait in a collective), because the CPU
target's launches and the BLAS thread setting are process-wide; a rank gives up its turn only
inside a collective. Every rank adds the partials itself in rank order 0, 1, ..., N-1, so all
ranks hold bit-identical sums (their residual streams never drift apart). NCCL's communicator is
`llm.parallel.nccl_comm.NcclCommunicator`.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

COLLECTIVE_TIMEOUT_S = 600.0   # a rank that never arrives (it died) breaks the group's wait


class Communicator(ABC):
    rank: int
    world_size: int

    @abstractmethod
    def all_reduce_sum(self, x, stream=None):
        """x (a backend activation) summed over ranks, in place; returns x."""

    @abstractmethod
    def all_gather_host(self, x: np.ndarray) -> list[np.ndarray]:
        """Every rank's x (same shape and dtype on every rank), in rank order."""

    def close(self) -> None:
        """Release the communicator's resources (nothing for an in-process group)."""


def host_view(x) -> tuple[np.ndarray, Callable | None]:
    """(float array holding x's values, a function writing values back into x or None when the
    array is x itself): numpy arrays in place; CPU-target pykernel arrays by copy."""
    if isinstance(x, np.ndarray):
        return x, None
    if hasattr(x, "numpy") and hasattr(x, "copy_from"):
        return x.numpy(), x.copy_from
    raise TypeError(f"LocalGroup cannot reduce a {type(x).__name__} (numpy arrays and CPU-target "
                    f"pykernel arrays only)")


class LocalGroup:
    """N ranks in one process; `communicators()` gives each rank's `LocalCommunicator`, `run`
    calls one function per rank in their own threads and returns their results."""

    def __init__(self, world_size: int):
        if world_size < 1:
            raise ValueError(f"a group needs at least one rank, got {world_size}")
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=COLLECTIVE_TIMEOUT_S)
        self._turn = threading.Lock()
        self._slots: list = [None] * world_size

    def communicators(self) -> list[LocalCommunicator]:
        return [LocalCommunicator(self, r) for r in range(self.world_size)]

    def wait(self) -> None:
        """All ranks reach this point; the caller's turn is handed on while it waits."""
        self._turn.release()
        try:
            self._barrier.wait()
        finally:
            self._turn.acquire()

    def exchange(self, rank: int, value) -> list:
        """Every rank's `value`, in rank order (two waits: all posted, then all read)."""
        self._slots[rank] = value
        self.wait()
        values = list(self._slots)
        self.wait()
        return values

    def run(self, calls: Sequence[Callable[[], object]]) -> list:
        """calls[r]() on rank r's thread, all together; their results, or the first error (the
        other ranks' waits are broken so that none hangs)."""
        if len(calls) != self.world_size:
            raise ValueError(f"{len(calls)} calls for a group of {self.world_size} ranks")
        results, errors = [None] * self.world_size, [None] * self.world_size

        def rank_body(r: int) -> None:
            with self._turn:
                try:
                    results[r] = calls[r]()
                except BaseException as exc:   # noqa: BLE001 (re-raised by the caller)
                    errors[r] = exc
                    self._barrier.abort()

        threads = [threading.Thread(target=rank_body, args=(r,), name=f"tp-rank-{r}")
                   for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._barrier.broken:
            self._barrier.reset()
        first = next((e for e in errors if e is not None and
                      not isinstance(e, threading.BrokenBarrierError)), None)
        first = first or next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return results


class LocalCommunicator(Communicator):
    def __init__(self, group: LocalGroup, rank: int):
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce_sum(self, x, stream=None):
        host, write_back = host_view(x)
        parts = self.group.exchange(self.rank, host.copy())
        total = parts[0]
        for part in parts[1:]:      # rank order: every rank adds in the same order
            total = total + part
        if write_back is None:
            host[...] = total
        else:
            write_back(np.ascontiguousarray(total, dtype=host.dtype))
        return x

    def all_gather_host(self, x: np.ndarray) -> list[np.ndarray]:
        parts = self.group.exchange(self.rank, np.array(x, copy=True))
        if any(p.shape != parts[0].shape or p.dtype != parts[0].dtype for p in parts):
            raise ValueError(f"all_gather_host: ranks gave {[p.shape for p in parts]} "
                             f"(same shape and dtype expected)")
        return parts
