"""stdlib_kernels.gemm_hopper_quant (wgmma on GGUF weights dequantized to f16 in shared
memory): on the CPU target bit-exact against numpy's dequantize-to-f16 then f32 sums in k order
(the emulation's order), on shapes that clip (M, N not multiples of the tile), several slabs
per tile (more than the raw slots, so the dequantizers' releases are waited on), several tiles
per block (slabs numbered across tiles), every served format and the consumers' options; the
documented rounding of the weights to f16; on a GPU bit-equal to gemm_hopper on the same f16
weights (same consumers, same order) and within the f32 summation bound; argument and config
errors; ptxas assembles it for sm_90a."""
import numpy as np
import pytest
from gemm_oracles import k_order_reference

import pykernel as pk
from pykernel import Const, Ptr, i32, u32
from stdlib_kernels import gemm_hopper as G
from stdlib_kernels import gemm_hopper_quant as Q
from stdlib_kernels import gemm_hopper_quant_kernel as K
from stdlib_kernels.gemm_hopper_quant_dequant import dequant_chunk
from stdlib_kernels.quant import reference as ref
from stdlib_kernels.quant.decode8_k import decode8
from stdlib_kernels.quant.formats import get_format

F32_EPS = 2.0 ** -24


def _inputs(rng, M, N, K, type_name, scale=1.0):
    """(a f16, raw weight rows, the weights as f16 widened to f32); scale: the weights'."""
    w = (rng.standard_normal((N, K)) * scale).astype(np.float32)
    raw = ref.quantize(w, type_name)
    w16 = ref.dequantize(raw, type_name, K).reshape(N, K).astype(np.float16)
    return rng.standard_normal((M, K)).astype(np.float16), raw, w16.astype(np.float32)


CASES = [  # M, N, K, type, config (None: choose_quant_config), max_blocks[, weight scale]
    (70, 72, 512, "Q8_0", "64x2", 1),           # 2 tiles of one block, 4 slabs through 2 slots
    # Q8_0 in f16 arithmetic (q8_0_chunk): products down to f16's subnormals (|d q| < 2^-14)
    (20, 64, 256, "Q8_0", "64x2", 1, 1e-4),
    (130, 136, 768, "Q4_K", "128x2", 2),        # M and N clipped, 3 slabs per tile
    (60, 200, 256, "Q8_0", None, None),         # the default config, N clipped in its tile
    (40, 65, 256, "Q4_K", None, 1),             # default 128x4/g16/tma2: C rows of 260 bytes,
                                                # so the direct epilogue
    (140, 264, 256, "Q4_K", "64x3/g2/pp/tma2", 1),   # 2 x 5 tiles, ping-pong, TMA epilogue
    (40, 100, 512, "Q5_K", "64x2/tma3", 2),
    # the 32-value block formats on one awkward shape, each through another config
    *[(33, 65, 256, type_name, config, 1) for type_name, config in
      (("Q4_0", "64x2"), ("Q4_1", "128x2"), ("Q5_0", "64x2"), ("Q5_1", "64x3"))],
    # one raw slot (each slab loaded once the last is dequantized), three (two slabs ahead)
    (70, 72, 512, "Q8_0", "64x2/raw1", 1),
    (130, 72, 1024, "Q4_K", "64x2/raw3", 2),
    # 256-row tiles (both consumer warpgroups on one tile): 2 x 2 tiles, the last rows clipped
    (300, 72, 512, "Q8_0", "64x2/m256", 1),
    (200, 136, 512, "Q4_K", "128x2/m256/tma2", 2),
    (260, 40, 2048, "Q6_K", "64x3/g2/m256/raw1", 1),
    # 210-byte super-blocks: slabs at every even offset from their 16-byte floor (box 224 B)
    (70, 72, 2048, "Q6_K", "64x2", 1),
    (33, 132, 2048, "Q3_K", "128x3/tma2", 2),
    (33, 65, 1024, "Q2_K", "64x2", 1),
]


