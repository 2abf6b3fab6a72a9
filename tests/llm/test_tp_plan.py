"""Tensor parallelism's pure parts: the sharding plan, a rank's tensor slices (quant blocks
whole, refused by name where not), the in-process group's sums, the rank environment and the
control channel."""
import dataclasses
import itertools
import socket
import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

from llm import step as S
from llm.backends.dequant import dequantize
from llm.config import ModelConfig, MoeParams
from llm.gguf_file import TensorInfo
from llm.options import RunnerOptions
from llm.parallel.communicator import LocalGroup
from llm.parallel.gpu import options_from_wire, options_to_wire
from llm.parallel.launch import Channel, RankEnv, visible_device
from llm.parallel.plan import (
    ShardingError,
    Span,
    column_block_range,
    even_span,
    local_config,
    local_token_ids,
    plan_shards,
    reduce_argmax,
)
from llm.parallel.ranks import step_from_wire, step_to_wire
from llm.parallel.shard_file import take_columns, take_rows


def config(n_head=8, n_head_kv=2, n_ff=256, n_vocab=1001, moe=None) -> ModelConfig:
    return ModelConfig(arch="llama", n_layer=2, n_embd=64, n_head=n_head, n_head_kv=n_head_kv,
                       head_dim=16, head_dim_v=16, n_ff=n_ff, n_vocab=n_vocab, n_ctx_train=64,
                       eps=1e-5, rope=None, moe=moe)


@pytest.mark.parametrize("total,n", [(1001, 4), (263, 2), (8, 8), (3, 4)])
def test_even_span_covers_everything_once(total, n):
    spans = [even_span(total, n, r) for r in range(n)]
    assert spans[0].first == 0 and spans[-1].stop == total
    assert all(a.stop == b.first for a, b in itertools.pairwise(spans))
    assert max(s.count for s in spans) - min(s.count for s in spans) <= 1


@pytest.mark.parametrize("n_head,n_head_kv,tp", [(8, 2, 1), (8, 2, 2), (8, 2, 4), (8, 2, 8),
                                                 (8, 8, 4), (4, 1, 4), (12, 4, 2)])
def test_every_query_head_sits_with_its_kv_head(n_head, n_head_kv, tp):
    """Rank r's local query head j is global head q.first + j and must read global KV head
    (q.first + j) // group; locally it reads kv.first + j // local_group."""
    cfg = config(n_head=n_head, n_head_kv=n_head_kv)
    plan = plan_shards(cfg, tp)
    group = n_head // n_head_kv
    seen = []
    for s in plan.ranks:
        local = local_config(cfg, s)
        local_group = local.n_head // local.n_head_kv
        for j in range(s.q_heads.count):
            head = s.q_heads.first + j
            assert s.kv_heads.first + j // local_group == head // group, (s, j)
            seen.append(head)
    assert sorted(seen) == list(range(n_head))
    assert plan.kv_replicas == max(1, tp // n_head_kv)


def test_local_config_counts_the_zero_vocabulary_row():
    cfg = config(n_vocab=263)
    plan = plan_shards(cfg, 2)
    assert [local_config(cfg, s).n_vocab for s in plan.ranks] == [133, 132]
    assert [local_config(cfg, s).n_ff for s in plan.ranks] == [128, 128]


@pytest.mark.parametrize("kwargs,tp,words", [
    ({"n_head": 6, "n_head_kv": 2}, 4, "6 attention heads"),
    ({"n_head": 6, "n_head_kv": 3}, 2, "3 KV heads"),
    ({"n_ff": 100}, 8, "FFN width 100"),
    ({"moe": MoeParams(8, 2, 32)}, 2, "mixture of experts"),
    ({}, 0, "at least 1"),
])
def test_plans_that_cannot_be_made_are_refused(kwargs, tp, words):
    with pytest.raises(ShardingError, match=words):
        plan_shards(config(**kwargs), tp)


def test_column_range_refuses_a_cut_block_by_name():
    assert column_block_range("w", "Q4_K", 256, 1024, Span(512, 256)) == Span(2, 1)
    with pytest.raises(ShardingError, match=r"'blk.3.ffn_down.weight' \(Q4_K, 256-value"):
        column_block_range("blk.3.ffn_down.weight", "Q4_K", 256, 1024, Span(128, 128))


def _quantized(rng, rows, cols, qtype) -> TensorInfo:
    """Random bytes in qtype's layout (any bytes are blocks; a NaN scale dequantizes to NaN in
    the slice and the whole alike, which assert_array_equal accepts), F32 random values."""
    if qtype == Q.F32:
        raw = rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    else:
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, rows * cols // block * block_bytes, dtype=np.uint8)
    raw = np.ascontiguousarray(raw).reshape(-1)
    return TensorInfo("blk.0.ffn_down.weight", qtype, (rows, cols), 0, raw.size, raw)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")    # random scales: some inf / NaN
@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q4_K, Q.Q6_K])
def test_column_slices_dequantize_to_the_same_columns(rng, qtype):
    """A rank's block-aligned column slice holds exactly its columns' values, bit for bit."""
    t = _quantized(rng, 7, 1024, qtype)
    full = dequantize(t.data, t.ggml_type, t.shape)
    for cols in (Span(0, 512), Span(512, 512), Span(256, 256)):
        part = take_columns(t, cols)
        np.testing.assert_array_equal(dequantize(part.data, part.ggml_type, part.shape),
                                      full[:, cols.first:cols.stop])


def test_a_column_slice_inside_a_block_is_refused(rng):
    t = _quantized(rng, 3, 512, Q.Q4_K)
    with pytest.raises(ShardingError, match="blk.0.ffn_down.weight"):
        take_columns(t, Span(0, 128))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q4_K, Q.Q6_K])
