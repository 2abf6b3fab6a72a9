"""The MoE grouped int8 GEMM path (stdlib_kernels.moe.grouped_gemm) against the float64
reference, through moe_ffn_into(gemm=True): random data, awkward token counts (1, 17, 130),
experts with no tokens, tied router logits, outputs poisoned.

The error bound is test_moe_experts.expected_and_bound's (the kernels see x and h as their
Q8_1 roundings, dot exactly in integers per 32-block and accumulate scaled in f32): the
grouped GEMM computes the same sums as the DP4A GEMV, in another order, within F32_DOT.
"""
import functools

import numpy as np
import pytest
from stdlib_kernels.moe import grouped_gemm as gg
from stdlib_kernels.quant.formats import MXFP4, Q4_K, Q6_K, Q8_0

from test_moe_experts import run_ffn

CASES = [  # (gate/up type, down type, n_embd, n_ff, n_expert, k, act)
    ("Q8_0", "Q8_0", 96, 160, 5, 2, "silu"),        # K % 256 != 0: per-32-block kernel
    ("Q4_K", "Q6_K", 256, 256, 6, 3, "silu"),       # super-block kernel, one K step
    ("MXFP4", "MXFP4", 64, 96, 5, 2, "oai"),        # doubled e2m1 as int8, biases
    ("Q8_0", "Q4_0", 512, 256, 4, 2, "silu"),       # super-block kernel, two K steps (gate/up)
]
IDS = ["-".join(map(str, c[:4])) for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 17])
def test_grouped_gemm_ffn(device, rng, seed, case, tokens):
    """1 token: all but k experts without tokens; 17 with k = 2..3 over 4..6 experts: runs
    of more than one 8-token tile per expert and short last tiles."""
    run_ffn(rng, seed, case, tokens=tokens, grouped=True, with_bias=case[6] == "oai",
            with_res=tokens == 17, gemm=True)


def test_grouped_gemm_long_prompt(device, rng, seed):
    """130 tokens (260 pairs over 5 experts: ~7 token tiles per expert)."""
    run_ffn(rng, seed, CASES[2], tokens=130, grouped=True, with_bias=True, with_res=True,
            gemm=True)


@pytest.mark.slow
@pytest.mark.parametrize("case,bn", [(CASES[1], 32), (CASES[2], 64), (CASES[3], 16),
                                     (CASES[0], 128)],
                         ids=["Q4_K-32", "MXFP4-64", "Q8_0-super-16", "Q8_0-block-128"])
def test_gpu_tile_shapes(device, rng, seed, monkeypatch, case, bn):
    """The GPU's multi-warp tiles (kernel_tiles for token tile bn) on any device: 40 tokens,
    so experts take several and partial token tiles and 64-row tiles overhang n_ff / n_embd."""
    from stdlib_kernels.moe import ffn
    monkeypatch.setattr(ffn, "grouped_ffn_into", functools.partial(gg.grouped_ffn_into, bn=bn))
    run_ffn(rng, seed, case, tokens=40, grouped=True, with_bias=case[6] == "oai",
            with_res=True, gemm=True)


def test_tied_router_logits_and_idle_experts(device, rng, seed):
    """Logits rounded to a few values (many ties, broken toward the lower expert as the
    router does) and one expert never chosen: its tiles are empty, its rows unused."""
    tokens, n_expert = 19, 6
    logits = np.round(rng.standard_normal((tokens, n_expert))).astype(np.float32)
    logits[:, 4] = -100.0                       # expert 4 gets no token
    logits[:5] = 0.0                            # all tied: experts 0 and 1 (lower index)
    case = ("Q8_0", "Q8_0", 96, 160, n_expert, 2, "silu")
    ids = run_ffn(rng, seed, case, tokens=tokens, grouped=True, with_bias=False,
                  with_res=False, gemm=True, logits=logits)
    assert not np.any(ids == 4) and np.array_equal(ids[:5], np.tile([0, 1], (5, 1)))


def test_default_route_takes_the_gemm_from_gemm_tokens(device, rng, seed, monkeypatch):
    """moe_ffn_into(gemm=None) takes the grouped GEMM from GEMM_TOKENS tokens only."""
    from stdlib_kernels.moe import ffn
    calls = []
    real = ffn.grouped_ffn_into
    monkeypatch.setattr(ffn, "grouped_ffn_into", lambda *a: calls.append(a[8]) or real(*a))
    for tokens in (ffn.GEMM_TOKENS - 1, ffn.GEMM_TOKENS):
        run_ffn(rng, seed, CASES[0], tokens=tokens, grouped=None, with_bias=False,
                with_res=False)
    assert calls == [ffn.GEMM_TOKENS]


def test_token_tile_follows_the_mean_tokens_per_expert(monkeypatch):
    class Gpu:
        kind = "cuda"
    monkeypatch.setattr(gg.pk, "current_device", lambda: Gpu())
    assert [gg.token_tile(p, 128) for p in (64, 1024, 4096, 8192, 1 << 16)] == \
        [8, 8, 32, 64, 128]


def test_grouped_kernels_assemble_for_the_gpu(assemble):
    """The GPU tiles of every kernel the path launches lower to PTX that ptxas accepts."""
    from stdlib_kernels.quant.gemm_q8_k_parts import STEP_WORDS, a_stride
    ptx = []
    for fmt, wt, tiles in ((Q4_K, np.uint32, gg.SMALL_KQ[32]), (Q6_K, np.uint16,
                           gg.SMALL_KQ[64]), (Q8_0, np.uint32, gg.TUNED_KTILES["Q8_0"])):
        ptx.append(gg.grouped_q8k_kernel.ptx(
            "sm_90", FMT=fmt, WT=wt, GPU=1, MI=tiles.mi, NI=tiles.ni, WM=tiles.wm,
            WN=tiles.wn, STAGES=tiles.stages, AS=a_stride(fmt), AW=STEP_WORDS.get(fmt, 0)))
    t = gg.BLOCK_TILES[64]
    ptx.append(gg.grouped_q8_kernel.ptx("sm_90", FMT=MXFP4, WT=np.uint8, MI=t.mi, NI=t.ni,
                                        WM=t.wm, WN=t.wn, KB=2))
    ptx.append(gg.glu_q8_1_kernel.ptx("sm_90", GLU=gg.ek.GLU_OAI, HAS_BIAS=True))
    for text in ptx:
        assemble(text, "sm_90")


def test_gemm_threshold_per_expert_format():
    """MXFP4 experts (either matrix) keep the tiled GEMV up to their measured crossover."""
    from types import SimpleNamespace as W

    from stdlib_kernels.moe import ffn
    q4k, q6k, mx = W(type_name="Q4_K"), W(type_name="Q6_K"), W(type_name="MXFP4")
    assert ffn.gemm_from(q4k, q6k) == ffn.GEMM_TOKENS
    assert ffn.gemm_from(mx, mx) == ffn.gemm_from(q4k, mx) == ffn.GEMM_TOKENS_BY_TYPE["MXFP4"]
    assert ffn.GEMM_TOKENS_BY_TYPE["MXFP4"] > ffn.GEMM_TOKENS
