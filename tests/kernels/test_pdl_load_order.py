"""Kernels that call `pk.grid_dependency_wait()` late (after work that overlaps the previous
kernel of a PDL graph) must not let any load of that kernel's outputs run before the wait.

ptxas treats `ld.global.nc` (a "ro" pointer) as reading data that cannot change while the
kernel runs, and may schedule it above `griddepcontrol.wait` (SASS `ACQBULK`): decode
attention's Q loads were moved there once, so pipelined greedy tokens differed now and then
(benchmarks/RESULTS.md, "early_kv"). So Q, which the previous kernel (RoPE) writes, is a plain
`Ptr` (coherent loads, which ptxas keeps below the wait). The K/V caches stay "ro" (the
read-only path is 1-3% faster there, measured): the previous kernel writes only their newest
row, which is read after the wait, and the SASS test below checks that ptxas keeps it there.
The kernels that wait at entry (the compiler's implicit wait) and read the previous kernel's
output through "ro" pointers (the quantize, RoPE, combine, argmax, embedding kernels of
the decode graph) are checked the same way. Two checks: the parameters' flags (always), and
the SASS itself (ptxas + nvdisasm: no more global loads before the first ACQBULK than the
PTX has before the wait, and no coherent one; skipped where nvdisasm is absent: it comes with
the CUDA toolkit or the nvidia-cuda-nvdisasm wheel, and $PYKERNEL_NVDISASM may name it)."""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from stdlib_kernels.attention.decode import decode_spec
from stdlib_kernels.attention.decode_plan import DecodeConfig, bulk_config, mma_config
from stdlib_kernels.attention.decode_bulk import decode_bulk
from stdlib_kernels.attention.decode_kernels import decode_partial
from stdlib_kernels.attention.decode_mma import decode_mma
from stdlib_kernels.quant.gemv_bulk import gemv_bulk, gemv_bulk_split
from stdlib_kernels.quant.rmsnorm_q8_1 import rmsnorm_q8_1_kernel

# decode attention: the previous kernel (RoPE + KV-cache write) writes Q; the bulk-copy
# GEMVs: a quantize or norm kernel writes their Q8_1 activations; the norm (it loads its
# weights before the wait): a GEMV's residual output
WRITTEN_BEFORE = {decode_mma: ("q",), decode_partial: ("q",), decode_bulk: ("q",),
                  gemv_bulk: ("xq", "res"),
                  gemv_bulk_split: ("xq", "res"), rmsnorm_q8_1_kernel: ("x",)}


@pytest.mark.parametrize("kernel", list(WRITTEN_BEFORE), ids=lambda k: k.name)
def test_previous_kernels_outputs_are_not_read_only(kernel):
    flags = {p.name: getattr(p.ann, "readonly", False) for p in kernel.params}
    assert not any(flags[name] for name in WRITTEN_BEFORE[kernel]), flags


NVDISASM = os.environ.get("PYKERNEL_NVDISASM") or shutil.which("nvdisasm")


