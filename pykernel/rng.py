"""Random numbers inside kernels: Philox4x32-10, a counter-based generator (Salmon, Moraes,
Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11; the generator of Random123
and of cuRAND's Philox). A counter-based generator keeps no state: the numbers are a pure
function of (seed, offset), so every thread draws its own stream by offset (e.g. its element
index) with no setup, no memory, and the same values on the GPU and the CPU target.

    pk.philox4x32(c0, c1, c2, c3, k0, k1) -> 4 x u32   ten rounds, as Random123's
    pk.randint4x(seed, offset) -> 4 x u32   counter (offset lo, hi, 0, 0), key (seed lo, hi)
    pk.randint(seed, offset) -> u32         the first of them
    pk.rand(seed, offset) -> f32               uniform in [0, 1), multiples of 2**-24
    pk.randn(seed, offset) -> f32              standard normal (Box-Muller on the first two words)

seed and offset are any integers (converted to u64). Every function is a @pk.func (inlined,
compiled like user code), so it needs no intrinsic and no PTX beyond integer multiply, xor and
the accurate log / sqrt / cos of mathlib.py.
"""
from __future__ import annotations

from .intrinsics.basic_math import sqrt
from .intrinsics.core import static_range
from .kernel import func
from .mathlib import cos, log
from .types import f32, u32, u64

PHILOX_M0 = 0xD2511F53     # round multipliers
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9     # Weyl key increments (golden ratio, sqrt(3) - 1)
PHILOX_W1 = 0xBB67AE85
TWO_PI = 6.283185307179586


@func
def philox4x32(c0: u32, c1: u32, c2: u32, c3: u32, k0: u32, k1: u32):
    """Philox4x32-10 of counter (c0..c3) under key (k0, k1): Random123's philox4x32_R(10, ...),
    bit for bit (its known-answer vectors are in tests/lowering/test_rng.py)."""
    for r in static_range(10):     # unrolled; r is a compile-time int
        if r > 0:
            k0 = k0 + u32(PHILOX_W0)
            k1 = k1 + u32(PHILOX_W1)
        p0 = u64(c0) * u64(PHILOX_M0)      # 32 x 32 -> 64: mul.wide.u32 on the GPU
        p1 = u64(c2) * u64(PHILOX_M1)
        c0, c1, c2, c3 = (u32(p1 >> u64(32)) ^ c1 ^ k0, u32(p1),
                          u32(p0 >> u64(32)) ^ c3 ^ k1, u32(p0))
    return c0, c1, c2, c3


@func
def randint4x(seed, offset):
    """Four independent u32 for (seed, offset)."""
    s = u64(seed)
    o = u64(offset)
    return philox4x32(u32(o), u32(o >> u64(32)), u32(0), u32(0), u32(s), u32(s >> u64(32)))


@func
def randint(seed, offset) -> u32:
    r0, r1, r2, r3 = randint4x(seed, offset)
    return r0


@func
def uniform_of(bits: u32) -> f32:
    """The top 24 bits as a float in [0, 1): exact, never 1.0."""
    return f32(bits >> u32(8)) * f32(1.0 / 16777216.0)


@func
def rand(seed, offset) -> f32:
    return uniform_of(randint(seed, offset))


@func
def randn(seed, offset) -> f32:
    """Box-Muller: sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1] so the log is finite."""
    r0, r1, r2, r3 = randint4x(seed, offset)
    u1 = f32(1.0) - uniform_of(r0)
    u2 = uniform_of(r1)
    return sqrt(f32(-2.0) * log(u1)) * cos(f32(TWO_PI) * u2)
