"""Tensor parallelism: a model's heads, FFN columns and vocabulary split over N ranks.

`plan.py` (which rank holds what), `shard_file.py` (a rank's tensors), `communicator.py`
(`Communicator`, the in-process `LocalGroup`), `nccl_comm.py` (NCCL through nccl4py),
`peer_allreduce.py` (small all-reduces by a kernel reading the peer GPUs' CUDA IPC buffers),
`ranks.py` (a rank's model, N of them in one process), `rank_graphs.py` (a rank's
GraphRunner: the ranks agree on the shapes of their steps), `model.py` (the group as `Model` drives
it; `llm.load(..., tp=N)`), `launch.py` / `gpu.py` / `worker.py` (one process per GPU).
docs/runner.md "Several GPUs" is the user's guide.
"""
