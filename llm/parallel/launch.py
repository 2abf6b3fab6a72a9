"""One process per GPU: the rank environment, the rendezvous, the worker processes, and rank
0's view of them.

Input: the torchrun-style environment of each process (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), or nothing, in which case rank 0 (the process that called
`llm.load(..., tp=N)` on "cuda") starts ranks 1..N-1 on this host itself (`spawn_workers`).
Output: `ProcessRanks`, the `ranks` object of `llm.parallel.model` for rank 0: it sends each
command to the workers over its control sockets (one JSON line each), runs it on its own rank,
and gathers the logits shards through NCCL. Workers (`llm.parallel.worker`) loop on the same
commands.

The rendezvous: rank 0 listens on MASTER_ADDR:MASTER_PORT; each worker connects, sends its rank,
and receives the NCCL unique id (the bytes of ncclGetUniqueId, how NCCL's docs say to share it:
any out-of-band channel). The same sockets then carry the commands. Several hosts use the same
path: the user starts each host's processes with its environment (docs/runner.md, "Several
GPUs").
"""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from llm.parallel.plan import ShardPlan
from llm.parallel.ranks import COLLECTIVE_OPS, RankRunner, Ranks, join_logits

CONNECT_TIMEOUT_S = 300.0     # a rank waits this long for the others to start (imports, CUDA)


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ=None) -> RankEnv | None:
        """The torchrun-style variables, or None when RANK is unset (a single-host launch)."""
        env = os.environ if environ is None else environ
        if "RANK" not in env:
            return None
        try:
            return cls(int(env["RANK"]), int(env["WORLD_SIZE"]),
                       int(env.get("LOCAL_RANK", env["RANK"])),
                       env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500")))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"tensor parallelism: RANK is set, so WORLD_SIZE, MASTER_ADDR and "
                             f"MASTER_PORT must be too (integers where numbers): {exc}") from None


class Channel:
    """Length-prefixed messages over one socket: JSON commands, raw id bytes."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(struct.pack("<I", len(data)) + data)

    def recv_bytes(self) -> bytes:
        (n,) = struct.unpack("<I", self._exactly(4))
        return self._exactly(n)

    def send(self, obj) -> None:
        self.send_bytes(json.dumps(obj).encode())

    def recv(self):
        return json.loads(self.recv_bytes())

    def _exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(left)
            if not chunk:
                raise ConnectionError("tensor-parallel control socket closed by the other rank")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_rendezvous(env: RankEnv, unique_id: bytes, timeout: float = CONNECT_TIMEOUT_S):
    """Rank 0: accept the other ranks, send each the unique id; their channels by rank."""
    server = socket.create_server((env.master_addr, env.master_port))
    server.settimeout(timeout)
    channels: dict[int, Channel] = {}
    with server:
        while len(channels) < env.world_size - 1:
            sock, _ = server.accept()
            sock.settimeout(None)
            ch = Channel(sock)
            (rank,) = struct.unpack("<I", ch.recv_bytes())
            if not 0 < rank < env.world_size or rank in channels:
                raise RuntimeError(f"tensor parallelism: a process joined as rank {rank} "
                                   f"(expected each of 1..{env.world_size - 1} once)")
            ch.send_bytes(unique_id)
            channels[rank] = ch
    return [channels[r] for r in sorted(channels)]


def join_rendezvous(env: RankEnv, timeout: float = CONNECT_TIMEOUT_S) -> tuple[Channel, bytes]:
    """A worker: connect to rank 0 (retrying while it starts), send our rank; (channel, id)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((env.master_addr, env.master_port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {env.rank}: no rank 0 at {env.master_addr}:"
                                   f"{env.master_port} after {timeout:.0f} s") from None
            time.sleep(0.2)
    sock.settimeout(None)
    ch = Channel(sock)
    ch.send_bytes(struct.pack("<I", env.rank))
    return ch, ch.recv_bytes()


def spawn_workers(world_size: int, port: int) -> list:
    """Ranks 1..N-1 on this host: `python -m llm.parallel.worker` with their environment (the
    worker narrows CUDA_VISIBLE_DEVICES to its LOCAL_RANK-th GPU itself)."""
    procs = []
    for rank in range(1, world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size),
                   LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "llm.parallel.worker"], env=env))
    return procs


def watch_workers(procs) -> None:
    """A thread per started worker: one that fails ends this process too (rank 0 would
    otherwise wait for it in NCCL forever), after saying which rank and its exit code."""
    def watch(rank: int, proc) -> None:
        code = proc.wait()
        if code != 0:
            print(f"pykernel: error: tensor-parallel rank {rank} exited with code {code}; "
                  f"stopping", file=sys.stderr, flush=True)
            os._exit(1)
    for rank, proc in enumerate(procs, start=1):
        threading.Thread(target=watch, args=(rank, proc), daemon=True).start()


def visible_device(local_rank: int, environ) -> str:
    """The CUDA_VISIBLE_DEVICES value that leaves a rank its own GPU: the LOCAL_RANK-th entry
    of the current list (or the index itself when none is set)."""
    current = environ.get("CUDA_VISIBLE_DEVICES")
    if not current:
        return str(local_rank)
    entries = [e.strip() for e in current.split(",") if e.strip()]
    if local_rank >= len(entries):
        raise ValueError(f"LOCAL_RANK={local_rank}, but CUDA_VISIBLE_DEVICES={current!r} lists "
                         f"{len(entries)} device(s)")
    return entries[local_rank]



class ProcessRanks(Ranks):
    """Rank 0's handle on all ranks: its own RankRunner plus the workers' channels."""

    def __init__(self, runner: RankRunner, channels: list[Channel], comm, plan: ShardPlan,
                 procs=()):
        super().__init__()
        self.runner, self.channels, self.comm, self.plan = runner, channels, comm, plan
        self.procs = list(procs)

    def run_on_ranks(self, cmd: dict):
        for ch in self.channels:
            ch.send(cmd)
        out = self.runner.run(cmd)
        if cmd["op"] not in COLLECTIVE_OPS:
            return None
        return join_logits(self.comm.all_gather_host(out), self.plan, cmd)

    def close(self) -> None:
        """Stop the workers, free this rank's communicator while they free theirs (NCCL's
        destroy is collective between the ranks of a host: waiting for the workers to exit
        first would wait for ever), then wait for the ones this process started."""
        for ch in self.channels:
            try:
                ch.send({"op": "stop"})
            except OSError:
                pass
        self.runner.close()
        for p in self.procs:
            p.wait(timeout=60)
