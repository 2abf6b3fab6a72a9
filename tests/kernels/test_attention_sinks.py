"""Attention with learned sinks (gpt-oss: one more logit per head in the softmax, no value, not
scaled) on the stdlib decode and prefill kernels, against the float64 numpy reference: the
SIMT split kernel with its combine kernel and with the last-block combine, the tensor-core,
bulk-copy and cluster-merge decode kernels, the SIMT and tensor-core prefill, sliding windows,
several sequences; and the PTX: the sink variants assemble, the dense ones never read the
sinks pointer (kernels compiled without sinks are the dense kernels)."""
import re

import numpy as np
import pytest
from attention_checks import check_close, prefill_expected, prefill_problem

import pykernel as pk
from stdlib_kernels.attention.decode import (DecodeWorkspace, KeyRange, combine_spec,
                                             decode_kernel, decode_spec, launch_decode)
from stdlib_kernels.attention.decode_plan import DecodeConfig, bulk_config, mma_config
from stdlib_kernels.attention.decode_combine import combine_splits
from stdlib_kernels.attention.prefill import launch_prefill, launch_prefill_seqs
from stdlib_kernels.attention.prefill_flash import prefill_flash
from stdlib_kernels.attention.reference import decode_reference


def _sinks(rng, n_head):
    """Sink logits of a trained model's spread, one far above the scores (it takes most of the
    softmax: the output shrinks, which a missing or doubled sink term would get wrong)."""
    sinks = rng.normal(0.0, 2.0, n_head).astype(np.float32)
    sinks[int(rng.integers(n_head))] = 6.0
    return sinks


def _decode_problem(rng, n_seq, n_head, n_kv_head, head_dim, dtype, max_len):
    q = rng.standard_normal((n_seq, n_head, head_dim)).astype(np.float32)
    k = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(dtype)
    v = rng.standard_normal((n_seq, n_kv_head, max_len, head_dim)).astype(dtype)
    lens = rng.integers(1, max_len + 1, size=n_seq).astype(np.int32)
    lens[0] = max_len - int(rng.integers(0, 3))           # one long enough for every split
    return q, k, v, lens


def _run_decode(q, k, v, lens, sinks, window, splits, seed, dtype, what, **kw):
    n_seq, n_head, head_dim = q.shape
    scale = head_dim ** -0.5
    out = pk.full(q.shape, np.nan, np.float32)            # poisoned: unwritten rows fail
    workspace = kw.pop("workspace", None)
    if workspace is None and splits > 1:
        workspace = DecodeWorkspace.allocate(n_seq, n_head, head_dim, splits,
                                             fused=kw.pop("fused", False))
    kw.pop("fused", None)
    launch_decode(pk.to_device(q), pk.to_device(k), pk.to_device(v),
                  KeyRange(pk.to_device(lens), window=window), out, scale,
                  workspace=workspace, sinks=pk.to_device(sinks), **kw)
    for z in range(n_seq):
        expected = decode_reference(q[z], k[z], v[z], int(lens[z]), scale, window, sinks=sinks)
        check_close(out.numpy()[z], expected, dtype, seed,
                    f"{what}: sequence {z} kv_len {lens[z]} splits {splits} window {window}")


# (dtype, n_head, n_kv_head, head_dim, window, splits, fused): the CPU target's default SIMT
# kernel, one split (sink in the direct write), splits with the combine kernel and with the
# last block's combine, windows shorter than some lengths
SIMT_CASES = [(np.float32, 4, 2, 64, None, 1, False),
              (np.float16, 6, 2, 80, 9, 3, False),
              (np.float32, 4, 1, 64, None, 5, True),
              (np.float16, 8, 2, 128, 13, 4, True)]


@pytest.mark.parametrize("case", SIMT_CASES, ids=["direct", "two_launch_window",
                                                  "fused", "fused_window"])
def test_decode_sinks_simt(device, rng, seed, case):
    dtype, n_head, n_kv_head, head_dim, window, splits, fused = case
    q, k, v, lens = _decode_problem(rng, 2, n_head, n_kv_head, head_dim, dtype, 45)
    _run_decode(q, k, v, lens, _sinks(rng, n_head), window, splits, seed, dtype, str(case),
                fused=fused, config=DecodeConfig(heads_per_block=1, warps=2, unroll=1))


# the GPU's kernels, on the CPU target too: tensor cores (one split, splits with the fused
# combine), bulk copies (split + combine kernel), the cluster merge
GPU_KERNEL_CASES = [
    ("mma", mma_config(4, 64, warps=2), 1, 20),
    ("mma_fused", mma_config(2, 64, warps=2), 3, None),
    ("bulk", bulk_config(4, 64, warps=2, stages=2), 3, 17),
    ("cluster", mma_config(2, 64, warps=2), 4, None),
]


@pytest.mark.parametrize("case", GPU_KERNEL_CASES, ids=[c[0] for c in GPU_KERNEL_CASES])
def test_decode_sinks_gpu_kernels(device, rng, seed, case):
    name, config, splits, window = case
    n_head, n_kv_head, head_dim = 8, 2, 64
    q, k, v, lens = _decode_problem(rng, 2, n_head, n_kv_head, head_dim, np.float16, 150)
    workspace = None
    if splits > 1:
        workspace = DecodeWorkspace.allocate(2, n_head, head_dim, splits,
                                             fused=name == "mma_fused",
                                             cluster=name == "cluster")
    _run_decode(q, k, v, lens, _sinks(rng, n_head), window, splits, seed, np.float16, name,
                config=config, workspace=workspace)


