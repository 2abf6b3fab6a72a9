"""wgmma on the CPU target against numpy: one warpgroup, a 64xNxK GEMM with both operands in
shared memory (descriptors without and with swizzle) or A from registers; f16/bf16 products
summed in f32 in k order (the mma.sync emulation's order, so bit-exact here), integers exact.
The same kernel runs on a GPU (marked gpu) where f32 sums get a derived tolerance."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, fp8, i32, u8, u32

STEP_BYTES = 32          # one wgmma's K extent in bytes (k16 x 2 B, k32 x 1 B)


@pk.func
def tile_offset(r: i32, kb: i32, swizzle: Const[int], kbytes: Const[int]) -> i32:
    """Byte offset of row r, byte kb of a K-major 64- or N-row tile (docs/language.md)."""
    if swizzle == 0:
        return (r // 8) * (kbytes // 16 * 128) + (kb // 16) * 128 + (r % 8) * 16 + kb % 16
    off = (r // 8) * (8 * swizzle) + (r % 8) * swizzle + kb    # kbytes == swizzle: one atom
    return off ^ (((off >> 7) & (swizzle // 16 - 1)) << 4)


@pk.func
def a_fragment(a, frag, s: i32, t: i32, kbytes: i32):
    """This thread's register A fragment of wgmma step s, read from A (64 x kbytes bytes, row
    major): rows 16 w + g (+ 8), byte pairs 4 t.. (+ 16)."""
    w, g, q = (t // 32) % 4, (t % 32) // 4, t % 4
    for j in pk.static_range(4):
        row = 16 * w + g + 8 * (j % 2)
        kb = s * STEP_BYTES + 4 * q + 16 * (j // 2)
        word = u32(0)
        for byte in pk.static_range(4):
            word = word | (u32(a[row * kbytes + kb + byte]) << (8 * byte))
        frag[j] = word


@pk.kernel
def wgmma_gemm(a: Ptr[u8], b: Ptr[u8], c: Ptr[f32], ci: Ptr[i32], n: Const[int],
               kbytes: Const[int], swizzle: Const[int], kind: Const[str], float_acc: Const[bool],
               a_regs: Const[bool]):
    """C (64 x n) = A (64 x K) . B (n x K)^T; rows of A and B are kbytes bytes (K-major)."""
    sa = pk.shared_array(u8, 8192)       # 1024-byte aligned offsets: the swizzle's XOR
    sb = pk.shared_array(u8, 32768)      # reads address bits 7..9
    t = pk.thread_idx.x
    for idx in range(t, 64 * kbytes, 128):
        sa[tile_offset(idx // kbytes, idx % kbytes, swizzle, kbytes)] = a[idx]
    for idx in range(t, n * kbytes, 128):
        sb[tile_offset(idx // kbytes, idx % kbytes, swizzle, kbytes)] = b[idx]
    pk.fence_proxy_async()
    pk.syncthreads()
    acc = pk.local_array(f32 if float_acc else i32, n // 2)
    lbo = 128 if swizzle == 0 else 16       # swizzled K-major: one atom along K, lbo unused
    sbo = kbytes // 16 * 128 if swizzle == 0 else 8 * swizzle
    frag = pk.local_array(u32, 4)
    for s in pk.static_range(kbytes // STEP_BYTES):
        start = s * 2 * 128 if swizzle == 0 else s * STEP_BYTES    # row 0, byte 32 s
        db = pk.wgmma_desc(sb, start, lbo, sbo, swizzle)
        if a_regs:
            a_fragment(a, frag, s, t, kbytes)
            pk.wgmma_fence()
            pk.wgmma(acc, frag, db, kind, s > 0)
        else:
            da = pk.wgmma_desc(sa, start, lbo, sbo, swizzle)
            pk.wgmma_fence()
            pk.wgmma(acc, da, db, kind, s > 0)
        pk.wgmma_commit_group()
        pk.wgmma_wait_group(0, acc)
    w, g, q = (t // 32) % 4, (t % 32) // 4, t % 4
    for i in pk.static_range(n // 2):
        row = 16 * w + g + 8 * ((i // 2) % 2)
        col = 8 * (i // 4) + 2 * q + i % 2
        if float_acc:
            c[row * n + col] = acc[i]
        else:
            ci[row * n + col] = acc[i]


def _operands(rng, kind, rows, k):
    """Random operands as (raw bytes, values): f16/bf16 small integers and halves so that
    the f32 sums are exact in any order, as well as the rest of the range."""
    if kind in ("s8", "u8"):
        vals = rng.integers(-128, 128, (rows, k)) if kind == "s8" else \
            rng.integers(0, 256, (rows, k))
        return vals.astype(np.int8 if kind == "s8" else np.uint8).view(np.uint8), vals
    x = rng.standard_normal((rows, k)).astype(np.float32)
    if kind in ("e4m3", "e5m2"):
        codes = fp8.encode(x * 8, kind)
        return codes, fp8.decode(codes, kind)
    if kind == "f16":
        h = x.astype(np.float16)
        return h.view(np.uint8).reshape(rows, 2 * k), h.astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)       # bf16 by truncation
    return bits.view(np.uint8).reshape(rows, 2 * k), (bits.astype(np.uint32) << 16).view(
        np.float32)


def _reference(av, bv, kind):
    """Sum in k order in f32 (the emulation's order) or exactly in int64 -> i32 wrap."""
    if kind in ("s8", "u8"):
        return (av.astype(np.int64) @ bv.T.astype(np.int64)).astype(np.int32)
    acc = np.zeros((av.shape[0], bv.shape[0]), np.float32)
    for k in range(av.shape[1]):
        acc = acc + np.outer(av[:, k], bv[:, k]).astype(np.float32)
    return acc


def run_gemm(rng, kind, n, kbytes, swizzle, a_regs):
    elem = 2 if kind in ("f16", "bf16") else 1
    k = kbytes // elem
    a_raw, av = _operands(rng, kind, 64, k)
    b_raw, bv = _operands(rng, kind, n, k)
    float_acc = kind not in ("s8", "u8")
    c = pk.full((64 * n,), np.nan, np.float32)
    ci = pk.full((64 * n,), -12345, np.int32)
    a_dev = pk.to_device(np.ascontiguousarray(a_raw).reshape(-1))
    b_dev = pk.to_device(np.ascontiguousarray(b_raw).reshape(-1))
    wgmma_gemm[1, 128](a_dev, b_dev, c, ci, n, kbytes, swizzle, kind, float_acc, a_regs)
    got = (c if float_acc else ci).numpy().reshape(64, n)
    return got, _reference(av, bv, kind)


CASES = [("f16", 64, 32, 0, False), ("f16", 8, 64, 0, False), ("f16", 256, 32, 0, False),
         ("f16", 24, 32, 32, False), ("f16", 64, 64, 64, False), ("bf16", 40, 128, 128, False),
         ("f16", 16, 64, 0, True), ("s8", 64, 32, 0, False), ("u8", 24, 128, 128, False),
         ("s8", 32, 64, 64, True), ("u8", 48, 32, 32, True), ("e4m3", 32, 64, 64, False),
         ("e5m2", 16, 32, 0, True)]


@pytest.mark.parametrize("kind,n,kbytes,swizzle,a_regs", CASES)
def test_wgmma_matches_numpy(device, rng, kind, n, kbytes, swizzle, a_regs):
    got, want = run_gemm(rng, kind, n, kbytes, swizzle, a_regs)
    if device.kind == "cpu" or kind in ("s8", "u8"):
        np.testing.assert_array_equal(got, want)
    else:
        # the tensor cores sum in another order (and truncate): |error| <= K ulp(sum |a b|)
        np.testing.assert_allclose(got, want, rtol=0, atol=float(np.abs(want).max()) * 2e-5
                                   * kbytes)


@pk.func
def n_major_offset(n: i32, k: i32, swizzle: Const[int], rows: Const[int],
                   K: Const[int]) -> i32:
    """Byte offset of B's element (n, k) (2 bytes) stored N-major for trans_b: swizzled, spans
    of `swizzle` bytes along N, each holding all K rows (lbo = K * swizzle apart); plain, 8 x
    16-byte core matrices, N-spans 128 bytes apart (sbo), 8-k groups 16 * rows apart (lbo)."""
    nb = 2 * n
    if swizzle == 0:
        return (nb // 16) * 128 + nb % 16 + (k // 8) * (16 * rows) + (k % 8) * 16
    off = (nb // swizzle) * (K * swizzle) + nb % swizzle + k * swizzle
    return off ^ (((off >> 7) & (swizzle // 16 - 1)) << 4)


@pk.kernel
def wgmma_gemm_nmajor(a: Ptr[u8], b: Ptr[u8], c: Ptr[f32], n: Const[int], K: Const[int],
                      swizzle: Const[int], kind: Const[str], a_regs: Const[bool]):
    """C (64 x n) = A (64 x K) . B (n x K)^T with B N-major in shared memory (trans_b); A
    K-major without swizzle, or from registers."""
    sa = pk.shared_array(u8, 8192)
    sb = pk.shared_array(u8, 32768)
    t = pk.thread_idx.x
    kbytes = 2 * K
    for idx in range(t, 64 * kbytes, 128):
        sa[tile_offset(idx // kbytes, idx % kbytes, 0, kbytes)] = a[idx]
    for idx in range(t, n * kbytes, 128):
        e = idx // 2
        sb[n_major_offset(e // K, e % K, swizzle, n, K) + idx % 2] = b[idx]
    pk.fence_proxy_async()
    pk.syncthreads()
    acc = pk.local_array(f32, n // 2)
    lbo = 16 * n if swizzle == 0 else K * swizzle
    sbo = 128 if swizzle == 0 else 8 * swizzle
    frag = pk.local_array(u32, 4)
    w, g, q = (t // 32) % 4, (t % 32) // 4, t % 4
    for s in pk.static_range(K // 16):
        db = pk.wgmma_desc(sb, 2 * lbo * s if swizzle == 0 else 16 * swizzle * s, lbo, sbo,
                           swizzle)
        pk.wgmma_fence()
        if a_regs:
            a_fragment(a, frag, s, t, kbytes)
            pk.wgmma(acc, frag, db, kind, s > 0, trans_b=True)
        else:
            da = pk.wgmma_desc(sa, s * 2 * 128, 128, kbytes // 16 * 128, 0)
            pk.wgmma(acc, da, db, kind, s > 0, trans_b=True)
        pk.wgmma_commit_group()
        pk.wgmma_wait_group(0, acc)
    for i in pk.static_range(n // 2):
        row = 16 * w + g + 8 * ((i // 2) % 2)
        c[row * n + 8 * (i // 4) + 2 * q + i % 2] = acc[i]


@pytest.mark.parametrize("kind,n,k,swizzle,a_regs", [
    ("f16", 128, 32, 128, True), ("f16", 64, 16, 128, False), ("bf16", 64, 48, 64, True),
    ("f16", 48, 32, 32, False), ("f16", 24, 32, 0, True), ("bf16", 16, 16, 0, False)])
def test_wgmma_trans_b_matches_numpy(device, rng, kind, n, k, swizzle, a_regs):
    """trans_b: B read N-major (CUTLASS's canonical MN-major layouts), every swizzle mode;
    N spans more than one swizzle width where n * 2 > swizzle (lbo used)."""
    a_raw, av = _operands(rng, kind, 64, k)
    b_raw, bv = _operands(rng, kind, n, k)
    c = pk.full((64 * n,), np.nan, np.float32)
    wgmma_gemm_nmajor[1, 128](pk.to_device(np.ascontiguousarray(a_raw).reshape(-1)),
                              pk.to_device(np.ascontiguousarray(b_raw).reshape(-1)), c, n, k,
                              swizzle, kind, a_regs)
    got, want = c.numpy().reshape(64, n), _reference(av, bv, kind)
    if device.kind == "cpu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=float(np.abs(want).max()) * 4e-5 * k)
