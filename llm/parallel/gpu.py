"""Tensor parallelism over GPUs: one process per GPU, NCCL between them, rank 0 drives.

Input: `llm.load(..., device="cuda", tp=N)` in rank 0 (the CLI's process), and
`llm.parallel.worker` in the others. Output: rank 0's (transformer, backend) for `Model`: the
tokenizer, sampling, the HTTP server live in rank 0 only; every forward is a command that the
workers receive over their control socket and run on their shards, the all-reduces inside the
forward meeting over NCCL, the logits shards gathered to rank 0 (all ranks take part).

Each process sees one GPU: a worker narrows CUDA_VISIBLE_DEVICES to the LOCAL_RANK-th visible
device before CUDA starts (`launch.visible_device`), so its backend's "cuda" is that GPU; rank 0 uses
its first visible GPU.
"""
from __future__ import annotations

import dataclasses

from llm.backends import create_backend
from llm.config import load_config
from llm.gguf_file import GGUFFile
from llm.models.archs import ARCH_SPECS
from llm.options import RunnerOptions
from llm.parallel.launch import (
    ProcessRanks,
    RankEnv,
    free_port,
    serve_rendezvous,
    spawn_workers,
    watch_workers,
)
from llm.parallel.model import (
    TensorParallelBackend,
    TensorParallelTransformer,
    rank_transformer,
    widest_vocab,
)
from llm.parallel.nccl_comm import NcclCommunicator, new_unique_id
from llm.parallel.plan import plan_shards
from llm.parallel.ranks import RankRunner


def options_to_wire(backend_options: dict) -> dict:
    """The backend options rank 0 loaded with, as JSON values for the workers."""
    out = {}
    for key, value in backend_options.items():
        if isinstance(value, RunnerOptions):
            out[key] = {"RunnerOptions": dataclasses.asdict(value)}
        elif value is None or isinstance(value, (str, int, float, bool)):
            out[key] = value
        else:
            raise ValueError(f"tensor parallelism on GPUs: backend option {key}={value!r} cannot "
                             f"be sent to the other ranks (use a name, e.g. kv_dtype='f16')")
    return out


def options_from_wire(wire: dict) -> dict:
    return {k: RunnerOptions(**v["RunnerOptions"]) if isinstance(v, dict) else v
            for k, v in wire.items()}


def _rank(env: RankEnv, unique_id: bytes, gguf, cfg, spec, backend) -> RankRunner:
    """This process's rank: NCCL joined (collective: every rank calls it), shard loaded."""
    backend.communicator = NcclCommunicator(env.rank, env.world_size, unique_id, backend.device)
    if backend.options.peer_allreduce_kb:     # collective: every rank has rank 0's options
        from llm.parallel.peer_allreduce import open_peer_allreduce
        backend.communicator = open_peer_allreduce(backend.communicator, backend.device,
                                                   backend.options.peer_allreduce_kb * 1024)
    plan = plan_shards(cfg, env.world_size)
    transformer = rank_transformer(gguf, cfg, spec, plan, env.rank, backend)
    return RankRunner(transformer, backend, plan.ranks[env.rank], widest_vocab(plan))


def build_rank(env: RankEnv, unique_id: bytes, setup: dict) -> RankRunner:
    """A worker's rank from rank 0's setup message (model path, backend options)."""
    backend = create_backend("cuda", "kernels", **options_from_wire(setup["backend_options"]))
    gguf = GGUFFile(setup["path"])
    cfg = load_config(gguf)
    return _rank(env, unique_id, gguf, cfg, ARCH_SPECS[cfg.arch], backend)


def load_gpu_group(path, gguf, cfg, spec, tp: int, backend, backend_options: dict):
    """Rank 0's (transformer, backend) over tp GPU processes; starts ranks 1..tp-1 on this
    host unless the environment says they are started already (RANK=0 set)."""
    plan = plan_shards(cfg, tp)              # refuse before any process starts
    unique_id = new_unique_id()              # and fail here when nccl4py is missing
    env, procs = RankEnv.from_environ(), []
    if env is None:
        env = RankEnv(0, tp, 0, "127.0.0.1", free_port())
        procs = spawn_workers(tp, env.master_port)
        watch_workers(procs)
    elif env.rank != 0 or env.world_size != tp:
        raise ValueError(f"this process is RANK={env.rank} of WORLD_SIZE={env.world_size}, "
                         f"asked for tp={tp}: rank 0 runs the model (pykernel run --tp "
                         f"{env.world_size}), the others run python -m llm.parallel.worker")
    # every rank with rank 0's switches, precompile off: its dry run of a step would run the
    # step's collectives once more on the ranks that compile, and NCCL needs every rank to
    # make the same calls in the same order
    backend.options = dataclasses.replace(backend.options, precompile=False)
    wire = options_to_wire({**backend_options, "options": backend.options})
    channels = serve_rendezvous(env, unique_id)
    for ch in channels:
        ch.send({"path": str(path), "backend_options": wire})
    runner = _rank(env, unique_id, gguf, cfg, spec, backend)
    ranks = ProcessRanks(runner, channels, backend.communicator, plan, procs)
    group_backend = TensorParallelBackend(ranks, plan, backend, cfg)
    return TensorParallelTransformer(cfg, spec, ranks, group_backend), group_backend
