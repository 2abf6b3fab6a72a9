"""NCCL between GPU ranks (one process per GPU), through NVIDIA's nccl4py (`nccl.core`).

Input: this process's `RankEnv` (rank, world size, local GPU, the rendezvous address) and the
NCCL unique id that rank 0 made and sent over the control socket (`llm.parallel.launch`).
Output: `NcclCommunicator`, whose `all_reduce_sum` is an in-place ncclAllReduce of a pykernel
CUDA array on the backend's stream (so it is captured into a CUDA graph like a kernel launch)
and whose `all_gather_host` stages host arrays through device buffers.

nccl4py is imported when a communicator is made, never at import: CPU-only installs run
without it. NVLink multicast (NVLS, which calls cuMulticastCreate) must stay off on the shared
test machines, so NCCL_NVLS_ENABLE=0 is set before NCCL initialises, whatever the caller's
environment says.
"""
from __future__ import annotations

import os

import numpy as np

from llm.parallel.communicator import Communicator

INSTALL_HINT = ("tensor parallelism on GPUs needs nccl4py: pip install 'nccl4py[cu13]' "
                "(libnccl comes from the nvidia-nccl-cu13 wheel)")


def nccl_core():
    """The nccl.core module, or RuntimeError saying how to install it."""
    try:
        import nccl.core as nccl
    except ImportError as exc:
        raise RuntimeError(f"{INSTALL_HINT} ({exc})") from None
    return nccl


def new_unique_id() -> bytes:
    """A fresh NCCL unique id (rank 0 makes it; the others receive its bytes)."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    return bytes(nccl_core().get_unique_id().as_bytes)


class NcclCommunicator(Communicator):
    """One rank of an NCCL communicator on the current CUDA device (pykernel's device for
    this rank must be set before: NCCL binds the communicator to the current context)."""

    def __init__(self, rank: int, world_size: int, unique_id: bytes, device):
        os.environ["NCCL_NVLS_ENABLE"] = "0"      # before init: NCCL reads it there
        nccl = nccl_core()
        self._nccl, self.rank, self.world_size, self.device = nccl, rank, world_size, device
        self.comm = nccl.Communicator.init(world_size, rank, nccl.UniqueId.from_bytes(unique_id))

    def all_reduce_sum(self, x, stream=None):
        self.comm.allreduce(x, x, self._nccl.SUM, stream=_stream_arg(stream))
        return x

    def all_gather_host(self, x: np.ndarray) -> list[np.ndarray]:
        import pykernel as pk
        host = np.ascontiguousarray(x)
        send = pk.to_device(host, device=self.device)
        recv = pk.empty((self.world_size,) + host.shape, host.dtype, self.device)
        self.comm.allgather(send, recv, stream=0)
        pk.synchronize(self.device)
        return list(recv.numpy())

    def close(self) -> None:
        self.comm.destroy()


def _stream_arg(stream):
    """nccl4py's stream argument: a pykernel Stream (it has __cuda_stream__) or 0."""
    return 0 if stream is None else stream
