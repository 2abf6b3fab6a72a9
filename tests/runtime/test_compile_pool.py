"""pk.precompile: a dry run records launches instead of making them; worker processes compile
the recorded specializations into the disk cache (the same PTX as an in-process compile); the
real run afterwards finds them and computes what it always did."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, cache, compile_pool, f32, i32
from pykernel.compiler import compile_kernel
from stdlib_kernels import _launch as L


@pk.kernel
def scale_add(x: Ptr[f32, "ro"], y: Ptr[f32], n: i32, a: f32, UNROLL: Const[int]):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    for u in pk.static_range(UNROLL):
        j = i * UNROLL + u
        if j < n:
            y[j] = y[j] + a * x[j]


@pk.kernel
def typed_copy(x: Ptr["T", "ro"], y: Ptr["T"], n: i32):
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        y[i] = x[i]


@pk.kernel
def broken(x: Ptr[f32], n: i32):
    x[0] = not_defined_anywhere     # noqa: F821  (a source error: compiling it raises)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYKERNEL_COMPILE_WORKERS", "4")
    saved = dict(cache._MEMORY)
    cache._MEMORY.clear()
    for k in (scale_add, typed_copy):
        k._launch_cache.clear()
    yield tmp_path / "cache"
    cache._MEMORY.clear()
    cache._MEMORY.update(saved)


def test_recorded_launches_are_not_made(device):
    x, y = pk.to_device(np.ones(64, np.float32)), pk.full(64, 7.0, np.float32)
    with compile_pool.recorded_launches() as jobs:
        scale_add[1, 32](x, y, 64, 2.0, UNROLL=2)                      # the kernel[...] path
        L.launch(typed_copy, 1, 64, (x, y, 64), (("T", pk.f32),))     # stdlib's direct path
    assert np.all(y.numpy() == 7.0)
    assert [(k.name, spec) for k, _, spec, _ in jobs] == [
        ("scale_add", {"UNROLL": 2}), ("typed_copy", {"T": pk.f32})]
    with pytest.raises(RuntimeError, match="already recording"):
        with compile_pool.recorded_launches(), compile_pool.recorded_launches():
            pass
    assert compile_pool.RECORDING is None


def test_workers_compile_the_same_ptx_into_the_disk_cache(fresh_cache):
    jobs = [(scale_add, "sm_90", {"UNROLL": u}, scale_add.options) for u in (1, 2, 4)] + \
        [(typed_copy, "sm_80", {"T": pk.f16}, typed_copy.options)]   # 4 jobs: 4 workers
    seen = []
    assert compile_pool._compile_in_workers(jobs, seen.append) == 4
    assert sorted(seen) == [0, 1, 2, 3]        # each job reported once, as it finished
    assert len(list(fresh_cache.glob("*.ptxcache"))) == 4
    for kernel, arch, spec, options in jobs:
        from_disk = kernel.compile(arch, **spec)
        assert not from_disk.llvm_ir          # loaded from the disk cache, not compiled here
        here = compile_kernel(kernel, arch, kernel.spec_from_kwargs(spec), options, fresh=True)
        assert from_disk.ptx == here.ptx


def test_a_failing_compile_is_left_to_its_launch(fresh_cache):
    jobs = [(scale_add, "sm_90", {"UNROLL": 3}, scale_add.options),
            (broken, "sm_90", {}, broken.options)]
    seen = []
    assert compile_pool._compile_in_workers(jobs, seen.append) == 1
    assert seen == [0]
    with pytest.raises(pk.KernelSourceError, match="not_defined_anywhere"):
        broken.compile("sm_90")          # the user sees the error where it always was


@pk.kernel
def uses_wgmma_fence(x: Ptr[f32]):
    pk.wgmma_fence()          # sm_90a only: a launch on an sm_90 device compiles for sm_90a
    x[0] = 1.0


def test_workers_follow_the_launchs_sm90a_rule(fresh_cache):
    """Recorded for an sm_90 device, a wgmma kernel compiles for sm_90a in the workers (it
    failed there before, and precompile itself raised ArchSpecificError)."""
    jobs = [(uses_wgmma_fence, "sm_90", {}, uses_wgmma_fence.options),
            (scale_add, "sm_90", {"UNROLL": 5}, scale_add.options)]
    assert compile_pool._compile_in_workers(jobs) == 2
    assert len(list(fresh_cache.glob("*.ptxcache"))) == 2
    compiled = compile_pool.compile_like_launch(uses_wgmma_fence, "sm_90",
                                                uses_wgmma_fence.options, {})
    assert compiled.arch == "sm_90a" and ".target sm_90a" in compiled.ptx
    assert not compiled.llvm_ir               # the workers' copy, from the disk cache


def test_precompile_then_run(device, fresh_cache):
    n = 1000
    rng = np.random.default_rng(0)
    x = pk.to_device(rng.standard_normal(n).astype(np.float32))
    y = pk.zeros(n, np.float32)

    @pk.kernel       # defined in a function: no worker can import it, so compiled here
    def negate(v: Ptr[f32], n: i32):
        i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
        if i < n:
            v[i] = -v[i]

    def step():
        scale_add[(n + 127) // 128, 64](x, y, n, 3.0, UNROLL=2)
        negate[(n + 127) // 128, 128](y, n)
        L.launch(typed_copy, (n + 127) // 128, 128, (y, y, n), (("T", y.dtype),))  # numpy

    stats = pk.precompile(step)
    assert np.all(y.numpy() == 0.0)                  # the dry run launched nothing
    assert stats["kernels"] == 3 and stats["compiled_in_workers"] == 2
    if device.kind == "cuda":      # the workers' kernels were loaded and JIT-ed meanwhile
        from cuda.bindings import driver as cu
        # the variants the launches load: plain launches the prologue-free one (sm_90+),
        # stdlib's launcher the PDL one
        plain = scale_add.launch_options(device.arch, programmatic=False)
        for compiled in (scale_add.compile(device.arch, plain, UNROLL=2),
                         typed_copy.compile(device.arch, T=pk.f32)):
            func = device._kernels[compiled.cache_key].func
            state = cu.cuFuncIsLoaded(func)[1]
            assert state == cu.CUfunctionLoadingState.CU_FUNCTION_LOADING_STATE_LOADED
    step()
    np.testing.assert_array_equal(y.numpy(), -(np.float32(3.0) * x.numpy()))
    again = pk.precompile(step)                      # everything compiled: no workers
    assert again["kernels"] == 3 and again["compiled_in_workers"] == 0


def test_preloader_loads_on_its_thread_and_leaves_failures_to_the_launch(fresh_cache):
    class Device:
        def __init__(self):
            self.loaded = []

        def preload(self, compiled):
            if compiled.name == "typed_copy":
                raise RuntimeError("the driver refused")     # swallowed: the launch reports
            self.loaded.append(compiled.name)
    device = Device()
    preloader = compile_pool._Preloader(device)
    preloader.submit((scale_add, "sm_90", {"UNROLL": 1}, scale_add.options))
    preloader.submit((typed_copy, "sm_90", {"T": pk.f32}, typed_copy.options))
    preloader.submit((scale_add, "sm_80", {"UNROLL": 2}, scale_add.options))
    preloader.finish()
    assert device.loaded == ["scale_add", "scale_add"] and not preloader.thread.is_alive()


def test_worker_count(monkeypatch):
    monkeypatch.setenv("PYKERNEL_COMPILE_WORKERS", "2")     # too few cores to gain: none
    assert compile_pool.worker_count(30) == 0
    monkeypatch.setenv("PYKERNEL_COMPILE_WORKERS", "8")
    assert compile_pool.worker_count(30) == 8 and compile_pool.worker_count(3) == 3
    monkeypatch.setenv("PYKERNEL_COMPILE_WORKERS", "64")
    assert compile_pool.worker_count(30) == compile_pool.MAX_WORKERS
