"""The one-shot peer all-reduce (stdlib_kernels.peer_allreduce) on the CPU target: W ranks'
blocks in one launch (`allreduce_ranks`), interleaved at their spin waits, on per-rank
buffers, flags and epochs kept across calls. Sums must equal numpy's in rank order bit for bit
on every rank, call after call (the two slots, the epochs), across the epochs' wraparound;
a rank that never arrives is reported; the GPU kernel's PTX assembles."""
import numpy as np
import pytest

import pykernel as pk
from llm.parallel.peer_allreduce import BLOCK, LocalPeerGroup, PeerLayout, padded
from stdlib_kernels.peer_allreduce import allreduce_oneshot, allreduce_ranks

pytestmark = pytest.mark.usefixtures("cpu_device")


def rank_order_sum(xs: np.ndarray) -> np.ndarray:
    total = xs[0].copy()
    for part in xs[1:]:
        total = total + part
    return total


def run_calls(group: LocalPeerGroup, rng, sizes, poison_slots=True):
    """One launch per size; each rank's result row checked against the rank-order sum."""
    for call, n in enumerate(sizes):
        xs = rng.standard_normal((group.world_size, n)).astype(np.float32)
        expected = rank_order_sum(xs)
        if poison_slots:         # a slot read before this call wrote it shows as NaN
            for d in group.datas:
                d[:] = np.nan
        out = group.launch(xs.copy())
        for rank in range(group.world_size):
            np.testing.assert_array_equal(out[rank], expected,
                                          err_msg=f"call {call}, n={n}, rank {rank}")


@pytest.mark.parametrize("world", [2, 4])
def test_sums_bit_identical_over_many_calls(world, rng):
    group = LocalPeerGroup(world, max_bytes=4097 * 4, blocks=3)
    sizes = [1, 1000, 4097, 5, 4096, 1000, 1, 4097, 33, 2048]
    run_calls(group, rng, sizes)
    assert (group.epochs == len(sizes)).all()
    for f in group.flags:        # every block heard every rank's last arrival
        assert (f[:group.layout.blocks * world] == len(sizes)).all()


def test_slots_alternate_and_keep_their_data(rng):
    """Without poisoning, a call's slot holds exactly what the ranks wrote into it: the last
    call's partials sit in slot (epoch & 1), the one before in the other slot."""
    group = LocalPeerGroup(2, max_bytes=64 * 4, blocks=2)
    xs = [rng.standard_normal((2, 64)).astype(np.float32) for _ in range(2)]
    for x in xs:
        group.launch(x.copy())
    cap = group.layout.cap
    for rank in range(2):
        np.testing.assert_array_equal(group.datas[rank][cap:cap + 64], xs[0][rank])  # epoch 1
        np.testing.assert_array_equal(group.datas[rank][:64], xs[1][rank])           # epoch 2


def test_epochs_wrap_around(rng):
    """Epochs and flags near 2**32: the wait compares as a wrapping difference."""
    group = LocalPeerGroup(2, max_bytes=300 * 4, blocks=2)
    start = np.uint32(2**32 - 2)
    group.epochs[:] = start
    for f in group.flags:
        f[:] = start
    run_calls(group, rng, [300, 7, 300, 1])
    assert (group.epochs == 2).all()


def test_a_rank_that_never_arrives_is_reported():
    """W = 2 but only rank 0's blocks launched: its wait can never end."""
    lay = PeerLayout(2, 16, blocks=1)
    datas = [np.zeros(2 * lay.cap, np.float32) for _ in range(2)]
    flags = [np.zeros(lay.flag_bytes // 4, np.uint32) for _ in range(2)]
    xs = np.ones((2, 16), np.float32)
    with pytest.raises(pk.KernelRuntimeError, match="spin wait that never ends"):
        allreduce_ranks[(1, 1), BLOCK](xs, *padded(datas), *padded(flags),
                                       np.zeros((2, 1), np.uint32), 16, lay.cap, W=2,
                                       BLOCK=BLOCK)


def test_layout_checks_its_arguments():
    with pytest.raises(ValueError, match="2..8 ranks"):
        PeerLayout(9, 16)
    with pytest.raises(ValueError, match="2..8 ranks"):
        PeerLayout(1, 16)
    assert PeerLayout(4, 10, blocks=16).flag_bytes == 256
    assert PeerLayout(8, 10, blocks=16).nbytes == 512 + 80


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("world", [2, 4, 8])
def test_oneshot_ptx_assembles(arch, world, assemble):
    ptx = allreduce_oneshot.ptx(arch, W=world, BLOCK=BLOCK)
    # one system-scope release per rank (arrival), one acquire poll per rank, a spin sleep
    assert ptx.count("st.release.sys.b32") == world, ptx.count("st.release.sys.b32")
    assert ptx.count("ld.acquire.sys.b32") == world
    assert "nanosleep.u32" in ptx and "ld.global.nc" not in ptx   # peers' data: coherent
    assemble(ptx, arch)
