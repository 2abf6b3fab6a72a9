"""pk.load_vec(..., l2_fetch=N): the L2 fetch-size hint (PTX `.L2::64B/128B/256B`) changes no
result on either target (read-only and writable pointers, every width), is emitted for sm_80+
and dropped before (sm_75 lacks `.L2::256B`), assembles for every arch, and a bad size is a
compile error at the call."""

import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f16, f32, i32, u32
from pykernel.errors import KernelSourceError


@pk.kernel
def hinted_sums(h: Ptr[f16, "ro"], w: Ptr[u32], f: Ptr[f32, "ro"], out: Ptr[f32], n: i32,
                FETCH: Const[int]):
    """Thread i: 8 halves of h, 2 words of w (writable pointer), 4 floats of f, summed."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        hv = pk.load_vec(h, i * 8, 8, l2_fetch=FETCH)
        wa, wb = pk.load_vec(w, i * 2, 2, l2_fetch=FETCH)
        fa, fb, fc, fd = pk.load_vec(f, i * 4, 4, l2_fetch=FETCH)
        acc = f32(wa) + f32(wb) + fa + fb + fc + fd
        for k in pk.static_range(8):
            acc += f32(hv[k])
        w[i * 2] = wa + u32(1)          # the hinted load stays before this store
        out[i] = acc


@pytest.mark.parametrize("fetch", [0, 64, 256])
def test_l2_fetch_changes_no_result(device, rng, seed, fetch):
    n = int(rng.integers(1, 3000))
    h = rng.standard_normal(n * 8).astype(np.float16)
    w = rng.integers(0, 1000, n * 2).astype(np.uint32)
    f = rng.standard_normal(n * 4).astype(np.float32)
    out = pk.full(n, np.nan, np.float32)
    dw = pk.to_device(w)
    hinted_sums[(n + 127) // 128, 128](pk.to_device(h), dw, pk.to_device(f), out, n, fetch)
    want = (h.reshape(n, 8).astype(np.float32).sum(1) + w.reshape(n, 2).sum(1) +
            f.reshape(n, 4).sum(1))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-4,
                               err_msg=f"n={n} fetch={fetch} (seed {seed})")
    assert np.array_equal(dw.numpy()[0::2], w[0::2] + 1)


@pytest.mark.parametrize("arch", pk.SUPPORTED_ARCHS)
def test_l2_fetch_ptx_assembles(arch, assemble):
    ptx = hinted_sums.ptx(arch, FETCH=256)
    hinted = [line for line in ptx.splitlines() if ".L2::256B" in line]
    if int(arch[3:]) >= 80:
        assert len(hinted) == 3, ptx
        assert any("ld.global.nc.L2::256B.v4.b32" in line for line in hinted)
        assert any("ld.global.L2::256B.v2.b32" in line for line in hinted)   # writable: no .nc
    else:
        assert not hinted
    assemble(ptx, arch)


@pk.kernel
def bad_fetch(x: Ptr[f32, "ro"], out: Ptr[f32]):
    a, b = pk.load_vec(x, 0, 2, l2_fetch=512)
    out[0] = a + b


@pk.kernel
def bad_keyword(x: Ptr[f32, "ro"], out: Ptr[f32]):
    a, b = pk.load_vec(x, 0, 2, prefetch=256)
    out[0] = a + b


@pk.kernel
def tiny_fetch(x: Ptr[pk.u8, "ro"], out: Ptr[pk.u8]):
    a, b = pk.load_vec(x, 0, 2, l2_fetch=128)
    out[0] = a + b


def test_l2_fetch_misuse_is_a_compile_error():
    with pytest.raises(KernelSourceError, match="l2_fetch must be a constant 0, 64, 128 or 256"):
        bad_fetch.ptx("sm_90")
    with pytest.raises(KernelSourceError, match="no keyword 'prefetch'"):
        bad_keyword.ptx("sm_90")
    with pytest.raises(KernelSourceError, match="at least 4 bytes"):
        tiny_fetch.ptx("sm_90")
