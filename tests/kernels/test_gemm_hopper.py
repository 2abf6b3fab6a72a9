"""stdlib_kernels.gemm_hopper (TMA producer + wgmma consumer warpgroups): on the CPU target
bit-exact against numpy summing the f32 products in k order (what the emulation defines), on
awkward shapes (M, N not multiples of the tile, K not a multiple of 64, more K slices than ring
slots so the empty barriers are waited on), every option (tile widths, grouped tile order with
a short last group, ping-pong consumers with an odd number of tiles per block, the TMA
epilogue with its buffer count not dividing the boxes and boxes wholly past M or N), f16 and
bf16 inputs, f32 and bf16 outputs; on a GPU within the bound two f32 summation orders can
differ by; argument and config errors; the PTX of each option assembles for sm_90a."""
import numpy as np
import pytest
from gemm_oracles import k_order_reference

import pykernel as pk
from stdlib_kernels import gemm_hopper as G
from stdlib_kernels.elementwise import bf16_bits_reference

F32_EPS = 2.0 ** -24


def _inputs(rng, M, N, K, kind):
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    if kind == "f16":
        a, b = a.astype(np.float16), b.astype(np.float16)
        return a, b, a.astype(np.float32), b.astype(np.float32)
    a16, b16 = bf16_bits_reference(a), bf16_bits_reference(b)
    widen = lambda bits: (bits.astype(np.uint32) << 16).view(np.float32)
    return a16, b16, widen(a16), widen(b16)


CASES = [  # M, N, K, input, output, config (None: choose_config), max_blocks
    (128, 128, 128, "bf16", pk.f32, None, None),
    (200, 136, 192, "f16", pk.f32, None, 1),        # 4 tiles, one persistent block
    (130, 300, 72, "bf16", pk.bf16, (256, 3), 2),   # K = 72: a clipped second slice
    (65, 40, 320, "f16", pk.f32, (128, 2), None),   # 5 slices through 2 ring slots
    # tile rows 3 in groups of 2 (the last group 1 row), 2 columns of tiles, one block
    (300, 136, 136, "bf16", pk.f32, "128x2/g2", 1),
    # 6 tiles on 2 blocks: each block's warpgroups take 2 and 1 tiles; direct stores
    (300, 200, 136, "bf16", pk.f32, "128x2/pp", 2),
    # TMA epilogue: rows 65.. and columns 64.. past the edge (boxes skipped), M clipped
    (65, 40, 320, "f16", pk.f32, "128x2/tma2", None),
    # bf16 boxes of 64 columns, one partly past N = 296; 3 buffers for 4 boxes a tile
    (130, 296, 72, "bf16", pk.bf16, "256x3/g2/tma3", 2),
    # everything at once: 3 x 5 tiles of 128 x 64, groups of 3, ping-pong, 3 buffers
    (260, 264, 64, "f16", pk.f32, "64x3/g3/pp/tma3", 1),
]


@pytest.mark.parametrize("M, N, K, kind, out_dtype, config, max_blocks", CASES)
def test_gemm_hopper_bit_exact_on_cpu(M, N, K, kind, out_dtype, config, max_blocks, rng,
                                      cpu_device):
    a, b, a32, b32 = _inputs(rng, M, N, K, kind)
    storage = np.float32 if out_dtype is pk.f32 else np.uint16
    out = pk.full((M, N), np.nan if storage is np.float32 else 0xFFFF, storage)  # poisoned
    G.gemm_hopper(pk.to_device(a), pk.to_device(b), out=out, out_dtype=out_dtype,
                  config=config, max_blocks=max_blocks)
    want = k_order_reference(a32, b32)
    if out_dtype is pk.bf16:
        want = bf16_bits_reference(want)
    np.testing.assert_array_equal(out.numpy().view(np.uint32 if storage is np.float32
                                                   else np.uint16),
                                  want.view(np.uint32 if storage is np.float32 else np.uint16))


GPU_CONFIGS = [None, "256x4/g16/tma2", "256x3/tma5", "128x6/pp", "128x5/g16/pp/tma4"]


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS)
@pytest.mark.parametrize("M, N, K", [(4096, 4096, 4096), (1000, 1500, 520),
                                     (8192, 8192, 1024)])
def test_gemm_hopper_gpu_within_summation_bound(M, N, K, config, rng):
    previous = pk.current_device()
    pk.set_device("cuda")
    try:
        a, b, a32, b32 = _inputs(rng, M, N, K, "bf16")
        out = pk.full((M, N), np.nan, np.float32)
        c = G.gemm_hopper(pk.to_device(a), pk.to_device(b), out=out, config=config).numpy()
    finally:
        pk.set_device(previous)
    want = a32.astype(np.float64) @ b32.astype(np.float64).T
    # any order of K f32 additions: |error| <= K eps sum_k |a b| (to first order)
    bound = K * F32_EPS * (np.abs(a32).astype(np.float64) @ np.abs(b32).astype(np.float64).T)
    assert (np.abs(c - want) <= bound).all()


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS)
def test_gemm_hopper_gpu_bf16_out_is_rounded_f32_out(config, rng):
    """The same config accumulates in the same order whatever C's type, so its bf16 C is its
    f32 C rounded to nearest even (the epilogues' conversion and the TMA store of 2-byte
    boxes are checked, not the tensor cores)."""
    M, N, K = 1000, 1512, 520                      # N x 2 bytes a multiple of 16
    previous = pk.current_device()
    pk.set_device("cuda")
    try:
        a, b, _, _ = _inputs(rng, M, N, K, "bf16")
        a, b = pk.to_device(a), pk.to_device(b)
        c32 = G.gemm_hopper(a, b, out=pk.full((M, N), np.nan, np.float32), config=config)
        c16 = G.gemm_hopper(a, b, out=pk.full((M, N), 0xFFFF, np.uint16), out_dtype=pk.bf16,
                            config=config)
        np.testing.assert_array_equal(c16.numpy(), bf16_bits_reference(c32.numpy()))
    finally:
        pk.set_device(previous)


