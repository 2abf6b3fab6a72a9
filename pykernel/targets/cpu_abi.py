"""The CPU target's calling convention, shared by its code generator and its runtime.

Entry point: `void entry(i8* args, i64* ctx, i64 block_begin, i64 block_end)` runs blocks
[begin, end) of the grid. `args` is the packed parameter buffer (each parameter at its
alignment, pointers as 8-byte addresses). `ctx` is an array of i64 slots, one per worker thread:
"""
GRID = 0            # 0..2 grid dims x, y, z
BLOCK = 3           # 3..5 block dims x, y, z
SHARED_PTR = 6      # this worker's shared-memory buffer (dynamic part first, then static)
DYN_BYTES = 7       # dynamic shared bytes, rounded up to 16
ERROR_CODE = 8      # 0 = ok; see ERRORS
ERROR_SITE = 9      # index into CompiledKernel.sites
ERROR_VALUE = 10    # offending byte offset / other detail
ERROR_THREAD = 11   # linear thread index in the block
SCRATCH_PTR = 12    # 64 zero bytes that out-of-bounds accesses are redirected to
EXTENTS_PTR = 13    # i64[2 * nparams]: (address, nbytes) of each pointer parameter
EXCHANGE_PTR = 14   # i64[2][block_threads][16]: warp-exchange words (two alternating halves)
STATE_PTR = 15      # i32[block_threads]: why each thread is suspended
HANDLES_PTR = 16    # i8*[block_threads]: coroutine handles
ERROR_BLOCK = 17    # linear block index of the first error
PROGRESS = 18       # bumped whenever a thread runs on (kernels with mbarrier waits: deadlocks)
CLUSTER = 19        # 19..21 cluster dims x, y, z (1, 1, 1 without a cluster launch)
SHARED_STRIDE = 22  # bytes between the shared memory of consecutive blocks of a cluster
ERROR_EXTENT = 23   # error 10: the extent that the index (ERROR_VALUE) exceeded
CTX_SLOTS = 24

# Thread states written before each suspension: (kind << 24) | site. AT_MBARRIER is also the
# state of a thread in pk.nanosleep (a yield: retried like an mbarrier wait, cpu_spin.py).
# AT_REGISTERS: a setmaxnreg.inc waiting for registers (retried like an mbarrier wait too).
RUNNING, AT_BARRIER, AT_WARP_OP, FINISHED, AT_MBARRIER, AT_CLUSTER = 0, 1, 2, 3, 4, 5
AT_REGISTERS = 6
WAITING = (AT_MBARRIER, AT_REGISTERS)      # the states the scheduler retries

ERRORS = {1: "out-of-bounds memory access", 2: "syncthreads() reached in divergent control flow",
          3: "warp operation reached in divergent control flow", 4: "assertion failed",
          5: "bulk copy address or size not a multiple of 16 bytes (or size 0)",
          6: "mbarrier wait that can never complete (no thread left to arrive, no copy "
             "left to land)",
          7: "mbarrier misuse (arrival count or tx-count out of range, or not initialised)",
          8: "cluster_sync() / grid_sync() reached in divergent control flow (threads of "
             "the cluster or grid at different barriers, or some returned before it)",
          9: "cluster_map() rank outside the cluster",
          10: "array index out of range",
          11: "tensor copy (TMA) misuse: shared address not 128-byte aligned, an innermost "
              "coordinate whose byte offset is not a multiple of 16, a negative store "
              "coordinate, a tensor map whose rank "
              "differs from the coordinates' (or not from pk.tensor_map for this device), or "
              "a multicast mask naming a rank outside the cluster",
          12: "warp shuffle reads a lane that has returned or is not in the mask (the GPU "
              "gives an undefined value)",
          13: "warp operation whose mask names a lane that has returned, or called by a lane "
              "not in its mask (undefined on the GPU)",
          14: "syncthreads() not reached by every thread of the block (some returned before "
              "it: the GPU may wait for them for ever)",
          15: "spin wait that never ends: every thread of the grid still waiting (in "
              "pk.nanosleep or on an mbarrier) went round 65536 times and none got further "
              "(nothing left running could write what they wait for)",
          16: "setmaxnreg misuse: .dec to more registers than the warp holds, or .inc to fewer "
              "(its count starts at pk.entry_registers(max_threads, min_blocks))",
          17: "setmaxnreg.inc that can never complete: the block's warps ask for more "
              "registers than it owns (threads x pk.entry_registers(max_threads, min_blocks) "
              "in all) and no warp is left to release any; the GPU waits here for ever"}
# the warp and barrier checks' codes (cpu_ops.py, cpu_runner.py)
SHUFFLE_SOURCE_GONE, MASK_NAMES_GONE, BARRIER_AFTER_RETURN, SPIN_DEADLOCK = 12, 13, 14, 15
SETMAXNREG_MISUSE, SETMAXNREG_STUCK = 16, 17
