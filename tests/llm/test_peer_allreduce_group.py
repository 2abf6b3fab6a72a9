"""The one-shot peer all-reduce as a tensor-parallel communicator on the CPU target
(`LocalPeerGroup`): ranks on threads, each calling all_reduce_sum on its own arrays, get the
rank-order sum bit for bit, call after call; what the kernel does not take (too large, not
f32) goes the LocalGroup way; a tensor-parallel model with the option on gives the same
logits, bit for bit, as with it off (both add the partials in rank order)."""
import numpy as np
import pytest

import llm
import pykernel as pk
from llm.options import RunnerOptions
from llm.parallel.peer_allreduce import LocalPeerGroup
from tests.llm.gguf_helpers import TINY, require_for_module

pytestmark = pytest.mark.usefixtures("cpu_device")


def rank_order_sum(parts):
    total = parts[0].copy()
    for part in parts[1:]:
        total = total + part
    return total


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_on_threads_get_identical_sums(world, rng):
    cap_bytes = 4097 * 4
    group = LocalPeerGroup(world, cap_bytes, blocks=4)
    comms = group.communicators()
    # (shape, dtype, as a pk CPU array): the last two are too large / not f32 -> host sums
    calls = [((1,), np.float32, False), ((1000,), np.float32, True), ((4097,), np.float32, False),
             ((3, 7), np.float32, True), ((64,), np.float32, False), ((4098,), np.float32, True),
             ((10,), np.float64, False), ((4096,), np.float32, True)]
    inputs = [[rng.standard_normal(shape).astype(dtype) for _ in range(world)]
              for shape, dtype, _ in calls]

    def rank_calls(rank):
        results = []
        for (shape, dtype, on_device), parts in zip(calls, inputs):
            x = pk.to_device(parts[rank]) if on_device else parts[rank].copy()
            comms[rank].all_reduce_sum(x)
            results.append(x.numpy() if on_device else x)
        return results

    results = group.run([lambda r=r: rank_calls(r) for r in range(world)])
    for k, parts in enumerate(inputs):
        expected = rank_order_sum(parts)
        for rank in range(world):
            np.testing.assert_array_equal(results[rank][k], expected,
                                          err_msg=f"call {k} {calls[k][:2]}, rank {rank}")
    assert group.launches == 6          # the f32 calls of at most 4097 values
    assert (group.epochs == 6).all()


@pytest.mark.parametrize("backend", ["numpy", "kernels"])
def test_model_logits_equal_with_the_option(rng, backend):
    require_for_module(TINY / "tiny-llama-f32.gguf")
    ids = [int(i) for i in rng.integers(1, 200, 9)]
    models = [llm.load(TINY / "tiny-llama-f32.gguf", device="cpu", backend=backend, n_ctx=32,
                       progress=False, tp=2, options=RunnerOptions(peer_allreduce_kb=kb))
              for kb in (0, 64)]
    plain, peer = (m.logits(ids) for m in models)
    np.testing.assert_array_equal(peer, plain)
    group = models[1].backend.ranks.group
    assert isinstance(group, LocalPeerGroup) and group.launches > 0


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("tp", [2, 4])
def test_peer_allreduce_one_process_per_gpu(rng, tp, graphs):
    """Needs tp GPUs of one host and nccl4py: the tiny model at tp with the one-shot kernel
    (CUDA IPC buffers) against the unsharded model, as the NCCL test does."""
    from cuda.bindings import driver
    err, count = driver.cuDeviceGetCount()
    if err or count < tp:
        pytest.skip(f"needs {tp} GPUs (this machine has {count})")
    pytest.importorskip("nccl.core", reason="nccl4py is not installed")
    from tests.llm.test_tensor_parallel_kernels import compare
    compare("tiny-llama-f32.gguf", tp, "cuda", rng, graphs=graphs,
            options=RunnerOptions(peer_allreduce_kb=64))


@pytest.mark.gpu
def test_gpu_ranks_take_the_one_shot_path():
    """On one host with NVLink peers, every rank opens its peers' buffers (no fall back)."""
    from cuda.bindings import driver
    err, count = driver.cuDeviceGetCount()
    if err or count < 2:
        pytest.skip(f"needs 2 GPUs (this machine has {count})")
    pytest.importorskip("nccl.core", reason="nccl4py is not installed")
    from llm.parallel.peer_allreduce import PeerAllReduce
    model = llm.load(TINY / "tiny-llama-f32.gguf", device="cuda", backend="kernels", n_ctx=32,
                     progress=False, tp=2, options=RunnerOptions(peer_allreduce_kb=64))
    assert isinstance(model.backend.ranks.comm, PeerAllReduce)
    assert np.isfinite(model.logits([1, 2, 3])).all()


def test_option_from_the_environment(monkeypatch):
    monkeypatch.setenv("PYKERNEL_PEER_ALLREDUCE_KB", "64")
    assert RunnerOptions.from_env().peer_allreduce_kb == 64
    monkeypatch.delenv("PYKERNEL_PEER_ALLREDUCE_KB")
    assert RunnerOptions.from_env().peer_allreduce_kb == 0          # off by default
    with pytest.raises(ValueError, match="peer_allreduce_kb must be >= 0"):
        RunnerOptions(peer_allreduce_kb=-1)
