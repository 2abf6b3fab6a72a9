"""setmaxnreg on the CPU target keeps the hardware's register books (targets/cpu_regs.py): a
block owns threads x pk.entry_registers(max_threads, min_blocks) registers, a .dec gives to
its pool, an .inc waits for the pool. A split whose warps ask for more than the block owns
hangs the GPU (the second consumer warpgroup's .inc never returns: issue 43's quantized GEMM,
128 x 96 + 256 x 208 > 384 x 168); here it is an error naming the .inc's line. And
pk.entry_registers agrees with what ptxas gives such a kernel."""
import importlib.util
import re
import shutil
import subprocess

import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, i32

THREADS = 384


@pk.kernel(max_threads=THREADS, min_blocks=1)
def split(out: Ptr[i32], LOW: Const[int], HIGH: Const[int], LOW_FIRST: Const[bool]):
    """Warpgroup 0 (LOW_FIRST) or 2 moves to LOW registers, the other two to HIGH; every
    thread then writes its index (proof that it got past its setmaxnreg)."""
    t = pk.thread_idx.x
    low = t < 128 if LOW_FIRST else t >= 256
    if low:
        pk.setmaxnreg_dec(LOW)
    else:
        pk.setmaxnreg_inc(HIGH)
    out[pk.block_idx.x * THREADS + t] = t


def run_split(low, high, low_first=True, blocks=2):
    out = pk.to_device(np.full(blocks * THREADS, -1, np.int32))
    split[blocks, THREADS](out, low, high, low_first)
    return out.numpy()


@pytest.mark.parametrize("low, high", [(40, 232), (88, 208), (24, 240), (104, 200)])
def test_splits_within_the_blocks_registers_run(low, high, cpu_device):
    assert 128 * low + 256 * high <= THREADS * pk.entry_registers(THREADS, 1)
    got = run_split(low, high)
    np.testing.assert_array_equal(got, np.tile(np.arange(THREADS, dtype=np.int32), 2))


def test_inc_before_dec_waits_for_the_registers(cpu_device):
    """The consumers come first here: their .inc waits until warpgroup 2's .dec (as on the
    GPU), not an error."""
    got = run_split(40, 232, low_first=False)
    np.testing.assert_array_equal(got, np.tile(np.arange(THREADS, dtype=np.int32), 2))


@pytest.mark.parametrize("low, high", [(96, 208), (40, 240)])
def test_split_over_the_blocks_registers_is_reported_at_the_inc(low, high, cpu_device):
    with pytest.raises(pk.KernelRuntimeError) as err:
        run_split(low, high)
    text = str(err.value)
    assert "setmaxnreg.inc that can never complete" in text
    line = split.fn.__code__.co_firstlineno + 9            # pk.setmaxnreg_inc(HIGH)
    assert f"test_setmaxnreg_cpu.py:{line}:" in text and "setmaxnreg_inc(HIGH)" in text


@pk.kernel(max_threads=128, min_blocks=1)
def dec_then_grow(out: Ptr[i32], FIRST: Const[int], SECOND: Const[int]):
    pk.setmaxnreg_dec(FIRST)
    pk.setmaxnreg_dec(SECOND)
    out[pk.thread_idx.x] = 1


def test_dec_to_more_than_held_is_misuse(cpu_device):
    out = pk.to_device(np.zeros(128, np.int32))
    dec_then_grow[1, 128](out, 64, 48)                     # 232 -> 64 -> 48: fine
    assert (out.numpy() == 1).all()
    with pytest.raises(pk.KernelRuntimeError, match="setmaxnreg misuse") as err:
        dec_then_grow[1, 128](out, 48, 64)
    assert "test_setmaxnreg_cpu.py" in str(err.value)


def test_setmaxnreg_needs_launch_bounds(tmp_path):
    src = '''import pykernel as pk


@pk.kernel(max_threads=256)
def k(x: pk.Ptr[pk.f32]):
    pk.setmaxnreg_inc(232)
'''
    path = tmp_path / "bounds_kernel.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("bounds_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(pk.KernelSourceError) as err:
        mod.k.ptx("sm_90a")
    text = str(err.value)
    assert "needs launch bounds" in text and "bounds_kernel.py:6:" in text
    assert "compiler" not in text


@pytest.mark.parametrize("threads, blocks, inc", [(384, 1, 232), (256, 2, 200), (640, 1, 232),
                                                  (160, 3, 240), (256, 1, 232), (96, 1, 256),
                                                  (512, 1, 200)])
def test_entry_registers_is_what_ptxas_allocates(threads, blocks, inc, tmp_path):
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas not on PATH")
    ptx = f""".version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p) .maxntid {threads}, 1, 1 .minnctapersm {blocks}
{{
  .reg .b32 r<2>; .reg .b64 rd<2>; .reg .pred q;
  mov.u32 r1, %tid.x;
  setp.lt.u32 q, r1, 128;
  @q bra LOW;
  setmaxnreg.inc.sync.aligned.u32 {inc};
  bra DONE;
LOW:
  setmaxnreg.dec.sync.aligned.u32 24;
DONE:
  ld.param.u64 rd1, [p];
  st.global.u32 [rd1], r1;
  ret;
}}
"""
    (tmp_path / "k.ptx").write_text(ptx)
    proc = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o",
                           str(tmp_path / "k.cubin")], check=False, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    used = int(re.search(r"Used (\d+) registers", proc.stdout + proc.stderr).group(1))
    # ptxas reports 255 where the warp holds 256 (registers come in units of 8 per thread)
    assert -(-used // 8) * 8 == pk.entry_registers(threads, blocks, inc)
