"""The GPU architectures pykernel compiles for (a module of its own so that the NVPTX target
and the package's get_target() import it without importing each other)."""
SUPPORTED_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
