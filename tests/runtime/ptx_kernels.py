"""Hand-written PTX kernels (PTX 8.0, sm_75+) for runtime tests that must not depend on the
compiler, wrapped as FakeCompiled objects."""
import numpy as np

from tests.runtime.fakes import FakeCompiled, ptr, scalar

_HEADER = ".version 8.0\n.target sm_75\n.address_size 64\n"

# y[i] = a * x[i] + y[i] for i < n
SAXPY_PTX = _HEADER + """
.visible .entry saxpy(.param .u32 n, .param .f32 a, .param .u64 x, .param .u64 y)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<8>;
    ld.param.u32 %r1, [n];
    ld.param.f32 %f1, [a];
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f2, [%rd6];
    ld.global.f32 %f3, [%rd7];
    fma.rn.f32 %f3, %f1, %f2, %f3;
    st.global.f32 [%rd7], %f3;
DONE:
    ret;
}
"""

# y[i] += a[0] * x[i]: the scale is read from device memory (how graphs take new values)
AXPY_DEVICE_SCALE_PTX = _HEADER + """
.visible .entry axpy_dev(.param .u32 n, .param .u64 a, .param .u64 x, .param .u64 y)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<10>;
    ld.param.u32 %r1, [n];
    ld.param.u64 %rd8, [a];
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    cvta.to.global.u64 %rd9, %rd8;
    ld.global.f32 %f1, [%rd9];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f2, [%rd6];
    ld.global.f32 %f3, [%rd7];
    fma.rn.f32 %f3, %f1, %f2, %f3;
    st.global.f32 [%rd7], %f3;
DONE:
    ret;
}
"""

# y[i] = x[i], staged through dynamic shared memory past the first 48 KiB
SHARED_ROUNDTRIP_PTX = _HEADER + """
.extern .shared .align 16 .b8 smem[];
.visible .entry shared_roundtrip(.param .u32 n, .param .u64 x, .param .u64 y)
{
    .reg .pred %p;
    .reg .b32 %r<10>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<8>;
    ld.param.u32 %r1, [n];
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    mov.u32 %r6, smem;
    add.u32 %r7, %r4, 12288;
    shl.b32 %r7, %r7, 2;
    add.u32 %r8, %r6, %r7;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    mov.f32 %f1, 0f00000000;
    @!%p ld.global.f32 %f1, [%rd6];
    st.shared.f32 [%r8], %f1;
    bar.sync 0;
    ld.shared.f32 %f1, [%r8];
    @!%p st.global.f32 [%rd7], %f1;
    ret;
}
"""

# out[i] = a * x[i] + b * y[i] for i < n
SIX_ARG_PTX = _HEADER + """
.visible .entry six(.param .u32 n, .param .f32 a, .param .f32 b, .param .u64 x,
                    .param .u64 y, .param .u64 out)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .f32 %f<6>;
    .reg .b64 %rd<12>;
    ld.param.u32 %r1, [n];
    ld.param.f32 %f1, [a];
    ld.param.f32 %f2, [b];
    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    ld.param.u64 %rd3, [out];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p, %r5, %r1;
    @%p bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    cvta.to.global.u64 %rd5, %rd1;
    cvta.to.global.u64 %rd6, %rd2;
    cvta.to.global.u64 %rd7, %rd3;
    add.s64 %rd8, %rd5, %rd4;
    add.s64 %rd9, %rd6, %rd4;
    add.s64 %rd10, %rd7, %rd4;
    ld.global.f32 %f3, [%rd8];
    ld.global.f32 %f4, [%rd9];
    mul.f32 %f5, %f2, %f4;
    fma.rn.f32 %f5, %f1, %f3, %f5;
    st.global.f32 [%rd10], %f5;
DONE:
    ret;
}
"""


BROKEN_PTX = _HEADER + """
.visible .entry broken(.param .u32 n)
{
    .reg .b32 %r<2>;
    ld.param.u32 %r1, [n];
    add.f32 %r1, %r1, %undefined_register;
    ret;
}
"""


def saxpy():
    return FakeCompiled("saxpy", [scalar("n", np.uint32), scalar("a", np.float32),
                                  ptr("x", np.float32, True), ptr("y", np.float32)],
                        ptx=SAXPY_PTX)


def axpy_device_scale():
    return FakeCompiled("axpy_dev", [scalar("n", np.uint32), ptr("a", np.float32, True),
                                     ptr("x", np.float32, True), ptr("y", np.float32)],
                        ptx=AXPY_DEVICE_SCALE_PTX)


def shared_roundtrip():
    return FakeCompiled("shared_roundtrip", [scalar("n", np.uint32), ptr("x", np.float32),
                                             ptr("y", np.float32)],
                        ptx=SHARED_ROUNDTRIP_PTX)


def broken():
    return FakeCompiled("broken", [scalar("n", np.uint32)], ptx=BROKEN_PTX)


def six():
    f32 = np.float32
    return FakeCompiled("six", [scalar("n", np.uint32), scalar("a", f32), scalar("b", f32),
                                ptr("x", f32, True), ptr("y", f32, True), ptr("out", f32)],
                        ptx=SIX_ARG_PTX)
