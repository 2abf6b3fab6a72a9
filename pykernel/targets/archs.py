"""The GPU architectures pykernel compiles for (a module of its own so that the NVPTX target
and the package's get_target() import it without importing each other)."""
SUPPORTED_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
# Arch-specific variants ("a": instructions that later archs do not keep, e.g. wgmma and
# setmaxnreg on sm_90a). A kernel gets `.target sm_90a` only when it uses such an instruction:
# the launcher compiles for the device's plain arch first and for its "a" variant when the
# kernel asks for it (pykernel.launch, ArchSpecificError).
ARCH_SPECIFIC = ("sm_90a",)

REGISTERS_PER_PARTITION = 16384     # an SM's 65536 registers in its 4 partitions
PARTITIONS = 4


def entry_registers(threads: int, blocks: int, largest_inc: int = 256) -> int:
    """Registers per thread at the entry of a kernel that uses setmaxnreg, launch bounds
    max_threads=threads, min_blocks=blocks: what ptxas allocates (checked with ptxas 13 for
    sm_90a): a warp lives in one of the SM's 4 register-file partitions, so the busiest
    partition's warps share its 16384 registers, rounded down to 8 per thread (the allocation
    unit), and never more than the largest setmaxnreg.inc count in the kernel or 256.
    384 x 1: 168; 256 x 2: 128; 640 x 1: 96."""
    if threads <= 0 or blocks <= 0:
        raise ValueError(f"entry_registers: threads and blocks must be positive, got "
                         f"{threads}, {blocks}")
    warps = -(-threads // 32) * blocks
    per_partition = -(-warps // PARTITIONS)
    cap = REGISTERS_PER_PARTITION // (32 * per_partition) // 8 * 8
    return min(cap, largest_inc, 256)
