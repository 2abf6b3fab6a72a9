"""RMSNorm / per-head RMSNorm / LayerNorm kernels vs float64 numpy references (CPU and GPU)."""
import dataclasses
import re
import shutil
import subprocess

import numpy as np
import pytest

import pykernel as pk
from stdlib_kernels import norm
from stdlib_kernels._rows import RowConfig, row_geometry

# >= 64 rows take the multi-unit register layouts (_rows.FEW_ROWS); fewer rows, 1 unit/thread
SHAPES = [(3, 64), (5, 1), (2, 45), (1, 4099), (2, 8192), (1, 20000), (6, 576), (1, 40000),
          (64, 576), (70, 45), (64, 2052)]


def rel_err(got, ref):
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def poisoned(shape, dtype=np.float32):
    return pk.full(shape, np.nan, dtype)


@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm_matches_reference(device, rng, seed, shape):
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    out = norm.rmsnorm(x, w, 1e-5, out=poisoned(shape)).numpy()
    err = rel_err(out, norm.rmsnorm_reference(x, w, 1e-5))
    assert err < 1e-5, f"seed={seed} shape={shape} rel err {err}"


@pytest.mark.parametrize("shape", [(3, 64), (2, 45), (1, 4099), (5, 2048), (1, 40000),
                                   (64, 2048), (65, 1001)])
def test_rmsnorm_fused_residual_writes_sum(device, rng, seed, shape):
    x, r = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    out, h = norm.rmsnorm(x, w, 1e-6, residual=r, out=poisoned(shape), sum_out=poisoned(shape))
    ref, ref_h = norm.rmsnorm_reference(x, w, 1e-6, residual=r)
    assert rel_err(out.numpy(), ref) < 1e-5, f"seed={seed}"
    assert rel_err(h.numpy(), ref_h) < 1e-6, f"seed={seed}"


def test_rmsnorm_in_place_residual_stream_and_no_weight(device, rng, seed):
    x = rng.standard_normal((4, 256)).astype(np.float32)
    r = rng.standard_normal((4, 256)).astype(np.float32)
    stream = pk.to_device(r)   # the residual stream is updated in place, as the runner does
    out, h = norm.rmsnorm(x, None, 1e-6, residual=stream, sum_out=stream)
    ref, ref_h = norm.rmsnorm_reference(x, None, 1e-6, residual=r)
    assert h is stream
    assert rel_err(stream.numpy(), ref_h) < 1e-6 and rel_err(out.numpy(), ref) < 1e-5, \
        f"seed={seed}"


def test_per_head_rmsnorm(device, rng, seed):
    q = rng.standard_normal((3, 5, 128)).astype(np.float32)   # (tokens, heads, head_dim)
    w = rng.standard_normal(128).astype(np.float32)
    out = norm.rmsnorm(q, w, 1e-6, out=poisoned(q.shape)).numpy()
    assert rel_err(out, norm.rmsnorm_reference(q, w, 1e-6)) < 1e-5, f"seed={seed}"


def test_rmsnorm_f16(device, rng, seed):
    x = rng.standard_normal((3, 96)).astype(np.float16)
    w = rng.standard_normal(96).astype(np.float32)
    out = norm.rmsnorm(x, w, 1e-6, out=poisoned(x.shape, np.float16)).numpy()
    ref = norm.rmsnorm_reference(x, w, 1e-6)
    assert np.allclose(out, ref, rtol=2e-3, atol=2e-3), f"seed={seed}"


def test_rmsnorm_unaligned_view_uses_scalar_path(device, rng, seed):
    base = pk.to_device(rng.standard_normal(4 * 64 + 1).astype(np.float32))
    x = base[1:].reshape(4, 64)   # 4-byte offset: no 16-byte vector loads
    out = norm.rmsnorm(x, None, 1e-5).numpy()
    assert rel_err(out, norm.rmsnorm_reference(x.numpy(), None, 1e-5)) < 1e-5, f"seed={seed}"


# (3, 2050): 1024 threads for 513 units, so whole warps hold no element (count 0 in the merge)
@pytest.mark.parametrize("shape", [(3, 64), (5, 1), (2, 45), (1, 4099), (9, 576), (1, 40000),
                                   (64, 4096), (66, 1002), (3, 2050)])
def test_layernorm_matches_reference(device, rng, seed, shape):
    x = (rng.standard_normal(shape) * 2 + 5).astype(np.float32)   # offset: cancellation test
    w, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    out = norm.layernorm(x, w, b, 1e-5, out=poisoned(shape)).numpy()
    err = rel_err(out, norm.layernorm_reference(x, w, b, 1e-5))
    assert err < 1e-5, f"seed={seed} shape={shape} rel err {err}"


