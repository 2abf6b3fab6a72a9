"""The persistent GEMV chain (stdlib_kernels.persistent): every layer of the chain against
numpy in float64 from the kernel's own previous layer (a derived f32 bound), awkward sizes,
grids smaller and larger than the item count, replayed launches (self-resetting counters),
schedules that violate the dependencies (rejected by validate; run anyway: a wrong answer or
the CPU target's never-ending-wait error), and ptxas on the kernel for sm_80 / sm_90."""
import itertools

import numpy as np
import pytest

from pykernel.errors import KernelRuntimeError
from stdlib_kernels.persistent import (ChainRunner, Schedule, ScheduleError, chain_kernel,
                                       chain_schedule, pack_weights, validate)
from stdlib_kernels.persistent.schedule import NO_WAIT

pytestmark = pytest.mark.usefixtures("cpu_device")
EPS32 = float(np.finfo(np.float32).eps)
ACT = {"none": lambda v: v, "relu": lambda v: np.maximum(v, 0.0), "tanh": np.tanh}


def _chain(rng, dims):
    """Weights N(0, 1/n_in) (activations stay O(1) through 7 layers) and an input y_0."""
    ws = [(rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
          for n_in, n_out in itertools.pairwise(dims)]
    return ws, rng.standard_normal(dims[0]).astype(np.float32)


def _check_layers(runner, ws, x0, act):
    """y_{l+1} from the kernel against act(W_l y_l) in float64 from the kernel's own y_l.
    An f32 dot of n terms (any summation order, fma or not) is off by at most
    (n + 1) * eps/2 * sum|w||y| (Higham's gamma_n, with room for the partial sums' order);
    act is 1-Lipschitz, and tanh adds 2 ulp of its result."""
    y = x0.astype(np.float64)
    np.testing.assert_array_equal(runner.output(0), x0)
    for layer, w in enumerate(ws):
        got = runner.output(layer + 1).astype(np.float64)
        exact = w.astype(np.float64) @ y
        bound = (w.shape[1] + 1) * EPS32 / 2 * (np.abs(w) @ np.abs(y))
        bound += 2 * EPS32 * np.abs(got) + np.finfo(np.float32).tiny
        err = np.abs(got - ACT[act](exact))
        assert np.isfinite(got).all(), f"layer {layer + 1}: unwritten rows (NaN poison)"
        assert (err <= bound).all(), \
            f"layer {layer + 1}: max err {err.max():.3g}, worst bound {bound[err.argmax()]:.3g}"
        y = got


def _runner(sched, ws, act="relu", grid=None, check=True):
    return ChainRunner(sched, pack_weights(sched, ws), act, grid=grid, check=check)


@pytest.mark.parametrize("dims,tile_rows", [
    ((45, 67), 16),                          # L = 1, rows not a multiple of the tile
    ((64, 45, 128, 33), 8),                  # L = 3, vector (n % 4 == 0) and scalar rows
    ((13, 101, 7, 64, 96, 1, 40, 29), 5),    # L = 7, a 1-row stage, tiles larger than rows
])
@pytest.mark.parametrize("grid", [1, 3, 500])  # fewer blocks than items, and more
def test_chain_matches_numpy_layer_by_layer(rng, dims, tile_rows, grid):
    sched = chain_schedule(dims, tile_rows)
    assert grid < sched.n_items or grid > sched.n_items
    ws, x0 = _chain(rng, dims)
    runner = _runner(sched, ws, grid=grid)
    runner.run(x0)
    _check_layers(runner, ws, x0, "relu")
    assert runner.counters.numpy().tolist() == [0] * sched.counters   # reset for a replay


@pytest.mark.parametrize("act", ["none", "tanh"])
def test_chain_activations(rng, act):
    dims = (96, 70, 83, 96)
    ws, x0 = _chain(rng, dims)
    runner = _runner(chain_schedule(dims, 12), ws, act=act, grid=4)
    runner.run(x0)
    _check_layers(runner, ws, x0, act)


def test_co_resident_grid_default(rng):
    dims = (50, 61, 50)
    ws, x0 = _chain(rng, dims)
    runner = _runner(chain_schedule(dims, 4), ws)
    assert runner.grid == chain_kernel.co_resident_grid(runner.block, ACT=1)
    runner.run(x0)
    _check_layers(runner, ws, x0, "relu")


def test_replayed_launches_reuse_the_counters(rng):
    """The same launch, arguments unchanged (as a graph replays it): each leaves the counters
    at zero; the same input gives bit-identical outputs (each row is one warp's fixed-order
    dot product, whichever block takes it), a new input its own correct outputs."""
    dims = (40, 77, 52, 77)
    sched = chain_schedule(dims, 8)
    ws, x0 = _chain(rng, dims)
    runner = _runner(sched, ws, grid=6)
    first = runner.run(x0)
    for _ in range(2):
        runner.acts.fill(np.nan)             # poison everything but the input again
        runner.set_input(x0)
        runner.launch()
        np.testing.assert_array_equal(runner.output(), first)
        assert runner.counters.numpy().tolist() == [0] * sched.counters
    x1 = rng.standard_normal(dims[0]).astype(np.float32)
    runner.run(x1)
    _check_layers(runner, ws, x1, "relu")


def _reordered(sched, order, drop_waits=False):
    items = sched.items[order].copy()
    if drop_waits:
        items[:, 3], items[:, 4] = NO_WAIT, 0
    return Schedule(sched.dims, items, sched.stages, sched.weight_elems, sched.act_elems)


def test_removed_waits_are_rejected_and_give_a_wrong_answer(rng):
    """Stages in reverse order without their waits: validate refuses it; run anyway, each
    stage reads its input before it is written (NaN poison) and the check fails."""
    dims = (33, 48, 27, 40)
    sched = chain_schedule(dims, 8)
    bad = _reordered(sched, np.argsort(-sched.items[:, 0], kind="stable"), drop_waits=True)
    with pytest.raises(ScheduleError, match="waits for 0"):
        validate(bad)
    ws, x0 = _chain(rng, dims)
    runner = _runner(bad, ws, grid=2, check=False)
    runner.run(x0)
    with pytest.raises(AssertionError, match="unwritten rows"):
        _check_layers(runner, ws, x0, "relu")


def test_waits_out_of_order_deadlock_reported_on_cpu(rng):
    """Waits kept but the order reversed: the one block takes an item whose producers come
    later and waits for ever; validate calls it a deadlock, the CPU target reports the wait
    that never ends at the nanosleep, and reset() makes the runner usable again."""
    dims = (20, 30, 20)
    sched = chain_schedule(dims, 10)
    bad = _reordered(sched, np.arange(sched.n_items)[::-1])
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(bad)
    ws, x0 = _chain(rng, dims)
    runner = _runner(bad, ws, grid=1, check=False)
    with pytest.raises(KernelRuntimeError, match="never ends"):
        runner.run(x0)
    good = ChainRunner(sched, runner.weights, "relu", grid=1)
    good.counters = runner.counters          # left dirty by the failed launch
    good.reset()
    good.run(x0)
    _check_layers(good, ws, x0, "relu")


def test_validate_rejects_partial_waits_and_bad_tiles():
    sched = chain_schedule((16, 24, 16), 8)
    items = sched.items.copy()
    items[items[:, 0] == 1, 4] -= 1                       # one producer tile short
    with pytest.raises(ScheduleError, match="needs 3"):
        validate(Schedule(sched.dims, items, sched.stages, sched.weight_elems,
                          sched.act_elems))
    items = sched.items.copy()
    items[1, 2] -= 1                                       # a row left uncovered
    with pytest.raises(ScheduleError, match="covered"):
        validate(Schedule(sched.dims, items, sched.stages, sched.weight_elems,
                          sched.act_elems))
    validate(sched)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="dims"):
        chain_schedule((16,), 4)
    with pytest.raises(ValueError, match="tile_rows"):
        chain_schedule((16, 8), 0)
    sched = chain_schedule((16, 8), 4)
    with pytest.raises(ValueError, match=r"W_0 must be \(8, 16\)"):
        pack_weights(sched, [np.zeros((16, 8), np.float32)])
    with pytest.raises(ValueError, match="act must be"):
        ChainRunner(sched, pack_weights(sched, [np.zeros((8, 16), np.float32)]), "gelu")
    with pytest.raises(ValueError, match="float32 with 128"):
        ChainRunner(sched, np.zeros(100, np.float32))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_chain_kernel_ptx(arch, assemble):
    ptx = chain_kernel.ptx(arch, ACT=1)
    assert "ld.acquire.gpu" in ptx and "atom.release.gpu" in ptx
    assert "atom.acq_rel.gpu" in ptx and "nanosleep" in ptx
    assemble(ptx, arch)
