"""TMA in PTX: a pk.TensorMap parameter is `.param .align 64 .b8 name[128]` whose address
reaches cp.async.bulk.tensor through cvta.param (never a copy to local memory); ptxas accepts
loads of 1..5 dimensions, multicast, stores, bulk groups and prefetch.tensormap for sm_90,
sm_90a and later; misuse is a compile error; pk.tensor_map's errors name the violated rule;
runtime misuse is reported on the CPU target."""
import re

import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32, u64
from pykernel.errors import KernelRuntimeError, KernelSourceError, LaunchError

TMA_ARCHS = [a for a in pk.SUPPORTED_ARCHS if int(a[3:]) >= 90] + ["sm_90a"]


@pk.kernel
def every_tma_form(tm: pk.TensorMap, out: Ptr[f32], x: i32, mask: i32, MULTICAST: Const[bool]):
    tile = pk.shared_array(f32, 1024, align=128)
    bar = pk.shared_array(u64, 1)
    pk.prefetch_tensormap(tm)
    if pk.thread_idx.x == 0:
        pk.mbarrier_init(bar, 0, 1)
        pk.fence_mbarrier_init()
        pk.mbarrier_arrive_expect_tx(bar, 0, 5 * 64)
        pk.tma_load(tile, 0, tm, (x,), bar, 0)
        pk.tma_load(tile, 64, tm, (x, 1), bar, 0)
        pk.tma_load(tile, 128, tm, (x, 1, 2), bar, 0)
        pk.tma_load(tile, 256, tm, (x, 1, 2, 3), bar, 0)
        pk.tma_load(tile, 512, tm, (x, 1, 2, 3, 4), bar, 0)
        if MULTICAST:
            pk.tma_load(tile, 768, tm, (x, 7), bar, 0, multicast=mask)
        pk.mbarrier_wait(bar, 0, 0)
        pk.fence_proxy_async()
        pk.tma_store(tm, (x, 2), tile, 0)
        pk.bulk_commit_group()
        pk.bulk_wait_group_read(0)
        pk.bulk_wait_group(0)
    out[0] = tile[pk.thread_idx.x]


@pytest.mark.parametrize("arch", TMA_ARCHS)
def test_tma_ptx_assembles(arch, assemble):
    ptx = every_tma_form.ptx(arch, MULTICAST=arch == "sm_90a")
    assert re.search(r"\.param \.align 64 \.b8 \w+_param_0\[128\]", ptx)
    assert "cvta.param.u64" in ptx and "__local_depot" not in ptx   # the map is not copied
    for rank, coords in ((1, "{%r\\d+}"), (2, "{%r\\d+, %r\\d+}")):
        pattern = (rf"cp\.async\.bulk\.tensor\.{rank}d\.shared::cluster\.global\.tile\."
                   rf"mbarrier::complete_tx::bytes \[%r\d+\], \[%rd\d+, {coords}\], \[%r\d+\];")
        assert re.search(pattern, ptx), pattern
    for instr in ("cp.async.bulk.tensor.5d.shared::cluster", "prefetch.tensormap [%rd",
                  "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%rd",
                  "cp.async.bulk.commit_group;", "cp.async.bulk.wait_group.read 0;",
                  "cp.async.bulk.wait_group 0;"):
        assert instr in ptx, instr
    if arch == "sm_90a":
        assert ".multicast::cluster [%r" in ptx
    assemble(ptx, arch)


def test_coordinates_reverse_into_ptx_order():
    """(x, 1) in the kernel's (numpy) order is {1, x} in PTX's innermost-first order."""
    ptx = every_tma_form.ptx("sm_90", MULTICAST=False)
    two_d = next(line for line in ptx.splitlines() if "tensor.2d.shared" in line)
    x_reg = re.search(r"ld\.param\.b32 \t(%r\d+), \[every_tma_form\w*_param_2\]", ptx).group(1)
    assert two_d.split("{")[1].split("}")[0].split(", ")[1] == x_reg