@pytest.mark.parametrize("case", CASES)
def test_gemm_hopper_quant_bit_exact_on_cpu(case, rng, cpu_device):
    M, N, K, type_name, config, max_blocks, *scale = case
    a, raw, w32 = _inputs(rng, M, N, K, type_name, *scale)
    out = pk.full((M, N), np.nan, np.float32)                          # poisoned
    Q.gemm_hopper_quant(pk.to_device(a), pk.to_device(raw), type_name, out=out,
                        config=config, max_blocks=max_blocks)
    want = k_order_reference(a.astype(np.float32), w32)
    np.testing.assert_array_equal(out.numpy().view(np.uint32), want.view(np.uint32))


@pk.kernel
def _chunks_both_ways(w: Ptr["WT"], fast: Ptr[u32], slow: Ptr[u32], row_words: i32, chunks: i32,
                      FMT: Const[int], WT: Const[pk.dtype]):
    """Chunk i (row i // 32, values 8 (i % 32)..) by dequant_chunk and by decode8 + pack."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < chunks:
        wrow, v = (i // 32) * row_words, 8 * (i % 32)
        f0, f1, f2, f3 = dequant_chunk(w, wrow, v, FMT)
        v0, v1, v2, v3, v4, v5, v6, v7 = decode8(FMT, w, wrow, v)
        pk.store_vec(fast, 4 * i, (f0, f1, f2, f3))
        pk.store_vec(slow, 4 * i, (pk.pack_f16x2(v0, v1), pk.pack_f16x2(v2, v3),
                                   pk.pack_f16x2(v4, v5), pk.pack_f16x2(v6, v7)))


# where the f16 scales sit in a block (kept finite: random bytes there could be NaN / inf)
SCALES = {"Q8_0": (0, 1), "Q4_K": (0, 2), "Q6_K": (104, 1)}     # (first u16, count)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q6_K"])
def test_fast_chunks_equal_decode8_on_random_bytes(type_name, rng, cpu_device):
    """Every quant bit pattern (random bytes: Q4_K's 6-bit scales and mins, Q6_K's high
    bits and signed scales), scales from 2^-24 (f16 subnormals) to 2^4: the same bits."""
    fmt = get_format(type_name)
    rows, per = 64, 256 // fmt.block_elems
    raw = np.frombuffer(rng.bytes(rows * per * fmt.block_bytes), np.uint8).copy()
    halves = raw.view(np.uint16).reshape(rows * per, -1)
    at, count = SCALES[type_name]
    scales = 2.0 ** rng.uniform(-24, 4, (rows * per, count)) * rng.choice([-1, 1], (rows * per,
                                                                                     count))
    halves[:, at:at + count] = scales.astype(np.float16).view(np.uint16)
    words = pk.to_device(raw.view(Q.word_dtype(type_name)))
    fast, slow = pk.full((rows * 128,), 0xFFFFFFFF, np.uint32), pk.zeros((rows * 128,), np.uint32)
    _chunks_both_ways[(rows * 32 + 127) // 128, 128](
        words, fast, slow, words.size // rows, rows * 32, fmt.id, words.dtype)
    np.testing.assert_array_equal(fast.numpy(), slow.numpy())


def test_q8_0_weights_round_to_f16_within_half_an_ulp(rng):
    """The documented error of the f16 weights: d q (f32, exact) rounded once to 11 bits:
    at most 2^-11 relative for normal f16 results, 2^-25 absolute below 2^-14."""
    w = (rng.standard_normal((64, 1024)) * rng.choice([1e-4, 1e-2, 1.0], (64, 1))).astype(
        np.float32)
    raw = ref.quantize(w, "Q8_0")
    exact = ref.dequantize(raw, "Q8_0", 1024).astype(np.float64)
    err = np.abs(exact.astype(np.float16).astype(np.float64) - exact)
    assert np.all(err <= np.maximum(np.abs(exact) * 2.0 ** -11, 2.0 ** -25))


@pytest.mark.gpu
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q4_0"])
@pytest.mark.parametrize("config", [None, "128x4", "128x3/g16/pp/tma2", "64x2", "128x3/m256",
                                    "64x4/g16/m256/tma2"])
@pytest.mark.parametrize("M, N, K", [(512, 1024, 4096), (300, 700, 2048)])
def test_gemm_hopper_quant_gpu_is_gemm_hopper_on_f16_weights(M, N, K, type_name, config, rng,
                                                             cuda_device):
    """Same consumers and tiles, same f16 operands: the same bits as gemm_hopper on the
    dequantized weights, and both within K 2^-24 sum |a w| of the exact product."""
    a, raw, w32 = _inputs(rng, M, N, K, type_name)
    qc = Q.choose_quant_config(type_name) if config is None else Q.QuantConfig.parse(config)
    if not Q._fits(qc, type_name):      # e.g. Q8_0's 34-byte blocks in 64x4/g16/m256/tma2
        with pytest.raises(ValueError, match="bytes of shared memory; a block has"):
            Q.gemm_hopper_quant(pk.to_device(a), pk.to_device(raw), type_name, config=qc)
        return
    got = Q.gemm_hopper_quant(pk.to_device(a), pk.to_device(raw), type_name, config=qc,
                              out=pk.full((M, N), np.nan, np.float32)).numpy()
    # 256-row tiles run the same m64nBNk16 wgmmas in the same k order as bn-wide gemm_hopper
    same = G.gemm_hopper(pk.to_device(a), pk.to_device(w32.astype(np.float16)),
                         config=qc.gemm._replace(pingpong=False),
                         out=pk.full((M, N), np.nan, np.float32)).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), same.view(np.uint32))
    a64, w64 = a.astype(np.float64), w32.astype(np.float64)
    bound = K * F32_EPS * (np.abs(a64) @ np.abs(w64).T)
    assert (np.abs(got - a64 @ w64.T) <= bound).all()


def test_config_choice_fits():
    for type_name in Q.SERVED:
        qc = Q.choose_quant_config(type_name)
        assert Q.quant_shared_bytes(qc, type_name) <= G.SHARED_LIMIT - 128
    # Q8_0's raw slabs (2 x 128 x 272 B) leave no room for the epilogue buffers at 4 stages
    assert Q.choose_quant_config("Q8_0") == Q.QuantConfig(G.GemmConfig(128, 4, 16))
    assert Q.choose_quant_config("Q4_K").gemm == G.GemmConfig(128, 4, 16, False, 2)
    assert Q.choose_quant_config("Q6_K").gemm == G.GemmConfig(128, 4, 16, False, 2)
    # 256-row slots: 3 x (256 + 128) x 128 B of ring, 2 x 128 x 272 B of Q8_0 slabs
    qc = Q.QuantConfig.parse("128x3/m256")
    assert Q.quant_shared_bytes(qc, "Q8_0") == 3 * 384 * 128 + 1024 + 2 * 128 * 272


def test_config_strings():
    qc = Q.QuantConfig.parse("128x3/g16/raw3/m256/tma2")
    assert qc == Q.QuantConfig(G.GemmConfig(128, 3, 16, False, 2), 3, 256)
    assert str(qc) == "128x3/g16/tma2/raw3/m256" and str(Q.QuantConfig.parse("64x2")) == "64x2"
    assert Q.as_quant_config((64, 2)) == Q.QuantConfig(G.GemmConfig(64, 2))
    # whole 16 bytes: the slab itself; else it plus the largest offset from its 16-byte floor
    assert [Q.box_bytes(t) for t in ("Q8_0", "Q4_K", "Q6_K", "Q3_K", "Q2_K")] == \
        [272, 144, 224, 128, 96]


def test_argument_errors(cpu_device):
    a = pk.to_device(np.zeros((64, 256), np.float16))
    q8 = pk.to_device(np.zeros((64, 272), np.uint8))
    with pytest.raises(ValueError, match="MXFP4 is not served"):
        Q.gemm_hopper_quant(a, pk.to_device(np.zeros((64, 136), np.uint8)), "MXFP4")
    with pytest.raises(ValueError, match="K = 288 must be a positive multiple of 256"):
        Q.gemm_hopper_quant(pk.to_device(np.zeros((64, 288), np.float16)), q8, "Q8_0")
    with pytest.raises(TypeError, match="a must be an f16"):
        Q.gemm_hopper_quant(pk.to_device(np.zeros((64, 256), np.float32)), q8, "Q8_0")
    with pytest.raises(ValueError, match=r"w_raw must be uint8 \(N, 144\)"):
        Q.gemm_hopper_quant(a, q8, "Q4_K")
    with pytest.raises(ValueError, match="K must be a multiple of 2048"):
        Q.gemm_hopper_quant(pk.to_device(np.zeros((64, 1024), np.float16)),
                            pk.to_device(np.zeros((64, 840), np.uint8)), "Q6_K")
    with pytest.raises(ValueError, match="out must be a"):
        Q.gemm_hopper_quant(a, q8, "Q8_0", out=pk.empty((64, 63), np.float32))


CONFIG_ERRORS = [  # config, the error's words (Q8_0 weights, N = 66: 264-byte rows of C)
    ("256x4", "bytes of shared memory"),
    ("64x2/tma2", "multiple of 16; use epilogue=0"),
    ("256x1/pp", "pingpong needs bn <= 128"),
    ((96, 2), "bn must be 64, 128, 192 or 256"),
    ("64x2/raw0", "raw stages >= 1"),
    ("64x2/rawx", "takes a number of raw slots"),
    ("128x4/raw3", "128x4/raw3 with Q8_0 needs"),
    ("64x2/m192", "bm 128 or 256"),
    ("192x1/m256", "so bn must be at most 128"),
    ("64x2/pp/m256", "pingpong needs bn <= 128 and bm 128"),
    # the ring and raw slabs alone are 232448 bytes, the block's whole budget: the mbarriers
    # tip it over (an H200 refused this launch before the count included them)
    ("64x4/g16/m256/tma2", "with Q8_0 needs 232560 bytes"),
]


@pytest.mark.parametrize("config, message", CONFIG_ERRORS)
def test_config_errors(config, message, cpu_device):
    a = pk.to_device(np.zeros((64, 256), np.float16))
    q8 = pk.to_device(np.zeros((66, 272), np.uint8))
    with pytest.raises(ValueError, match=message):
        Q.gemm_hopper_quant(a, q8, "Q8_0", config=config)


@pytest.mark.parametrize("type_name, config", [("Q8_0", "128x4/g16"), ("Q8_0", "128x3/raw3"),
                                               ("Q4_K", "128x4/g16/tma2"),
                                               ("Q4_K", "128x3/pp/tma2"), ("Q5_K", "64x2"),
                                               ("Q6_K", "128x4/g16/tma2"),
                                               ("Q4_K", "128x3/g16/m256/tma2")])
def test_gemm_hopper_quant_assembles_for_sm90a(type_name, config, assemble):
    # the warpgroups' setmaxnreg counts fit the registers the block owns (issue 43's hang)
    assert 128 * K.PRODUCER_REGS + 256 * K.CONSUMER_REGS <= 384 * pk.entry_registers(384, 1)
    qc = Q.QuantConfig.parse(config)
    cfg = qc.gemm
    ptx = Q.gemm_q_tn.ptx("sm_90a", FMT=get_format(type_name).id,
                          WT=np.dtype(Q.word_dtype(type_name)), SB=Q.slab_bytes(type_name),
                          BOXB=Q.box_bytes(type_name), RAW=qc.raw_stages, BN=cfg.bn,
                          STAGES=cfg.stages, GROUP_M=cfg.group_m, PINGPONG=int(cfg.pingpong),
                          EPI=cfg.epilogue, BMQ=qc.bm)
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.bn}k16.f32.f16.f16" in ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx
    assert f"setmaxnreg.dec.sync.aligned.u32 {K.PRODUCER_REGS}" in ptx and ".maxntid 384" in ptx
    assert Q.quant_shared_bytes(qc, type_name) <= G.SHARED_LIMIT
    assemble(ptx, "sm_90a")