def loads_before_wait(ptx: str, tmp_path) -> tuple[int, int, int]:
    """Global loads before griddepcontrol.wait in the PTX; before the first ACQBULK in the
    SASS, all and coherent ones (LDG without .CONSTANT: plain pointers)."""
    lines = ptx.splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    in_ptx = sum(1 for line in lines[:wait] if re.search(r"\bld\.global", line))
    (tmp_path / "k.ptx").write_text(ptx)
    subprocess.run(["ptxas", "-arch=sm_90", str(tmp_path / "k.ptx"), "-o",
                    str(tmp_path / "k.cubin")], check=True)
    sass = subprocess.run([NVDISASM, str(tmp_path / "k.cubin")], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    acq = next(i for i, line in enumerate(sass) if "ACQBULK" in line)
    early = [line for line in sass[:acq] if "LDG" in line]
    return in_ptx, len(early), sum(1 for line in early if ".CONSTANT" not in line)


def late_wait_variants():
    for d, group in ((128, 4), (64, 3), (256, 2)):
        spec = decode_spec(d, np.float16, mma_config(group, d), False, False, True, True, False)
        yield f"decode_mma-D{d}", decode_mma, spec
    for d, group in ((128, 4), (64, 3)):
        spec = decode_spec(d, np.float16, bulk_config(group, d), False, True, True, False, False)
        yield f"decode_bulk-D{d}", decode_bulk, spec
    simt = DecodeConfig(heads_per_block=3, warps=4, unroll=1, stages=2)
    for dtype in (np.float16, np.float32):
        spec = decode_spec(64, dtype, simt, False, False, True, False, False)
        yield f"decode_partial-{dtype.__name__}", decode_partial, spec
    from stdlib_kernels.quant.decode8 import Q4_0, Q4_K, Q5_K, Q6_K, Q8_0
    for fmt, name in ((Q4_K, "Q4_K"), (Q5_K, "Q5_K"), (Q6_K, "Q6_K"), (Q8_0, "Q8_0"),
                      (Q4_0, "Q4_0")):
        for mode in (0, 1, 2):
            yield f"gemv_bulk-{name}-mode{mode}", gemv_bulk, dict(FMT=fmt, R=1, WARPS=4, S=1,
                                                                  MODE=mode)
            yield f"gemv_bulk_split-{name}-mode{mode}", gemv_bulk_split, dict(
                FMT=fmt, UNIT_BLOCKS=8 if name == "Q6_K" else 1, WARPS=4, SPLIT=4, MODE=mode)
    for per_warp in (1, 8):
        yield f"rmsnorm_q8_1-{per_warp}", rmsnorm_q8_1_kernel, dict(
            HAS_W=True, HAS_OUT=False, CHUNKS=2, PER_WARP=per_warp, WARPS=16, VEC=4)
    import importlib
    gemv = importlib.import_module("stdlib_kernels.quant.gemv")   # the package exports gemv()
    from stdlib_kernels.quant.gemv_kernels import gemv_q8_kernel
    for name in ("Q4_K", "Q6_K", "Q8_0"):
        fmt_id, items = gemv.VARIANTS[name][gemv.VARIANT[name]][:2]
        c = gemv.TUNED_CONFIGS[name]
        for mode in (0, 2):
            yield f"gemv_q8-{name}-mode{mode}", gemv_q8_kernel, dict(
                FMT=fmt_id, WT=np.uint32, ITEMS=items, WARPS=c.warps, BATCH=1, MODE=mode,
                ROWS=c.rows, KW=c.split, UNROLL=c.unroll, WIDEN=1, STAGE_X=0, PREFETCH=True)
    from stdlib_kernels.quant.gemv_pair import gemv_q8_pair_kernel
    part = {}
    for side, name in (("A", "Q4_K"), ("B", "Q6_K")):
        fmt_id, items = gemv.VARIANTS[name][gemv.VARIANT[name]][:2]
        c = gemv.TUNED_SHORT[name]
        part.update({f"F{side}": fmt_id, f"W{side}": np.uint32, f"ITEMS_{side}": items,
                     f"ROWS_{side}": c.rows, f"KW_{side}": c.split, f"UNROLL_{side}": c.unroll,
                     f"WIDEN_{side}": 1})
    for mode in (0, 1):
        yield f"gemv_q8_pair-mode{mode}", gemv_q8_pair_kernel, dict(part, WARPS=4, MODE=mode,
                                                                    PREFETCH=True)


def entry_wait_variants():
    """Kernels of the decode graph that wait at entry (the compiler's implicit wait) but read
    the previous kernel's output through "ro" pointers: ptxas must not move those loads above
    the wait either."""
    import pykernel as pk
    from llm.backends.kernels_extra import argmax_next, embed_generic
    from stdlib_kernels.attention.decode import combine_spec
    from stdlib_kernels.attention.decode_combine import combine_splits
    from stdlib_kernels.quant.q8_1 import q8_1_quantize_kernel
    from stdlib_kernels.rotary import rope_qkv_cache
    yield "q8_1_quantize", q8_1_quantize_kernel, dict(U=1, WARPS=8)
    for norm in (False, True):
        yield f"rope_qkv_cache-norm{int(norm)}", rope_qkv_cache, dict(
            HAS_Q=True, HAS_FF=False, NEOX=False, T=pk.f32, C=pk.f16, NORM=norm, Q8=False,
            SLOTS=False)
    yield "argmax_next", argmax_next, dict(ADVANCE=True, UNITS=4, VEC=4)
    yield "embed_generic", embed_generic, dict(FMT=12, BE=256, BB=144)
    yield "combine_splits", combine_splits, combine_spec(128, 4, True, True)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not installed")
@pytest.mark.skipif(NVDISASM is None, reason="nvdisasm not found (CUDA toolkit, the "
                    "nvidia-cuda-nvdisasm wheel, or $PYKERNEL_NVDISASM)")
def test_no_load_is_scheduled_above_the_wait(tmp_path):
    hoisted = []
    for name, kernel, spec in (*late_wait_variants(), *entry_wait_variants()):
        in_ptx, in_sass, coherent = loads_before_wait(kernel.ptx("sm_90", **spec), tmp_path)
        if in_sass > in_ptx or coherent:
            hoisted.append(f"{name}: {in_sass} loads before ACQBULK ({coherent} coherent), "
                           f"{in_ptx} in the PTX")
    assert not hoisted, hoisted