def _source_error(body, match):
    src = f"def bad(tm: pk.TensorMap, out: Ptr[f32]):\n" \
          f"    tile = pk.shared_array(f32, 64, align=128)\n" \
          f"    bar = pk.shared_array(u64, 1)\n    {body}\n"
    return src, match


@pytest.mark.parametrize("body,match", [
    ("pk.tma_load(out, 0, tm, (0, 0), bar, 0)", "copies into shared memory"),
    ("pk.tma_load(tile, 0, out, (0, 0), bar, 0)", "expected a pk.TensorMap parameter"),
    ("pk.tma_load(tile, 0, tm, (0, 0, 0, 0, 0, 0), bar, 0)", "1..5 dimensions"),
    ("pk.tma_load(tile, 0, tm, (0, 1.5), bar, 0)", "used where i32 is expected"),
    ("pk.tma_load(tile, 0, tm, (0, out[0]), bar, 0)", "coordinates are integers"),
    ("pk.tma_load(tile, 0, tm, 3, bar, 0)", "coordinates are a tuple"),
    ("pk.tma_load(tile, 0, tm, (0,), bar, 0, multicast=0)", "mask of cluster ranks"),
    ("pk.tma_store(tm, (0,), out, 0)", "copies from shared memory"),
    ("pk.bulk_wait_group(64)", "compile-time int 0..63"),
    ("pk.shared_array(f32, 64, align=48)", "power of two in 16..1024"),
])
def test_tma_misuse_is_a_source_error(tmp_path, body, match):
    path = tmp_path / "bad_tma.py"
    path.write_text("import pykernel as pk\nfrom pykernel import Ptr, f32, u64\n\n\n@pk.kernel\n"
                    + _source_error(body, match)[0])
    namespace = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    import linecache
    linecache.checkcache(str(path))
    with pytest.raises(KernelSourceError, match=match) as info:
        namespace["bad"].ptx("sm_90")
    assert "bad_tma.py:9:" in str(info.value)


def test_tma_needs_sm90():
    with pytest.raises(pk.errors.UnsupportedArchError, match="needs sm_90"):
        every_tma_form.ptx("sm_89", MULTICAST=False)


