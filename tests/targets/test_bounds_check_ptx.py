"""`@pk.kernel(bounds_check=True)` on the GPU: hidden size parameters, a check before every
access, and a trap after printing kernel name and file:line. On a GPU (marked gpu) the check
runs in a subprocess, because a trap ends the CUDA context."""
import os
import subprocess
import sys
import textwrap

import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32

# the subprocess imports pykernel from this checkout, which need not be pip-installed
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pk.kernel(bounds_check=True)
def shifted_copy(x: Ptr[f32, "ro"], out: Ptr[f32], n: i32):
    i = pk.thread_idx.x
    out[i] = x[i + n]


def test_bounds_checked_ptx(assemble):
    c = pk.compile(shifted_copy, "sm_90")
    assert [p.name for p in c.params][-2:] == ["__nbytes_x", "__nbytes_out"]
    assert "vprintf" in c.ptx and "trap;" in c.ptx
    assert "shifted_copy" in c.ptx and "test_bounds_check_ptx.py" in c.ptx
    assemble(c.ptx, "sm_90")


@pytest.mark.gpu
def test_out_of_bounds_on_gpu_traps_with_kernel_and_line(tmp_path):
    script = tmp_path / "oob.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path[:0] = [{os.path.dirname(__file__)!r}, {REPO!r}]
        import numpy as np, pykernel as pk
        from test_bounds_check_ptx import shifted_copy
        pk.set_device("cuda")
        x, out = pk.zeros(8, np.float32), pk.zeros(8, np.float32)
        shifted_copy[1, 8](x, out, 0)
        pk.synchronize()
        print("in-bounds ok", flush=True)
        shifted_copy[1, 8](x, out, 4)
        pk.synchronize()
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert "in-bounds ok" in proc.stdout, proc.stderr
    assert proc.returncode != 0
    assert "shifted_copy" in proc.stdout and "out-of-bounds read" in proc.stdout


@pk.kernel(bounds_check=True)
def chosen_copy(a: Ptr[f32], b: Ptr[f32], out: Ptr[f32], k: i32):
    """A pointer chosen at run time (a rebound variable, a conditional expression) carries
    the hidden size of the array it points into."""
    p = a
    if k == 1:
        p = b
    q = a if k == 0 else b
    i = pk.thread_idx.x
    out[i] = p[i] + q[i]


def test_bounds_checked_ptx_of_a_pointer_chosen_at_run_time(assemble):
    c = pk.compile(chosen_copy, "sm_90")
    assert [p.name for p in c.params][-3:] == ["__nbytes_a", "__nbytes_b", "__nbytes_out"]
    assert c.ptx.count("trap;") >= 3
    assemble(c.ptx, "sm_90")
