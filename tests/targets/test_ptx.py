"""Every language-feature kernel compiles for every supported arch, and the PTX assembles with
ptxas (skipped, with the reason, where ptxas is absent). Also checks the PTX that key
constructs map to."""
import importlib.util
import os
import shutil
import subprocess

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32, u32

HERE = os.path.dirname(os.path.abspath(__file__))
PTXAS = shutil.which("ptxas")


def _feature_kernels():
    path = os.path.join(HERE, "..", "runtime", "test_cpu_language.py")
    spec = importlib.util.spec_from_file_location("language_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {name: k for name, k in vars(mod).items() if isinstance(k, pk.Kernel)}


KERNELS = _feature_kernels()
SPECS = {"generic_scale": {"T": np.float16, "DOUBLE": True},
         "block_reduce": {"BLOCK": 128}, "arrays_to_funcs": {"FMT": 3},
         "const_locals": {"D": 128}, "type_switch": {"T": np.float16},
         "const_in_store_index": {"D": 8}}


def assemble(ptx: str, arch: str, tmp_path) -> str:
    src = tmp_path / f"k_{arch}.ptx"
    src.write_text(ptx)
    proc = subprocess.run([PTXAS, f"-arch={arch}", "-v", str(src), "-o",
                           str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_feature_kernels_assemble(name, arch, tmp_path):
    ptx = KERNELS[name].ptx(arch, **SPECS.get(name, {}))
    assert f".target {arch}" in ptx
    if PTXAS is None:
        pytest.skip("ptxas not on PATH: PTX generated but not assembled")
    assemble(ptx, arch, tmp_path)


@pk.kernel
def tensor_core(a: Ptr[f32], out: Ptr[f32]):
    r = pk.mma_m16n8k16_f16(1, 2, 3, 4, 5, 6, a[0], a[1], a[2], a[3])
    s = pk.mma_m16n8k32_s8(1, 2, 3, 4, 5, 6, 0, 0, 0, 0)
    h = pk.mma_m16n8k16_s8(u32(7), u32(8), u32(9), s[0], s[1], s[2], s[3])
    out[0] = r[0] + f32(h[1])
    out[1] = f32(pk.dp4a(i32(7), i32(9), 1))
    out[2] = pk.fast.exp2(a[0]) + pk.fast.tanh(a[1]) + pk.fast.rsqrt(a[2])


@pytest.mark.parametrize("arch", [a for a in pk.SUPPORTED_ARCHS if a != "sm_75"])
def test_tensor_core_and_fast_math_ptx(arch, tmp_path):
    ptx = tensor_core.ptx(arch)
    for instr in ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                  "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
                  "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32", "dp4a.s32.s32",
                  "ex2.approx", "tanh.approx.f32", "rsqrt.approx"):
        assert instr in ptx, instr
    if PTXAS is None:
        pytest.skip("ptxas not on PATH")
    assemble(ptx, arch, tmp_path)


@pk.kernel
def pack_halves(a: Ptr[f32], out: Ptr[u32]):
    out[0] = pk.pack_f16x2(a[0], a[1])


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_pack_f16x2_is_one_instruction_on_sm80(arch, tmp_path):
    ptx = pack_halves.ptx(arch)
    assert ("cvt.rn.f16x2.f32" in ptx) == (arch != "sm_75"), arch
    if PTXAS is None:
        pytest.skip("ptxas not on PATH")
    assemble(ptx, arch, tmp_path)


def test_packed_ops_are_single_instructions():
    ptx = KERNELS["packed_ops"].ptx("sm_90")
    assert ptx.count("prmt.b32") == 2
    for op in ("add", "sub", "mul"):
        assert f"{op}.rn.f16x2" in ptx, op


def test_key_constructs_map_to_expected_ptx():
    ptx = KERNELS["block_reduce"].ptx("sm_90", BLOCK=128)
    assert "ld.global.nc" in ptx           # Ptr[f32, "ro"]
    assert "shfl.sync.bfly.b32" in ptx and "shfl.sync.down.b32" in ptx
    assert "bar.sync" in ptx
    assert ".shared .align 16" in ptx
    assert ".loc" in ptx                   # line info for profilers
    vec = KERNELS["vec_copy"].ptx("sm_90")
    assert "ld.global.nc.v4" in vec and "st.global.v4" in vec
    atom = KERNELS["atomics"].ptx("sm_90")
    assert "atom.global.add" in atom or "red.global.add" in atom


def test_compile_object_exposes_abi():
    c = pk.compile(KERNELS["block_reduce"], "sm_90", BLOCK=128)
    assert c.entry in c.ptx and c.entry.startswith("block_reduce")
    assert [p.name for p in c.params] == ["x", "out", "n"]
    assert [(p.kind, p.size, p.align) for p in c.params] == [("ptr", 8, 8), ("ptr", 8, 8),
                                                              ("scalar", 4, 4)]
    assert c.params[0].readonly and not c.params[1].readonly
    assert c.shared_bytes == 128 * 4


def test_ptx_has_no_llvm_abort_for_every_arch():
    # PTX ISA version chosen per arch (LLVM aborts the process on a mismatch)
    for arch in pk.SUPPORTED_ARCHS:
        assert ".version" in KERNELS["int_ops"].ptx(arch)


# the oldest PTX ISA that knows each arch (PTX ISA release notes), as docs/language.md says
OLDEST_PTX = {"sm_75": "6.3", "sm_80": "7.0", "sm_86": "7.1", "sm_89": "7.8", "sm_90": "7.8",
              "sm_100": "8.6", "sm_120": "8.7"}


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_plain_kernel_gets_the_oldest_ptx_version_of_its_arch(arch, assemble):
    ptx = KERNELS["int_ops"].ptx(arch)
    assert f".version {OLDEST_PTX[arch]}\n" in ptx
    assemble(ptx, arch)
