"""stdlib_kernels.quant.reference: bit-exact against ggml's oracle data, sane on fresh inputs."""
import math
import warnings

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from stdlib_kernels.quant import FORMATS, reference as ref
from stdlib_kernels.quant.reference_numerics import F32, nearest_int, round_clip

from shared_data import GOLDEN as _GOLDEN_DIR, require

GOLDEN = _GOLDEN_DIR / "ggml-quants-seed1.npz"
GOLDEN_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "Q1_0"]
ALL_TYPES = ["F32", "F16", "BF16", "Q8_1"] + GOLDEN_TYPES
F16_SCALED = [t for t in ALL_TYPES if t not in ("F32", "F16", "BF16")]
# Upper bounds on per-row RMS(dequantize(quantize(x)) - x) / RMS(x) for Gaussian rows; measured
# values are about 2/3 of these (Q1_0's is the 1-bit limit sqrt(1 - 2/pi) = 0.60).
RMS_BOUND = {"F32": 0.0, "F16": 1e-3, "BF16": 4e-3, "Q8_0": 0.01, "Q8_1": 0.01, "Q6_K": 0.03,
             "Q5_K": 0.06, "Q5_0": 0.07, "Q5_1": 0.06, "Q4_K": 0.11, "Q4_0": 0.13,
             "Q4_1": 0.12, "Q3_K": 0.22, "Q2_K": 0.40, "Q1_0": 0.68}


@pytest.fixture(scope="module")
def golden():
    return np.load(require(GOLDEN))


def _row_len(type_name: str, blocks: int = 4) -> int:
    return max(256, ref.block_size(type_name)[0] * blocks)


@pytest.mark.parametrize("type_name", GOLDEN_TYPES)
def test_quantize_matches_ggml_bytes(golden, type_name):
    ours = ref.quantize(golden["x"], type_name)
    theirs = golden[type_name]
    differ = np.argwhere(ours != theirs)
    assert ours.shape == theirs.shape
    assert differ.size == 0, f"{type_name}: {len(differ)} bytes differ, first at (row, byte) " \
                             f"{differ[:5].tolist()}"


@pytest.mark.parametrize("type_name", GOLDEN_TYPES)
def test_dequantize_matches_ggml_floats(golden, type_name):
    ours = ref.dequantize(golden[type_name], type_name, golden["x"].shape[1])
    theirs = golden[f"{type_name}_deq"]
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_round_trip_error_is_bounded(rng, seed, type_name):
    n = _row_len(type_name)
    scales = np.exp(rng.uniform(-6, 6, size=(45, 1)))  # rows spanning ~5 decades of magnitude
    x = (rng.standard_normal((45, n)) * scales).astype(np.float32)
    raw = ref.quantize(x, type_name)
    assert raw.dtype == np.uint8 and raw.shape == (45, ref.row_bytes(type_name, n))
    y = ref.dequantize(raw, type_name, n)
    rel = np.sqrt(np.mean((y.astype(np.float64) - x) ** 2, axis=1) / np.mean(
        x.astype(np.float64) ** 2, axis=1))
    worst = int(rel.argmax())
    assert rel[worst] <= RMS_BOUND[type_name], \
        f"seed {seed}: {type_name} row {worst} relative RMS error {rel[worst]:.4f}"


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_quantize_is_per_row_and_deterministic(rng, seed, type_name):
    n = _row_len(type_name)
    x = rng.standard_normal((6, n)).astype(np.float32)
    whole = ref.quantize(x, type_name)
    for i in (0, 5):
        np.testing.assert_array_equal(ref.quantize(x[i], type_name)[0], whole[i],
                                      err_msg=f"seed {seed}: {type_name} row {i}")
    flat = ref.dequantize(whole.tobytes(), type_name, n)
    np.testing.assert_array_equal(flat, ref.dequantize(whole, type_name, n))


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_all_zero_rows_decode_to_zero(type_name):
    n = _row_len(type_name)
    y = ref.dequantize(ref.quantize(np.zeros((3, n), np.float32), type_name), type_name, n)
    np.testing.assert_array_equal(y, 0.0)


