"""Kernel options that shape the PTX entry: launch bounds (max_threads/min_blocks ->
.maxntid/.minnctapersm) and the programmatic-dependent-launch prologue (griddepcontrol on
sm_90+), plus a dependent chain replayed from a PDL graph on the GPU."""
import re
import shutil
import subprocess

import numpy as np
import pytest

import pykernel as pk
from pykernel import Ptr, f32, i32
from pykernel.errors import LaunchError


@pk.kernel(max_threads=128, min_blocks=3)
def bounded(x: Ptr[f32], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        x[i] = x[i] + 1.0


@pk.kernel
def step(x: Ptr[f32, "ro"], y: Ptr[f32], n: i32):
    """y = 2x + 1: each launch reads what the previous one wrote."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        y[i] = x[i] * 2.0 + 1.0


@pk.kernel
def step_early(w: Ptr[f32, "ro"], x: Ptr[f32, "ro"], y: Ptr[f32], n: i32):
    """y = w * x: w is constant, so it is loaded before waiting for the previous kernel."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    pk.prefetch_l2(w, min(i + 32, n - 1))
    scale = w[min(i, n - 1)]
    pk.grid_dependency_wait()
    if i < n:
        y[i] = x[i] * scale


@pk.kernel
def step_trigger_early(x: Ptr[f32, "ro"], y: Ptr[f32], n: i32):
    pk.launch_dependents()
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        y[i] = x[i] - 1.0


@pk.kernel(pdl=False)
def no_pdl(x: Ptr[f32], n: i32):
    i = pk.thread_idx.x
    if i < n:
        x[i] = 0.0


def body_lines(ptx: str) -> list[str]:
    body = ptx[ptx.index("{"):ptx.index(".section")] if ".section" in ptx else \
        ptx[ptx.index("{"):]
    return [ln.strip() for ln in body.splitlines()
            if ln.strip() and not ln.strip().startswith(("//", ".loc", "$L", ".reg", "{", "}",
                                                         "ld.param"))]


def test_launch_bounds_in_ptx():
    ptx = bounded.ptx("sm_90")
    assert re.search(r"\.maxntid 128(, 1, 1)?\s", ptx), ptx[:600]
    assert re.search(r"\.minnctapersm 3\s", ptx), ptx[:600]


def test_launch_bounds_validation():
    with pytest.raises(ValueError, match="min_blocks needs max_threads"):
        pk.kernel(min_blocks=2)(lambda x: None)
    with pytest.raises(ValueError, match="max_threads"):
        pk.kernel(max_threads=2048)(lambda x: None)


def test_block_above_max_threads_is_a_launch_error(device):
    x = pk.zeros(256, np.float32)
    with pytest.raises(LaunchError, match=r"bounded.*256 threads.*max_threads=128"):
        bounded[1, 256](x, 256)
    bounded[2, 128](x, 256)
    assert (x.numpy() == 1.0).all()


def test_pdl_prologue_on_sm90_only():
    lines = body_lines(step.ptx("sm_90"))
    assert lines[0] == "griddepcontrol.wait;", lines[:4]
    assert lines[-2:] == ["griddepcontrol.launch_dependents;", "ret;"], lines[-4:]
    for arch in ("sm_80", "sm_89"):
        assert "griddepcontrol" not in step.ptx(arch)
    assert "griddepcontrol" not in no_pdl.ptx("sm_90")
    assert "pdl" in step.compile("sm_90").uses and "pdl" not in step.compile("sm_80").uses


def test_explicit_wait_and_trigger_stay_where_written():
    lines = body_lines(step_trigger_early.ptx("sm_90"))
    assert lines[:2] == ["griddepcontrol.wait;", "griddepcontrol.launch_dependents;"], lines
    assert lines.count("griddepcontrol.launch_dependents;") == 1
    lines = body_lines(step_early.ptx("sm_90"))
    assert lines[-2] == "griddepcontrol.launch_dependents;"
    wait = lines.index("griddepcontrol.wait;")
    loads = [k for k, ln in enumerate(lines) if ln.startswith("ld.global")]
    assert loads[0] < wait < loads[1], lines   # w loaded before the wait, x after it
    prefetch = [k for k, ln in enumerate(lines) if ln.startswith("prefetch.global.L2")]
    assert len(prefetch) == 1 and prefetch[0] < wait, lines
    assert lines.count("griddepcontrol.wait;") == 1


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not installed")
@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
def test_ptxas_assembles_prologue_and_bounds(arch, tmp_path):
    for kernel in (step, step_early, step_trigger_early, bounded):
        src = tmp_path / f"{kernel.name}.ptx"
        src.write_text(kernel.ptx(arch))
        proc = subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o",
                               str(tmp_path / "k.cubin")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_dependent_chain_in_a_pdl_graph(device, rng, seed):
    """128 launches, each reading the previous one's output, replayed 3 times from a graph
    captured with pdl=True: any launch that ran ahead of its predecessor shows in the result."""
    n = 300_001 if device == "cuda" else 1000
    x0 = rng.standard_normal(n).astype(np.float32)
    w = rng.uniform(0.25, 0.5, n).astype(np.float32)   # keeps the values bounded
    a, b, w_dev = pk.to_device(x0), pk.full(n, np.nan, np.float32), pk.to_device(w)
    blocks = (n + 255) // 256
    stream = pk.Stream()
    with pk.capture_graph(stream, pdl=True) as graph:
        for k in range(32):
            step[blocks, 256](a, b, n)
            step_trigger_early[blocks, 256](b, a, n)
            step[blocks, 256](a, b, n)
            step_early[blocks, 256](w_dev, b, a, n)
    expected = x0.copy()
    for replay in range(3):
        graph.replay(stream)
        stream.synchronize()
        for k in range(32):   # float32 numpy rounds each operation, like the kernels
            expected = expected * np.float32(2.0) + np.float32(1.0) - np.float32(1.0)
            expected = (expected * np.float32(2.0) + np.float32(1.0)) * w
        bad = np.flatnonzero(a.numpy() != expected)
        assert bad.size == 0, (f"replay {replay}: {bad.size} elements differ, first at "
                               f"{bad[0]} (seed {seed})")


def test_dependent_chain_launched_eagerly_with_pdl(device, rng, seed):
    """The same chain launched eagerly inside pk.programmatic_launches (the runner's run before
    a PDL capture): PDL launches on a stream, each kernel's wait guarding its reads."""
    n = 300_001 if device == "cuda" else 1000
    x0 = rng.standard_normal(n).astype(np.float32)
    w = rng.uniform(0.25, 0.5, n).astype(np.float32)
    a, b, w_dev = pk.to_device(x0), pk.full(n, np.nan, np.float32), pk.to_device(w)
    blocks = (n + 255) // 256
    dev = pk.current_device()
    with pk.programmatic_launches():
        assert getattr(dev, "programmatic_launch", False) == (dev.kind == "cuda")
        for k in range(32):
            step[blocks, 256](a, b, n)
            step_trigger_early[blocks, 256](b, a, n)
            step_early[blocks, 256](w_dev, a, b, n)
            step[blocks, 256](b, a, n)
    assert not getattr(dev, "programmatic_launch", False)
    pk.synchronize()
    expected = x0.copy()
    for k in range(32):
        expected = expected * np.float32(2.0) + np.float32(1.0) - np.float32(1.0)
        expected = (expected * w) * np.float32(2.0) + np.float32(1.0)
    bad = np.flatnonzero(a.numpy() != expected)
    assert bad.size == 0, f"{bad.size} elements differ, first at {bad[0]} (seed {seed})"
    if device == "cuda":
        with pk.capture_graph(pk.Stream(), pdl=True), pytest.raises(RuntimeError, match="capture"):
            with pk.programmatic_launches():
                pass