def test_vocabulary_rows_and_the_zero_row(rng, qtype):
    t = _quantized(rng, 11, 256, qtype)
    full = dequantize(t.data, t.ggml_type, t.shape)
    part = take_rows(t, [Span(4, 5)], 1, pad_rows=1)
    got = dequantize(part.data, part.ggml_type, part.shape)
    np.testing.assert_array_equal(got[:5], full[4:9])
    assert not got[5].any()


def test_local_token_ids_send_other_ranks_ids_to_the_zero_row():
    ids = np.array([0, 4, 8, 9, 262])
    np.testing.assert_array_equal(local_token_ids(ids, Span(4, 5)), [5, 0, 4, 5, 5])


def test_reduce_argmax_picks_the_lowest_id_on_ties_and_never_nan():
    nan, inf = np.nan, np.inf
    values = np.array([[1.0, 5.0, nan, nan, -inf, inf],
                       [3.0, 5.0, 2.0, nan, -inf, 1.0]])     # (ranks, rows)
    ids = np.array([[10, 11, 12, 13, 14, 15], [200, 7, 201, 202, 203, 204]])
    np.testing.assert_array_equal(reduce_argmax(values, ids), [200, 7, 201, -1, -1, -1])


def test_local_group_sums_in_rank_order_and_every_rank_gets_the_same_bits(rng):
    group, n = LocalGroup(3), 3
    parts = [rng.standard_normal((2, 33)).astype(np.float32) * 10 ** r for r in range(n)]
    outs = [p.copy() for p in parts]
    comms = group.communicators()
    group.run([lambda r=r: comms[r].all_reduce_sum(outs[r]) for r in range(n)])
    expected = (parts[0] + parts[1]) + parts[2]
    for out in outs:
        np.testing.assert_array_equal(out, expected)


def test_a_failing_rank_does_not_hang_the_others():
    group = LocalGroup(2)
    comms = group.communicators()

    def bad():
        raise RuntimeError("rank 1 broke")
    with pytest.raises(RuntimeError, match="rank 1 broke"):
        group.run([lambda: comms[0].all_reduce_sum(np.ones(3, np.float32)), bad])
    out = group.run([lambda r=r: comms[r].all_gather_host(np.full(2, r)) for r in range(2)])
    assert [list(map(list, o)) for o in out] == [[[0, 0], [1, 1]]] * 2   # usable again


def test_rank_environment():
    assert RankEnv.from_environ({}) is None
    env = RankEnv.from_environ({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.2",
                                "MASTER_PORT": "29501"})
    assert env == RankEnv(1, 4, 1, "10.0.0.2", 29501)
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        RankEnv.from_environ({"RANK": "1"})


def test_visible_device_narrows_to_the_local_rank():
    assert visible_device(1, {}) == "1"
    assert visible_device(1, {"CUDA_VISIBLE_DEVICES": "3, 5"}) == "5"
    with pytest.raises(ValueError, match="lists 2"):
        visible_device(2, {"CUDA_VISIBLE_DEVICES": "3,5"})


def test_control_channel_round_trip():
    a, b = socket.socketpair()
    sender, receiver = Channel(a), Channel(b)
    msg = {"op": "forward", "step": step_to_wire(S.tokens(np.arange(5000), 3)), "caches": [0]}
    t = threading.Thread(target=sender.send, args=(msg,))
    t.start()
    assert receiver.recv() == msg
    t.join()
    a.close()
    with pytest.raises(ConnectionError):
        receiver.recv()


def test_backend_options_travel_to_the_workers():
    options = {"kv_dtype": "f16", "options": dataclasses.replace(RunnerOptions(), pdl=False)}
    assert options_from_wire(options_to_wire(options)) == options
    with pytest.raises(ValueError, match="kv_dtype"):
        options_to_wire({"kv_dtype": np.float16})


def _same_step(a, b) -> None:
    for field in ("kind", "starts", "counts", "direct", "splits", "tables"):
        assert getattr(a, field) == getattr(b, field), field
    for field in ("ids", "positions"):
        got, want = getattr(a, field), getattr(b, field)
        assert got.dtype == want.dtype and np.array_equal(got, want), field
    if a.keeps_last or a.keep is None:
        assert b.keep is a.keep or b.keep == a.keep
    else:
        assert np.array_equal(a.keep, b.keep)


@pytest.mark.parametrize("step", [
    S.tokens([5, 9, 2], 7), S.tokens([4], 0, all_logits=True),
    S.batch([1, 2, 3], [10, 0, 4], 3, splits=2),
    S.prompts([[1, 2], [3], [4, 5, 6]], [0, 4, 9], 3)], ids=["tokens", "all", "batch", "prompts"])
def test_a_step_crosses_the_control_channel_whole(step):
    """The workers' forward command carries the step itself: every field back as it was,
    through JSON (what Channel sends)."""
    import json
    _same_step(step, step_from_wire(json.loads(json.dumps(step_to_wire(step)))))


def test_a_device_step_is_refused_on_the_wire():
    step = S.tokens([1, 2], 0)
    with pytest.raises(ValueError, match="from the host"):
        step_to_wire(step.with_inputs([1, 2], [0, 1]))


def test_a_step_needs_one_cache_per_sequence():
    from llm.parallel.model import forward_command
    with pytest.raises(ValueError, match="3 sequence\\(s\\) needs as many caches, got 1"):
        forward_command(S.batch([1, 2, 3], [0, 0, 0], 3), [object()])
    with pytest.raises(TypeError, match="its own caches"):
        forward_command(S.tokens([1], 0), [object()])