# values large enough that no f16 scale is subnormal (K-quant super-block scales are ~x/2000,
# and f16 subnormals below 6e-5 carry few bits: ggml loses precision there too)
@pytest.mark.parametrize("value", [0.5, -3.25, 100.0])
@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_constant_rows_stay_constant(type_name, value):
    n = _row_len(type_name)
    value = F32(value)
    y = ref.dequantize(ref.quantize(np.full((2, n), value, np.float32), type_name), type_name, n)
    # the block scale goes through f16 (11 significant bits), and the K-quant scales also
    # through 6 or 4-bit sub-scales; a constant row must come back within that rounding
    tol = 0.0 if type_name == "F32" else 2e-3
    np.testing.assert_allclose(y, value, rtol=tol, atol=0, err_msg=type_name)
    assert np.ptp(y) <= abs(value) * 1e-3, f"{type_name}: constant row decoded unevenly"


def _no_warnings(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args)


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_huge_values_overflow_like_ggml(rng, seed, type_name):
    n = _row_len(type_name)
    x = (rng.standard_normal((2, n)) * 1e30).astype(np.float32)
    raw = _no_warnings(ref.quantize, x, type_name)
    assert raw.shape == (2, ref.row_bytes(type_name, n))
    y = _no_warnings(ref.dequantize, raw, type_name, n)
    if type_name in ("F32", "BF16"):
        np.testing.assert_allclose(y, x, rtol=2 ** -8, err_msg=f"seed {seed}")
    elif type_name in ("F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q1_0"):
        # these store the first block's scale (or the value) as f16 first: it overflows to inf
        first = raw[:, :2].copy().view(np.float16)
        assert np.isinf(first).all(), f"seed {seed}: {type_name} scale {first.ravel()}"


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_tiny_values_flush_to_zero_without_garbage(rng, seed, type_name):
    n = _row_len(type_name)
    x = (rng.standard_normal((2, n)) * 1e-30).astype(np.float32)
    y = _no_warnings(ref.dequantize, _no_warnings(ref.quantize, x, type_name), type_name, n)
    if type_name in ("F32", "BF16"):
        np.testing.assert_allclose(y, x, rtol=2 ** -8, err_msg=f"seed {seed}")
    else:  # 1e-30 is far below the smallest f16, so every f16 value or scale is zero
        np.testing.assert_array_equal(y, 0.0, err_msg=f"seed {seed}: {type_name}")


def test_signed_zero_scales_follow_ggml():
    zeros = np.zeros((1, 32), np.float32)
    zeros[0, ::2] = -0.0
    for name in ("Q4_0", "Q5_0"):  # C keeps its initial max = +0, so d = +0 / -8 = -0
        assert ref.quantize(zeros, name)[0, :2].tobytes() == b"\x00\x80", name
    for name in ("Q4_1", "Q5_1"):  # min and max are the first element reaching them: -0 here
        header = ref.quantize(zeros, name)[0, :4].copy().view(np.float16)
        assert header[0] == 0 and not np.signbit(header[0]), name
        assert header[1] == 0 and np.signbit(header[1]), name