@pytest.mark.parametrize("make,match", [
    (lambda: pk.tensor_map(pk.zeros((8, 10), np.float32), (4, 8)), "multiples of 16 bytes"),
    (lambda: pk.tensor_map(pk.zeros((8, 512), np.float16), (4, 512)), r"1\.\.256"),
    (lambda: pk.tensor_map(pk.zeros((8, 64), np.float32), (4, 4, 4)), "the box has 3"),
    (lambda: pk.tensor_map(pk.zeros((8, 64), np.float32), (4, 2)), "multiple of 16"),
    (lambda: pk.tensor_map(pk.zeros((8, 64), np.float32), (4, 64), swizzle=128),
     "at most 128 bytes"),
    (lambda: pk.tensor_map(pk.zeros((8, 64), np.float32), (4, 8), swizzle=16), "swizzle must"),
    (lambda: pk.tensor_map(pk.zeros((8, 64), np.int32), (4, 8), oob_fill="nan"),
     "needs a float array"),
    (lambda: pk.tensor_map(pk.zeros((2,) * 6 + (16,), np.uint8), (1,) * 6 + (16,)),
     r"1\.\.5 dimensions"),
    (lambda: pk.tensor_map(np.zeros((8, 64), np.float32), (4, 8)), "device array"),
    (lambda: pk.tensor_map(pk.zeros((8, 64), np.float32), (4, 8), interleave="32B"),
     "interleaved"),
    (lambda: pk.tensor_map(pk.zeros((8, 64), np.float32), (4, 8), l2_promotion=32),
     "l2_promotion"),
])
def test_tensor_map_errors_name_the_rule(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pk.kernel
def load_rank2(tm: pk.TensorMap, out: Ptr[f32], OFFSET: Const[int]):
    tile = pk.shared_array(f32, 256, align=128)
    bar = pk.shared_array(u64, 1)
    if pk.thread_idx.x == 0:
        pk.mbarrier_init(bar, 0, 1)
        pk.mbarrier_arrive_expect_tx(bar, 0, 64)
        pk.tma_load(tile, OFFSET, tm, (0, 0), bar, 0)
        pk.mbarrier_wait(bar, 0, 0)
        out[0] = tile[OFFSET]


@pk.kernel
def load_at_column(tm: pk.TensorMap, out: Ptr[f32], x: i32):
    tile = pk.shared_array(f32, 256, align=128)
    bar = pk.shared_array(u64, 1)
    if pk.thread_idx.x == 0:
        pk.mbarrier_init(bar, 0, 1)
        pk.mbarrier_arrive_expect_tx(bar, 0, 64)
        pk.tma_load(tile, 0, tm, (0, x), bar, 0)
        pk.mbarrier_wait(bar, 0, 0)
        out[0] = tile[0]


def test_cpu_refuses_an_innermost_coordinate_off_16_bytes():
    # an H200 traps (illegal instruction) on an f32 box at column 1, 2 or 30 and loads it at
    # 0, 4, 8, 12, -4 (measured 2026-11-28): the CPU target reports what the GPU would crash on
    previous = pk.current_device()
    pk.set_device("cpu")
    try:
        out = pk.zeros(1, np.float32)
        tm = pk.tensor_map(pk.to_device(np.arange(64, dtype=np.float32).reshape(4, 16)),
                           (1, 16))
        load_at_column[1, 32](tm, out, -4)
        assert out.numpy()[0] == 0.0            # out of bounds: zero fill
        load_at_column[1, 32](tm, out, 4)
        assert out.numpy()[0] == 4.0
        with pytest.raises(KernelRuntimeError, match="innermost coordinate"):
            load_at_column[1, 32](tm, out, 1)
    finally:
        pk.set_device(previous)


@pk.kernel
def store_at(tm: pk.TensorMap, y: i32):
    tile = pk.shared_array(f32, 16, align=128)
    if pk.thread_idx.x == 0:
        for k in range(16):
            tile[k] = 1.0
        pk.fence_proxy_async()
        pk.tma_store(tm, (y, 0), tile, 0)
        pk.bulk_commit_group()
        pk.bulk_wait_group(0)


def test_cpu_refuses_a_negative_store_coordinate():
    # an H200 traps on a store at row -1 or column -4 and clips one past the far edges
    # (measured 2026-11-28): the CPU target reports the first as TMA misuse
    previous = pk.current_device()
    pk.set_device("cpu")
    try:
        dst = pk.zeros((4, 16), np.float32)
        tm = pk.tensor_map(dst, (1, 16))
        store_at[1, 32](tm, 3)
        assert dst.numpy()[3].tolist() == [1.0] * 16
        with pytest.raises(KernelRuntimeError, match="negative store coordinate"):
            store_at[1, 32](tm, -1)
    finally:
        pk.set_device(previous)


def test_cpu_reports_runtime_misuse():
    previous = pk.current_device()
    pk.set_device("cpu")
    try:
        _misuse_on_cpu()
    finally:
        pk.set_device(previous)


def _misuse_on_cpu():
    out = pk.zeros(1, np.float32)
    two_d = pk.tensor_map(pk.zeros((4, 16), np.float32), (1, 16))
    three_d = pk.tensor_map(pk.zeros((2, 4, 16), np.float32), (1, 1, 16))
    with pytest.raises(KernelRuntimeError, match="TMA.*128-byte aligned"):
        load_rank2[1, 32](two_d, out, 4)              # 16 bytes into the tile
    with pytest.raises(KernelRuntimeError, match="rank differs"):
        load_rank2[1, 32](three_d, out, 0)
    with pytest.raises(LaunchError, match="parameter 'tm' expects a tensor map"):
        load_rank2[1, 32](pk.zeros((4, 16), np.float32), out, 0)
