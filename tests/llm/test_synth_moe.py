"""`pykernel synth` for the mixture-of-experts shapes (qwen3-30b-a3b, gpt-oss-20b, gpt-oss-120b):
real shapes, tiny variants that load and run on the numpy and kernels backends, MXFP4 weights
with a trained model's spread."""
import dataclasses
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import llm
from llm import synth
from stdlib_kernels.moe.ffn import GEMM_TOKENS

MOE_SHAPES = ("qwen3-30b-a3b", "gpt-oss-20b", "gpt-oss-120b")
# published totals (Qwen3-30B-A3B 30.5 B, gpt-oss-20b 20.9 B, gpt-oss-120b 116.8 B parameters)
PUBLISHED_PARAMS = {"qwen3-30b-a3b": 30.5e9, "gpt-oss-20b": 20.9e9, "gpt-oss-120b": 116.8e9}


@pytest.fixture
def seed():
    value = int(os.environ.get("PYKERNEL_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"PYKERNEL_SEED={value}")
    return value


@pytest.mark.parametrize("name", MOE_SHAPES)
def test_real_shapes_have_the_published_parameter_counts(name):
    plan = synth.tensor_plan(synth.SHAPES[name], "Q4_K_M")
    total = sum(int(np.prod(shape)) for _, _, shape in plan)
    assert abs(total / PUBLISHED_PARAMS[name] - 1) < 0.01, total


def test_gpt_oss_types_follow_its_published_files():
    """Experts MXFP4 in every file type; router, biases and sinks F32; 2880-wide rows are not
    whole K-quant blocks, so Q4_K_M's q/k/v fall back to Q5_0 (llama.cpp's choice)."""
    plan = {name: qtype for name, qtype, _ in synth.tensor_plan(synth.SHAPES["gpt-oss-20b"],
                                                                 "Q4_K_M")}
    assert {plan[f"blk.3.ffn_{t}_exps.weight"] for t in ("gate", "up", "down")} == {Q.MXFP4}
    assert plan["blk.3.ffn_gate_inp.weight"] == plan["blk.3.attn_sinks.weight"] == Q.F32
    assert plan["blk.3.attn_q.weight"] == Q.Q5_0 and plan["blk.3.attn_output.weight"] == Q.Q4_K
    assert plan["output.weight"] == Q.Q8_0


def tiny_variant(name: str, n_embd: int) -> synth.Shape:
    s = synth.SHAPES[name]
    return dataclasses.replace(
        s, n_embd=n_embd, n_ff=256, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_vocab=300,
        n_ctx=512, moe=dataclasses.replace(s.moe, n_expert=8, n_ff_exp=256,
                                           sliding_window=min(s.moe.sliding_window, 4)))


@pytest.mark.slow
@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q8_0", "MXFP4"])
@pytest.mark.parametrize("name", MOE_SHAPES)
def test_tiny_variant_loads_and_runs(tmp_path, monkeypatch, name, file_type):
    """The shape's arch, keys and tensor kinds at a tiny size (gpt-oss 320 wide: rows that
    are not whole K-quant blocks, as its 2880): logits finite and spread like a model's,
    prefill equal to decoding token by token."""
    n_embd = 256 if name.startswith("qwen3") else 320
    monkeypatch.setitem(synth.SHAPES, "tiny", tiny_variant(name, n_embd))
    path = synth.write_synthetic("tiny", file_type, tmp_path / "tiny.gguf")
    model = llm.load(path, n_ctx=64, progress=False)
    assert model.config.arch == synth.SHAPES[name].arch
    assert model.config.moe.n_expert == 8
    ids = list(range(40, 52))
    check_decode_equals_prefill(model, ids)
    # the kernels backend (CPU target) runs the same file: its graph-replayed decode equals
    # its own eager prefill (its distance to the numpy backend is bounded per oracle file in
    # test_moe_kernels; random routers here have near ties that Q8_1 rounding may reorder).
    # A prompt below the grouped GEMM's threshold: decode and prefill then share the DP4A
    # arithmetic; from GEMM_TOKENS the GEMM sums the same products in another order, and a
    # near-tied random router can pick another expert for one row (test_moe_grouped_gemm
    # bounds the GEMM against the reference instead)
    kernels = llm.load(path, n_ctx=64, progress=False, device="cpu", backend="kernels")
    check_decode_equals_prefill(kernels, ids[:GEMM_TOKENS - 1])


def check_decode_equals_prefill(model, ids):
    """Logits finite and spread like a model's; decoding token by token gives the prefill's."""
    logits = model.logits(ids)
    assert np.isfinite(logits).all() and 0.05 < float(logits.std()) < 10
    session = model.session()
    session.reset()
    steps = [session.prefill(ids[:2])[0]] + [session.step(t) for t in ids[2:]]
    np.testing.assert_allclose(np.stack(steps), logits[1:], rtol=1e-4, atol=1e-4)


def test_mxfp4_blocks_are_centred_with_a_trained_models_spread(seed):
    from llm.synth_moe import random_mxfp4
    rng = np.random.default_rng(seed)
    blocks = random_mxfp4(rng, 32 * 8192, synth.WEIGHT_STD)
    values = quants.dequantize(blocks.reshape(-1, 17), Q.MXFP4).reshape(-1)
    assert abs(values.mean()) < 0.05 * synth.WEIGHT_STD
    assert 0.8 * synth.WEIGHT_STD < values.std() < 1.25 * synth.WEIGHT_STD


def test_mxfp4_file_type_needs_experts(tmp_path):
    with pytest.raises(ValueError, match="no experts"):
        synth.write_synthetic("smollm2-135m", "MXFP4", tmp_path / "x.gguf")


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1])
def test_k_quant_fallback_blocks_are_centred_with_a_trained_models_spread(qtype, seed):
    """Q5_0 / Q5_1 (the fallbacks for rows that are not whole K-quant blocks): random quants
    centred by d's offset (Q5_0's mean is -d/2, 5% of its spread)."""
    rng = np.random.default_rng(seed)
    w = quants.dequantize(synth.random_blocks(rng, qtype, 32, 2048), qtype)
    assert abs(w.mean()) < 0.1 * synth.WEIGHT_STD, f"{qtype.name} mean {w.mean()}"
    assert 0.8 * synth.WEIGHT_STD < w.std() < 1.25 * synth.WEIGHT_STD, f"std {w.std()}"