@pytest.mark.parametrize("path,dtype,window", [("simt", np.float32, None),
                                               ("simt", np.float16, 5),
                                               ("mma", np.float16, None),
                                               ("mma", np.float16, 6)])
def test_prefill_sinks(device, rng, seed, path, dtype, window):
    """19 rows per head group straddle the 16-row tiles of the tensor-core path."""
    tokens, start, n_head, n_kv_head, head_dim = 19, 8, 4, 2, 64
    q, k, v = prefill_problem(rng, tokens, start, n_head, n_kv_head, head_dim, dtype)
    sinks = _sinks(rng, n_head)
    out = pk.full(q.shape, np.nan, np.float32)
    kw = dict(warps=1, block_keys=16) if path == "mma" and device.kind == "cpu" else {}
    launch_prefill(pk.to_device(q), pk.to_device(k), pk.to_device(v), out, start, 0.125,
                   window=window, path=path, sinks=pk.to_device(sinks), **kw)
    check_close(out.numpy(), prefill_expected(q, k, v, start, 0.125, window, sinks=sinks),
                dtype, seed, f"{path} window {window}")


def test_prefill_seqs_sinks(device, rng, seed):
    """Two sequences of a pool in one tensor-core launch, each its own positions."""
    n_head, n_kv_head, head_dim, max_len = 4, 2, 64, 40
    pool_k = rng.standard_normal((2, n_kv_head, max_len, head_dim)).astype(np.float16)
    pool_v = rng.standard_normal((2, n_kv_head, max_len, head_dim)).astype(np.float16)
    seqs = np.array([[0, 7, 5, 1], [7, 11, 0, 0]], np.int32)   # first row, tokens, start, slot
    q = rng.standard_normal((18, n_head, head_dim)).astype(np.float32)
    sinks = _sinks(rng, n_head)
    out = pk.full(q.shape, np.nan, np.float32)
    kw = dict(warps=1, block_keys=16) if device.kind == "cpu" else {}
    launch_prefill_seqs(pk.to_device(q), pk.to_device(pool_k), pk.to_device(pool_v), out, seqs,
                        0.125, window=6, sinks=pk.to_device(sinks), **kw)
    for first, count, start, slot in seqs:
        expected = prefill_expected(q[first:first + count], pool_k[slot], pool_v[slot], start,
                                    0.125, 6, sinks=sinks)
        check_close(out.numpy()[first:first + count], expected, np.float16, seed,
                    f"sequence at rows {first}..")


def test_bad_sinks_are_reported(device):
    q = pk.to_device(np.zeros((1, 4, 64), np.float32))
    k = pk.to_device(np.zeros((2, 8, 64), np.float32))
    out = pk.empty((1, 4, 64), np.float32)
    lens = pk.to_device(np.array([3], np.int32))
    with pytest.raises(ValueError, match="sinks must be a device float32 array of n_head = 4"):
        launch_decode(q, k, k, KeyRange(lens), out, 1.0,
                      sinks=pk.to_device(np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="sinks must be"):
        launch_decode(q, k, k, KeyRange(lens), out, 1.0, sinks=np.zeros(4, np.float32))


# every kernel with a sinks pointer: (kernel, its compile-time arguments without SINK)
def _kernels():
    yield "decode_partial", decode_kernel(DecodeConfig(1, 2, 1)), \
        decode_spec(128, np.float16, DecodeConfig(1, 2, 1), fused=True)
    yield "decode_mma_cluster", decode_kernel(mma_config(8, 128)), \
        decode_spec(128, np.float16, mma_config(8, 128), cluster=True)
    yield "decode_mma_fused", decode_kernel(mma_config(8, 128)), \
        decode_spec(128, np.float16, mma_config(8, 128), fused=True)
    yield "decode_bulk", decode_kernel(bulk_config(8, 128)), \
        decode_spec(128, np.float16, bulk_config(8, 128), fused=True)
    yield "combine_splits", combine_splits, combine_spec(128, 8)
    yield "prefill_flash", prefill_flash, dict(D=128, BN=64, NWARPS=4, STAGES=3, MT=1,
                                               VARLEN=True, SINK=False)


KERNELS = list(_kernels())


def _with_sink(spec: dict, on: bool) -> dict:
    return {**spec, "SINK": type(spec["SINK"])(on)}


def _sinks_param(ptx: str) -> str:
    """The PTX name of the kernel's sinks pointer (the last pointer it declares that the
    signature names `sinks`: the kernels put it after every parameter they had before)."""
    params = re.findall(r"\.param \.u64 \.ptr[^\n]*?(\w+_param_\d+)", ptx)
    return params[-1]


@pytest.mark.parametrize("name,kernel,spec", KERNELS, ids=[k[0] for k in KERNELS])
def test_dense_ptx_never_reads_the_sinks(name, kernel, spec):
    """SINK = 0: the sinks pointer is declared but never loaded (the dense kernel's body,
    instruction for instruction); SINK = 1 loads it."""
    dense = kernel.ptx("sm_90", **_with_sink(spec, False))
    with_sinks = kernel.ptx("sm_90", **_with_sink(spec, True))
    assert f"[{_sinks_param(dense)}]" not in dense, name
    assert f"[{_sinks_param(with_sinks)}]" in with_sinks, name


@pytest.mark.parametrize("name,kernel,spec", KERNELS, ids=[k[0] for k in KERNELS])
def test_sink_kernels_assemble(name, kernel, spec, assemble):
    assemble(kernel.ptx("sm_90", **_with_sink(spec, True)), "sm_90")