def test_q8_1_matches_a_scalar_model(rng, seed):
    x = rng.standard_normal((3, 128)).astype(np.float32) * np.float32(rng.uniform(0.01, 100))
    x[1, 32:64] = 0.0  # one all-zero block
    raw = ref.quantize_q8_1(x)
    assert raw.shape == (3, 128 // 32 * 36)
    for r in range(3):
        for b in range(4):
            block = raw[r, 36 * b: 36 * (b + 1)]
            expect = _q8_1_block_scalar(x[r, 32 * b: 32 * (b + 1)])
            assert block.tobytes() == expect, f"seed {seed}: row {r} block {b}"


def _q8_1_block_scalar(xs: np.ndarray) -> bytes:
    """One Q8_1 block computed one element at a time: q as llama.cpp's CUDA threads round it,
    s = d * sum(q) as ggml's CPU quantizer stores it."""
    amax = max(abs(float(v)) for v in xs)
    d = np.float32(amax) / np.float32(127)
    q = [0 if amax == 0 else int(math.copysign(math.floor(abs(float(v / d)) + 0.5), float(v)))
         for v in (np.float32(v) for v in xs)]
    header = np.array([d, d * np.float32(sum(q))], np.float32).astype(np.float16).tobytes()
    return header + np.array(q, np.int8).tobytes()


def test_q8_1_sum_field_is_the_sum_of_the_quantized_values(rng, seed):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    raw = ref.quantize_q8_1(x).reshape(-1, 36)
    sums = raw[:, 2:4].copy().view(np.float16).astype(np.float64).ravel()
    deq = ref.dequantize(raw.reshape(4, -1), "Q8_1", 64)
    d = raw[:, :2].copy().view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(deq.reshape(-1, 32), d * raw[:, 4:].view(np.int8))
    # s is the dequantized block's sum (d unrounded: ggml's CPU), to f16's half ulp of |s|
    d32 = np.abs(x.reshape(-1, 32)).max(axis=1).astype(np.float32) / np.float32(127)
    exact = d32.astype(np.float64) * raw[:, 4:].view(np.int8).sum(axis=1)
    np.testing.assert_allclose(sums, exact, rtol=2.0 ** -11, atol=0, err_msg=f"seed {seed}")
    # ... hence within the rounding of the 32 values (|x - d q| <= d / 2 each) of sum(x)
    bound = 16 * d32 * (1 + 2.0 ** -10) + np.abs(exact) * 2.0 ** -11
    assert np.all(np.abs(sums - x.reshape(-1, 32).sum(axis=1)) <= bound), f"seed {seed}"


def test_fast_rounding_equals_ggml_bit_trick(rng, seed):
    v = (rng.uniform(-4.0e6, 4.0e6, 200_000) * rng.choice([1e-6, 1e-3, 1.0], 200_000))
    v = np.concatenate([v, np.arange(-40, 40) + 0.5]).astype(np.float32)  # exact ties too
    for lo, hi in ((0, 15), (-32, 31), (-4, 3), (-5_000_000, 5_000_000)):
        exact = np.clip(nearest_int(v), lo, hi).astype(F32)
        np.testing.assert_array_equal(round_clip(v, lo, hi, True), exact, err_msg=f"seed {seed}")
        np.testing.assert_array_equal(round_clip(v, lo, hi, False), exact)


def test_nearest_int_rounds_half_to_even():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 3.5000002], np.float32)
    assert nearest_int(v).tolist() == [0, 2, 2, 0, -2, 2, 4]


def test_format_table_agrees_with_gguf():
    for name, fmt in FORMATS.items():
        assert fmt.ggml_type is GGMLQuantizationType[name]
        assert ref.block_size(name) == (fmt.block_elems, fmt.block_bytes)
        if name != "Q8_1":  # gguf-py still lists Q8_1 with f32 d and s (40 B)
            assert GGML_QUANT_SIZES[fmt.ggml_type] == (fmt.block_elems, fmt.block_bytes), name
    assert FORMATS["Q1_0"].ggml_type.value == 41
    assert ref.row_bytes("Q6_K", 4096) == 16 * 210


