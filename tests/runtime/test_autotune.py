"""`@pk.autotune`: the fastest configuration is measured and kept per key, in-place outputs are
restored, failing configurations are skipped, captures and precompile are handled. Runs on
the CPU target and on CUDA (the `device` fixture)."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, f32, i32

FAST, SLOW = {"WORK": 1, "threads": 128}, {"WORK": 20000, "threads": 256}
# on a GPU FAST's batches time the host's launch rate (~10 us a launch); under a loaded,
# parallel test run a stalled host made SLOW's 45 us launches look faster once (H100). ~1 ms
# launches leave no doubt there.
SLOW_GPU = {"WORK": 400000, "threads": 256}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_of(args, config):
    return cdiv(args["n"], config["threads"]), config["threads"]


@pk.kernel(max_threads=512)
def axpy_busy(n: i32, a: f32, x: Ptr[f32, "ro"], y: Ptr[f32], WORK: Const[int]):
    """y += a x, after WORK dependent float steps per thread that change nothing (a chain LLVM
    cannot fold, so a large WORK is reliably slower on either target)."""
    i = pk.block_idx.x * pk.block_dim.x + pk.thread_idx.x
    if i < n:
        v = x[i]
        for _ in range(WORK):
            v = v * f32(1.0001) + f32(0.5)
        if v == f32(-12345.0):
            y[i] = f32(0.0)
        else:
            y[i] = a * x[i] + y[i]


def tuned(**options):
    slow = SLOW if pk.current_device().kind == "cpu" else SLOW_GPU
    return pk.autotune(configs=[slow, FAST], key=["n"], launch=grid_of, restore=["y"],
                       **options)(axpy_busy)


def test_picks_the_fastest_and_updates_in_place_once(device, rng, seed):
    kernel = tuned()
    n = 3000
    host_x = rng.standard_normal(n).astype(np.float32)
    host_y = rng.standard_normal(n).astype(np.float32)
    x, y = pk.to_device(host_x), pk.to_device(host_y)
    kernel(n, 2.0, x, y)
    expected = np.float32(2.0) * host_x + host_y
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6, err_msg=f"seed={seed}")
    (key, results), = kernel.timings.items()
    times = {c["WORK"]: ms for c, ms, error in results}
    assert all(error is None for _, _, error in results), results
    assert times[FAST["WORK"]] < times[max(times)], times
    assert kernel.best_config(n, 2.0, x, y) == FAST
    # the same key: no new tuning, one more launch of the choice
    kernel(n, 2.0, x, y)
    np.testing.assert_allclose(y.numpy(), expected + np.float32(2.0) * host_x, rtol=1e-6,
                               err_msg=f"seed={seed}")
    assert len(kernel.timings) == 1
    # a new key (n) is tuned on its own; keyword arguments bind as for the kernel
    kernel(n - 1, a=0.0, x=x, y=y)
    assert len(kernel.timings) == 2 and len(kernel.cache) == 2


def test_failing_configs_are_skipped_and_all_failing_is_an_error(device):
    too_big = {"WORK": 1, "threads": 1024}       # over the kernel's max_threads=512
    kernel = pk.autotune(configs=[too_big, SLOW], key=["n"], launch=grid_of)(axpy_busy)
    x, y = pk.zeros(64, np.float32), pk.zeros(64, np.float32)
    assert kernel.best_config(64, 1.0, x, y) == SLOW
    (_, results), = kernel.timings.items()
    assert results[0][1] is None and "max_threads=512" in results[0][2]
    broken = pk.autotune(configs=[too_big], key=["n"], launch=grid_of)(axpy_busy)
    with pytest.raises(pk.AutotuneError,
                       match=r"(?s)no configuration ran for key n=64:.*1024 threads"):
        broken(64, 1.0, x, y)


def test_capture_launches_a_tuned_choice_and_refuses_a_new_key(device):
    kernel = tuned()
    x, y = pk.zeros(256, np.float32), pk.zeros(256, np.float32)
    kernel(256, 1.0, x, y)
    with pk.capture_graph() as graph:
        kernel(256, 1.0, x, y)
        with pytest.raises(pk.AutotuneError, match="n=100 is not tuned yet"):
            kernel(100, 1.0, x, y)
    assert len(graph.launches) == 1 and graph.launches[0].block[0] == FAST["threads"]


def test_precompile_records_every_candidate(device):
    kernel = pk.autotune(configs=[{"WORK": 3, "threads": 64}, {"WORK": 5, "threads": 64}],
                         key=["n"], launch=grid_of)(axpy_busy)
    x, y = pk.zeros(64, np.float32), pk.zeros(64, np.float32)
    from pykernel import compile_pool
    with compile_pool.recorded_launches() as jobs:
        kernel(64, 1.0, x, y)
    assert sorted(spec["WORK"] for _, _, spec, _ in jobs) == [3, 5]
    assert not kernel.timings       # nothing ran, nothing was tuned


def test_usage_errors():
    with pytest.raises(TypeError, match="above @pk.kernel"):
        pk.autotune(configs=[FAST], launch=grid_of)(lambda: None)
    with pytest.raises(ValueError, match="runtime parameter"):
        pk.autotune(configs=[{"n": 3}], launch=grid_of)(axpy_busy)
    with pytest.raises(ValueError, match="not parameters passed"):
        pk.autotune(configs=[FAST], key=["WORK"], launch=grid_of)(axpy_busy)
    with pytest.raises(ValueError, match="some configs but not all"):
        pk.autotune(configs=[FAST, {"threads": 64}], launch=grid_of)(axpy_busy)
    with pytest.raises(ValueError, match="non-empty"):
        pk.autotune(configs=[], launch=grid_of)(axpy_busy)
    with pytest.raises(ValueError, match="not array parameters"):
        pk.autotune(configs=[FAST], launch=grid_of, restore=["a"])(axpy_busy)
    with pytest.raises(TypeError, match="launch must be a callable"):
        pk.autotune(configs=[FAST])(axpy_busy)
    kernel = tuned()
    x = pk.zeros(8, np.float32)
    with pytest.raises(pk.LaunchError, match="chosen by autotune"):
        kernel(8, 1.0, x, x, WORK=3)
    with pytest.raises(pk.LaunchError, match="missing argument"):
        kernel(8, 1.0, x)


def test_persisted_choices_are_reused_by_a_new_process(device, tmp_path, monkeypatch):
    """persist=True writes each choice beside the compile cache; a fresh Autotuned object (as in
    a new process) reads it instead of timing, even inside a capture; an unreadable file or a
    changed config list means tuning again."""
    monkeypatch.setenv("PYKERNEL_CACHE_DIR", str(tmp_path))
    x, y = pk.zeros(512, np.float32), pk.zeros(512, np.float32)
    first = tuned(persist=True)
    first(512, 1.0, x, y)
    files = list((tmp_path / "autotune").glob("axpy_busy-*.json"))
    assert len(files) == 1 and first.timings
    second = tuned(persist=True)
    with pk.capture_graph() as graph:
        second(512, 1.0, x, y)            # no timing possible here: the file answers
    assert not second.timings and second.best_config(512, 1.0, x, y) == FAST
    assert graph.launches[0].block[0] == FAST["threads"]
    files[0].write_text("{not json")
    third = tuned(persist=True)
    assert third.best_config(512, 1.0, x, y) == FAST and third.timings
    other = pk.autotune(configs=[FAST], key=["n"], launch=grid_of, persist=True)(axpy_busy)
    other(512, 1.0, x, y)
    assert other.timings and len(list((tmp_path / "autotune").glob("*.json"))) == 2
