"""Occupancy queries (Kernel.max_active_blocks, Kernel.co_resident_grid): the CPU target's
documented answer, the CUDA driver's (GPU), that a co-resident grid of blocks waiting on each
other finishes, and bad arguments."""
import numpy as np
import pytest

import pykernel as pk
from pykernel import Const, Ptr, i32, u32


@pk.kernel
def ticket(counter: Ptr[u32], order: Ptr[u32], rounds: Const[int]):
    """Each block takes `rounds` tickets; thread 0 of every block waits (acquire) until all
    blocks have taken their first, so the grid only finishes if all blocks are resident."""
    if pk.thread_idx.x == 0:
        first = pk.atomic_add(counter, 0, u32(1), order="acq_rel")
        order[pk.block_idx.x] = first
        while pk.load_acquire(counter, 0) < u32(pk.grid_dim.x):
            pk.nanosleep(100)
        for _ in range(rounds - 1):
            pk.atomic_add(counter, 1, u32(1), order="relaxed")


def test_cpu_answer_is_one_block_per_worker():
    dev = pk.get_device("cpu")
    assert ticket.max_active_blocks(64, device=dev, rounds=2) == 1
    assert ticket.co_resident_grid((8, 8), device=dev, rounds=2) == dev.workers_n


def test_co_resident_grid_of_waiting_blocks_finishes(device):
    grid = ticket.co_resident_grid(128, device=device, rounds=3)
    per_sm = ticket.max_active_blocks(128, device=device, rounds=3)
    assert grid >= per_sm >= 1 and grid % per_sm == 0
    counter = pk.zeros(2, np.uint32, device)
    order = pk.full(grid, 0xFFFFFFFF, np.uint32, device)
    ticket[grid, 128](counter, order, rounds=3)
    assert counter.numpy().tolist() == [grid, 2 * grid]
    assert sorted(order.numpy().tolist()) == list(range(grid))   # each ticket once


@pytest.mark.gpu
def test_cuda_answer_is_the_occupancy_calculators():
    if not pk.gpu_available():
        pytest.skip("no usable CUDA GPU")
    dev = pk.get_device("cuda")
    sms = dev.core.properties.multiprocessor_count
    small = ticket.max_active_blocks(64, device=dev, rounds=1)
    big = ticket.max_active_blocks(1024, device=dev, rounds=1)
    assert small >= big >= 1             # fewer big blocks fit on an SM
    assert ticket.co_resident_grid(1024, device=dev, rounds=1) == big * sms
    # a block asking for more shared memory than an SM has fits nowhere
    with pytest.raises(pk.LaunchError):
        ticket.co_resident_grid(64, shared_bytes=dev.max_shared_optin + 1, device=dev,
                                rounds=1)


@pytest.mark.parametrize("block,shared,message", [
    (0, 0, "block must be a positive int"),
    (2048, 0, "1024"),
    (64, -1, "shared_bytes"),
])
def test_bad_queries(block, shared, message):
    dev = pk.get_device("cpu")
    with pytest.raises(pk.LaunchError, match=message):
        ticket.max_active_blocks(block, shared_bytes=shared, device=dev, rounds=1)


def test_missing_compile_time_argument():
    with pytest.raises(pk.KernelSourceError, match="missing compile-time argument"):
        ticket.co_resident_grid(64, device=pk.get_device("cpu"))


@pk.kernel
def plain(x: Ptr[i32]):
    x[0] = 1


def test_device_spec_string():
    assert plain.co_resident_grid(32, device="cpu") == pk.get_device("cpu").workers_n