def test_kernel_tables_derive_from_the_format_table():
    """The named ids are the ggml ids, and each kernel family's type table is the registry's."""
    import importlib
    from stdlib_kernels import quant_blocks
    from stdlib_kernels.quant import formats as F
    from stdlib_kernels.quant import gemm_q8, gemm_q8_k, gemv_bulk, gemv_kernels
    from stdlib_kernels.quant.dequant_kernels import CODES
    from stdlib_kernels.quant.device import DEVICE_TYPES
    from stdlib_kernels.options import GEMV_MAX_TOKENS
    gemv = importlib.import_module("stdlib_kernels.quant.gemv")    # quant.gemv: the function
    gemv_mma = importlib.import_module("stdlib_kernels.quant.gemv_mma")
    for name, fmt in FORMATS.items():
        assert getattr(F, name) == fmt.id == int(GGMLQuantizationType[name])
        assert fmt.kernels <= set(F.FAMILIES) and fmt.layout
    names = lambda family: {f.name for f in F.serving(family)}  # noqa: E731
    assert set(CODES) == set(DEVICE_TYPES) == names(F.DEQUANT)
    assert names(F.DEQUANT) - names(F.QUANTIZE) == {"MXFP4"}   # no device quantizer (formats.py)
    assert all(CODES[t] == FORMATS[t].id for t in CODES)
    assert set(gemv.F32_TYPES) == names(F.GEMV) and set(gemv.Q8_1_TYPES) == names(F.GEMV_Q8)
    assert set(gemv_bulk.BULK_TYPES) == names(F.GEMV_BULK) == set(gemv_bulk.ROW_ALIGN) == \
        set(gemv_bulk.UNIT_BLOCKS) == set(gemv_bulk.TUNED)
    assert set(gemm_q8_k.SMALL_KTILES) == names(F.GEMM_Q8_K)
    assert set(gemv_mma.MMA_GEMV_TYPES) == set(gemv_mma.KERNELS) == names(F.GEMV_MMA)
    assert set(gemm_q8.INT8_GEMM_TYPES) == set(gemm_q8.TUNED_TILES) == names(F.GEMM_Q8)
    assert set(gemm_q8_k.SUPERBLOCK_GEMM_TYPES) == set(gemm_q8_k.TUNED_KTILES) == \
        names(F.GEMM_Q8_K)
    assert gemm_q8_k.STEP_BYTES["Q8_0"] == 8 * 34 and gemv_bulk.BLOCK_BYTES["Q6_K"] == 210
    assert set(quant_blocks.TYPE_IDS) == names(F.EMBED)
    assert quant_blocks.BLOCK_SHAPES[F.Q4_K] == (256, 144)
    assert gemv_kernels.MAX_BATCH == GEMV_MAX_TOKENS
    assert min(gemv_kernels.Q4_0_PAIR, gemv.HALF_WORDS["F16"]) > max(F.type_ids(F.GEMV).values())
    with pytest.raises(ValueError, match="unknown kernel family"):
        F.serving("mxfp4_gemv")


@pytest.mark.parametrize("type_name,n", [("Q4_K", 100), ("Q8_0", 33), ("Q1_0", 64), ("Q6_K", 0)])
def test_bad_row_length_names_type_length_and_block(type_name, n):
    block = str(ref.block_size(type_name)[0])
    for call in (lambda: ref.quantize(np.ones((2, n), np.float32), type_name),
                 lambda: ref.row_bytes(type_name, n),
                 lambda: ref.dequantize(np.zeros(64, np.uint8), type_name, n)):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert type_name in message and str(n) in message and block in message, message


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0", "Q1_0", "F16"])
def test_truncated_buffer_reports_expected_and_given_bytes(type_name):
    n = _row_len(type_name)
    raw = ref.quantize(np.ones((3, n), np.float32), type_name)
    per_row = ref.row_bytes(type_name, n)
    with pytest.raises(ValueError, match=rf"{per_row}.*{3 * per_row - 1}"):
        ref.dequantize(raw.tobytes()[:-1], type_name, n)
    with pytest.raises(ValueError, match=rf"{per_row}.*{per_row - 2}"):
        ref.dequantize(raw[:, :-2], type_name, n)


def test_unknown_type_and_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="Q7_K.*Q4_K"):
        ref.quantize(np.ones(256, np.float32), "Q7_K")
    with pytest.raises(ValueError, match=r"Q8_0.*\(2, 2, 32\)"):
        ref.quantize(np.ones((2, 2, 32), np.float32), "Q8_0")
    with pytest.raises(ValueError, match="Q8_0.*float32"):
        ref.dequantize(np.ones(34, np.float32), "Q8_0", 32)