def test_config_choice():
    assert G.choose_config(4096, 4096) == G.CONFIGS["large"]
    assert G.choose_config(128, 128) == G.CONFIGS["small"]
    # C's rows of 4098 f32 are not whole 16 bytes: the same tiles, stored directly
    assert G.choose_config(4096, 4098) == G.CONFIGS["large"]._replace(epilogue=0)
    assert G.choose_config(4096, 4104, out_bytes=2) == G.CONFIGS["large"]
    assert G.shared_bytes(256, 4) <= 227 * 1024          # fits an H100/H200 block
    # 4 ring slots of 48 KiB and 2 boxes of 2 KiB for each of 8 consumer warps still fit
    assert G.shared_bytes(256, 4, 2) == 4 * 48 * 1024 + 8 * 2 * 2048 + 1024 <= 227 * 1024


def test_config_strings():
    cfg = G.GemmConfig.parse("128x4/g16/pp/tma2")
    assert cfg == G.GemmConfig(128, 4, group_m=16, pingpong=True, epilogue=2)
    assert str(cfg) == "128x4/g16/pp/tma2" and str(G.GemmConfig(256, 4)) == "256x4"
    for bad in ("256", "256x4/zz", "256x4/gx"):
        with pytest.raises(ValueError, match="is not BNxSTAGES"):
            G.GemmConfig.parse(bad)


def test_config_errors(cpu_device):
    a = pk.to_device(np.zeros((64, 64), np.float16))
    b = pk.to_device(np.zeros((36, 64), np.float16))       # N = 36: 72 bytes of bf16
    with pytest.raises(ValueError, match="bn must be at most 128"):
        G.gemm_hopper(a, a, config="256x4/pp")
    with pytest.raises(ValueError, match="bytes of shared memory"):
        G.gemm_hopper(a, a, config="256x4/tma3")
    with pytest.raises(ValueError, match="must be a multiple of 16; use epilogue=0"):
        G.gemm_hopper(a, b, out_dtype=pk.bf16, config="128x2/tma2")
    with pytest.raises(ValueError, match="bn must be 64, 128, 192 or 256"):
        G.gemm_hopper(a, a, config=(96, 2))


# (A's shape and dtype, B's shape and dtype, the error, what it says)
ARGUMENT_ERRORS = [
    (((64, 60), np.float16), ((64, 60), np.float16), ValueError, "K = 60 must be a multiple of 8"),
    (((64, 64), np.float16), ((64, 64), np.uint16), TypeError, "one element type"),
    (((64, 64), np.float32), ((64, 64), np.float32), TypeError, "f16 or bf16"),
    (((0, 64), np.float16), ((64, 64), np.float16), ValueError, "must be positive"),
    (((64, 64), np.float16), ((64, 72), np.float16), ValueError, "must share K"),
]


@pytest.mark.parametrize("a,b,error,message", ARGUMENT_ERRORS, ids=[e[3] for e in ARGUMENT_ERRORS])
def test_argument_errors(a, b, error, message, cpu_device):
    with pytest.raises(error, match=message):
        G.gemm_hopper(pk.to_device(np.zeros(*a)), pk.to_device(np.zeros(*b)))


@pytest.mark.parametrize("config", ["256x4", "128x4", "256x4/g16/tma2", "128x6/pp/tma2",
                                    "128x4/g8/pp"])
@pytest.mark.parametrize("out_dtype", [pk.f32, pk.bf16])
def test_gemm_hopper_assembles_for_sm90a(config, out_dtype, assemble):
    cfg = G.GemmConfig.parse(config)
    ptx = G.gemm_tn.ptx("sm_90a", C=out_dtype, KIND="bf16", BN=cfg.bn, STAGES=cfg.stages,
                        GROUP_M=cfg.group_m, PINGPONG=int(cfg.pingpong), EPI=cfg.epilogue)
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.bn}k16.f32.bf16.bf16" in ptx
    assert "setmaxnreg.dec.sync.aligned.u32 40" in ptx and ".maxntid 384" in ptx
    assert ("cp.async.bulk.tensor.2d.global.shared::cta" in ptx) == (cfg.epilogue > 0)
    assert G.shared_bytes(cfg.bn, cfg.stages, cfg.epilogue) <= 227 * 1024
    assemble(ptx, "sm_90a")
