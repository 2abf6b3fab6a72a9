"""wgmma / setmaxnreg PTX: assembled by ptxas for sm_90a, `.target sm_90a` only in kernels
that use them, and a compile error naming sm_90a for any other arch."""
import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32, u8, u32
from tests.kernels.test_wgmma import wgmma_gemm


@pytest.mark.parametrize("kind,n,swizzle,a_regs", [
    ("f16", 256, 0, False), ("bf16", 8, 128, True), ("e4m3", 64, 64, False),
    ("e5m2", 16, 32, True), ("s8", 24, 0, False), ("u8", 256, 128, True),
    ("s8.u8", 32, 0, False), ("e4m3.e5m2", 8, 0, False)])
def test_wgmma_assembles_for_sm90a(kind, n, swizzle, a_regs, assemble):
    ptx = wgmma_gemm.ptx("sm_90a", n=n, kbytes=max(swizzle, 64), swizzle=swizzle, kind=kind,
                         float_acc=kind[0] in "fbe", a_regs=a_regs)
    a, b = (kind.split(".") * 2)[:2] if "." in kind else (kind, kind)
    acc = "s32" if a in ("s8", "u8") else "f32"
    assert ".target sm_90a" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{n}k{16 if a in ('f16', 'bf16') else 32}." \
        f"{acc}.{a}.{b}" in ptx
    assert "wgmma.wait_group.sync.aligned 0" in ptx
    assemble(ptx, "sm_90a")


@pk.kernel(max_threads=128, min_blocks=1)
def producer(out: Ptr[f32]):
    pk.setmaxnreg_dec(40)
    out[pk.thread_idx.x] = 1.0


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
def test_wgmma_needs_sm90a(arch):
    with pytest.raises(pk.UnsupportedArchError) as err:
        wgmma_gemm.ptx(arch, n=8, kbytes=32, swizzle=0, kind="f16", float_acc=True,
                       a_regs=False)
    assert "needs sm_90a" in str(err.value) and "test_wgmma.py" in str(err.value)
    with pytest.raises(pk.UnsupportedArchError, match="setmaxnreg.dec needs sm_90a"):
        producer.ptx(arch)


def test_setmaxnreg_assembles(assemble):
    ptx = producer.ptx("sm_90a")
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in ptx
    assemble(ptx, "sm_90a")


@pk.kernel
def plain(out: Ptr[i32], x: Ptr[u32], y: Ptr[u8]):
    out[pk.thread_idx.x] = i32(x[0]) + i32(y[0])


def test_plain_kernels_keep_the_plain_target():
    assert ".target sm_90\n" in plain.ptx("sm_90") or ".target sm_90 " in plain.ptx("sm_90")
    assert ".target sm_90a" in plain.ptx("sm_90a")    # asked for explicitly


@pytest.mark.parametrize("bad,match", [
    ("pk.wgmma(acc, d, d, 'f8')", "kind must be"),
    ("pk.wgmma(acc, d, d, 's8')", "accumulators must be a pk.local_array"),
    ("pk.wgmma(small, d, d, 'f16')", "is not an N"),
    ("pk.wgmma(acc, d, d, 'f16.s8')", "kind must be"),
    ("pk.wgmma_desc(sm, 0, 8, 16, 0)", "multiple of 16"),
    ("pk.wgmma_desc(sm, 0, 16, 16, 16)", "swizzle must be"),
    ("pk.wgmma_wait_group(9)", "0..7"),
    ("pk.setmaxnreg_inc(20)", "multiple of 8 in 24..256"),
])
def test_wgmma_errors(bad, match, tmp_path):
    src = f'''import pykernel as pk
from pykernel import f32, u8


@pk.kernel
def k(x: pk.Ptr[f32]):
    sm = pk.shared_array(u8, 1024)
    acc = pk.local_array(f32, 4)
    small = pk.local_array(f32, 2)
    d = pk.wgmma_desc(sm, 0, 16, 16, 0)
    {bad}
'''
    path = tmp_path / "bad_wgmma.py"
    path.write_text(src)
    import importlib.util
    spec = importlib.util.spec_from_file_location("bad_wgmma", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(pk.KernelSourceError, match=match) as err:
        mod.k.ptx("sm_90a")
    assert "bad_wgmma.py:11:" in str(err.value) and "compiler" not in str(err.value)


@pytest.mark.parametrize("a_regs,swizzle", [(True, 128), (False, 0)])
def test_wgmma_trans_b_assembles(a_regs, swizzle, assemble):
    """trans_b sets imm-trans-b (the last immediate) to 1: after the scales with A from
    registers, after imm-trans-a 0 with A from a descriptor."""
    from tests.kernels.test_wgmma import wgmma_gemm_nmajor
    ptx = wgmma_gemm_nmajor.ptx("sm_90a", n=64, K=32, swizzle=swizzle, kind="f16",
                                a_regs=a_regs)
    tail = ", 1, 1, 1;" if a_regs else ", 1, 1, 0, 1;"
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in ptx
    assert all(line.rstrip().endswith(tail + " }") for line in ptx.splitlines()
               if "wgmma.mma_async" in line), tail
    assemble(ptx, "sm_90a")


def test_wgmma_trans_b_needs_16_bit_operands(tmp_path):
    src = '''import pykernel as pk
from pykernel import i32, u8


@pk.kernel
def k(x: pk.Ptr[i32]):
    sm = pk.shared_array(u8, 1024)
    acc = pk.local_array(i32, 4)
    d = pk.wgmma_desc(sm, 0, 16, 16, 0)
    pk.wgmma(acc, d, d, 's8', trans_b=True)
'''
    path = tmp_path / "bad_trans.py"
    path.write_text(src)
    import importlib.util
    spec = importlib.util.spec_from_file_location("bad_trans", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(pk.KernelSourceError, match="f16 and bf16 only") as err:
        mod.k.ptx("sm_90a")
    assert "bad_trans.py:10:" in str(err.value)
