"""The GPU architectures pykernel compiles for (a module of its own so that the NVPTX target
and the package's get_target() import it without importing each other)."""
SUPPORTED_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
# Arch-specific variants ("a": instructions that later archs do not keep, e.g. wgmma and
# setmaxnreg on sm_90a). A kernel gets `.target sm_90a` only when it uses such an instruction:
# the launcher compiles for the device's plain arch first and for its "a" variant when the
# kernel asks for it (pykernel.launch, ArchSpecificError).
ARCH_SPECIFIC = ("sm_90a",)