def test_norm_errors_name_the_argument(device):
    with pytest.raises(ValueError, match="weight has 3 elements"):
        norm.rmsnorm(np.zeros((2, 4), np.float32), np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="float32 or float16"):
        norm.layernorm(np.zeros((2, 4), np.int32))


# geometry variants the benchmark sweeps (_rows.RowConfig): several rows per block with a
# partial last block (67 rows), one-wave launch bounds, weight/bias loaded with x
# one_pass: layernorm's (count, mean, M2) triples in one reduction; trigger: launch_dependents
# at entry where the grid is one wave
CONFIGS = [RowConfig(2, 4, True, True, one_pass=True, trigger=True),
           RowConfig(4, 2, False, False, one_pass=True, trigger=True),
           RowConfig(1, 8, False, True, one_pass=True, trigger=True), RowConfig(2, 4, True, True),
           RowConfig(4, 1, True, False)]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_norm_geometry_variants(device, rng, seed, config, monkeypatch):
    monkeypatch.setattr(norm, "RMSNORM_RESIDUAL", ((1 << 30, config),))
    monkeypatch.setattr(norm, "LAYERNORM", ((1 << 30, config),))
    shape = (67, 1000)
    x, r = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    w, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    out, h = norm.rmsnorm(x, w, 1e-6, residual=r, out=poisoned(shape), sum_out=poisoned(shape))
    ref, ref_h = norm.rmsnorm_reference(x, w, 1e-6, residual=r)
    assert rel_err(out.numpy(), ref) < 1e-5 and rel_err(h.numpy(), ref_h) < 1e-6, \
        f"seed={seed} {config}"
    odd = (70, 1002)   # n % 4 != 0: scalar loads, partial last unit
    x = (rng.standard_normal(odd) * 2 + 5).astype(np.float32)
    w, b = (rng.standard_normal(odd[-1]).astype(np.float32) for _ in range(2))
    err = rel_err(norm.layernorm(x, w, b, 1e-5, out=poisoned(odd)).numpy(),
                  norm.layernorm_reference(x, w, b, 1e-5))
    assert err < 1e-5, f"seed={seed} {config} layernorm rel err {err}"


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not installed")
def test_one_wave_bounds_cap_registers(tmp_path):
    """512 rows of 8192 with 4 units/thread: 512-thread blocks, 4 per SM on 132 SMs, so
    ptxas must fit rmsnorm in 65536 / (4 * 512) = 32 registers (unbounded it takes ~40)."""
    geo = row_geometry(512, 8192, RowConfig(4, 1, True))
    assert geo.bounds == (512, 4), geo
    options = dataclasses.replace(norm.rmsnorm_regs.options, max_threads=512, min_blocks=4)
    ptx = norm.rmsnorm_regs.compile("sm_90", options, HAS_RES=False, HAS_W=True,
                                    W_EARLY=False, VEC=4, T=np.float32, **dict(geo.spec())).ptx
    assert ".maxntid 512" in ptx and ".minnctapersm 4" in ptx
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    proc = subprocess.run(["ptxas", "-v", "-arch=sm_90", str(src), "-o",
                           str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    registers = int(re.search(r"Used (\d+) registers", proc.stderr).group(1))
    assert registers <= 32 and "0 bytes spill stores" in proc.stderr, proc.stderr


def test_trigger_only_for_one_wave_grids():
    """launch_dependents at entry (TRIGGER) only where the whole grid is resident at once:
    launch bounds that fit it on the SMs (132 on the CPU target), or fewer blocks than SMs."""
    on = dict(trigger=True)
    assert row_geometry(512, 8192, RowConfig(4, 1, True, **on)).trigger
    assert not row_geometry(512, 8192, RowConfig(4, 1, False, **on)).trigger   # occupancy unknown
    assert not row_geometry(4096, 8192, RowConfig(4, 1, True, **on)).trigger   # 32 blocks per SM
    assert row_geometry(1, 4096, RowConfig(4, 1, False, **on)).trigger          # one block
    assert not row_geometry(512, 8192, RowConfig(4, 1, True)).trigger   # off by default


@pytest.mark.parametrize("trigger", [True, False])
def test_trigger_placed_at_entry(trigger):
    """TRIGGER moves griddepcontrol.launch_dependents before the body's first load; without
    it the compiler's default trigger stays at the end (after the last store)."""
    ptx = norm.rmsnorm_regs.compile("sm_90", None, HAS_RES=False, HAS_W=True, W_EARLY=False,
                                    VEC=4, T=np.float32, CHUNKS=4, GROUP=512, RPB=1,
                                    TRIGGER=trigger).ptx
    launch, first_load, last_store = (ptx.index("griddepcontrol.launch_dependents"),
                                      ptx.index("ld.global"), ptx.rindex("st.global"))
    assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert (launch < first_load) if trigger else (launch > last_store), ptx[launch - 200:]
