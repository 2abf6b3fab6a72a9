"""A GPU rank other than 0: `python -m llm.parallel.worker` with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT in its environment (set by `launch.spawn_workers` on one host, by the
user on several).

Input: rank 0's messages on the control socket: the NCCL unique id, then a setup (model path,
backend options, as rank 0 loaded them), then commands. Output: nothing but its part of every
collective; it exits on "stop" or when rank 0's socket closes.
"""
from __future__ import annotations

import contextlib
import os
import sys

from llm.parallel.launch import RankEnv, join_rendezvous, visible_device


def main() -> int:
    env = RankEnv.from_environ()
    if env is None or env.rank == 0:
        print("llm.parallel.worker runs ranks 1.. of a tensor-parallel group: set RANK, "
              "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (rank 0 is the process "
              "that runs `pykernel run --tp N ...`)", file=sys.stderr)
        return 2
    # before anything starts CUDA: this process's GPU is the LOCAL_RANK-th visible one
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_device(env.local_rank, os.environ)
    from llm.parallel.gpu import build_rank
    channel, unique_id = join_rendezvous(env)
    setup = channel.recv()
    runner = build_rank(env, unique_id, setup)
    if serve_commands(channel, runner):
        runner.close()      # with rank 0's (ProcessRanks.close): NCCL frees it collectively
    return 0


def serve_commands(channel, runner, turn=contextlib.nullcontext) -> bool:
    """Run rank 0's commands until "stop" (True) or a closed socket (False: rank 0 is gone,
    no collective can finish); a forward's logits go back through the gather rank 0 makes
    (ProcessRanks.command). `turn()` is held while a command runs (an in-process test's
    LocalGroup turn)."""
    while True:
        try:
            cmd = channel.recv()
        except ConnectionError:
            return False
        if cmd["op"] == "stop":
            return True
        with turn():
            out = runner.run(cmd)
            if out is not None:
                runner.backend.communicator.all_gather_host(out)


if __name__ == "__main__":
    sys.exit(main())
