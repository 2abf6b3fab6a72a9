"""`pykernel build / ptx / ir / check` on the AOT example: files, manifest ABI, a C header that
compiles against cuda.h (when the CUDA headers are present), and PTX that ptxas accepts."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "aot_build.py")


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pykernel.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env)


def test_build_writes_ptx_manifest_and_header(tmp_path):
    out = tmp_path / "ptx"
    proc = run_cli("build", EXAMPLE, "--arch", "sm_80", "--arch", "sm_90", "--const",
                   "BLOCK=128", "--const", "BLOCK=256", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    entries = {(e["entry"], e["arch"]) for e in manifest["kernels"]}
    assert ("row_sum__BLOCK_128", "sm_80") in entries and ("scale", "sm_90") in entries
    assert len(entries) == 6                      # 2 specializations + 1 kernel, 2 archs
    scale = next(e for e in manifest["kernels"] if e["entry"] == "scale")
    assert [(p["name"], p["type"], p["size"], p["align"]) for p in scale["params"]] == [
        ("x", 'Ptr[f32, "ro"]', 8, 8), ("out", "Ptr[f32]", 8, 8), ("n", "i32", 4, 4),
        ("alpha", "f32", 4, 4)]
    for e in manifest["kernels"]:
        assert (out / e["ptx"]).read_text().count(f".entry {e['entry']}") == 1
        assert e["pdl"] == (e["arch"] == "sm_90")     # griddepcontrol prologue: sm_90+ only
    header = (out / "kernels.h").read_text()
    assert "scale_launch(" in header and "const float* x" in header
    cuda_h = "/usr/local/cuda/include/cuda.h"
    cc = shutil.which("cc") or shutil.which("gcc")
    if not (cc and os.path.exists(cuda_h)):
        pytest.skip("no C compiler or CUDA headers: header generated but not compiled")
    src = tmp_path / "use.c"
    src.write_text('#include "kernels.h"\nint main(void) { return 0; }\n')
    proc = subprocess.run([cc, "-fsyntax-only", "-I", str(out), "-I", os.path.dirname(cuda_h),
                           str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_ptx_and_ir_commands():
    proc = run_cli("ptx", f"{EXAMPLE}::scale", "--arch", "sm_86")
    assert proc.returncode == 0, proc.stderr
    assert ".target sm_86" in proc.stdout and ".entry scale" in proc.stdout
    proc = run_cli("ir", f"{EXAMPLE}::row_sum", "--const", "BLOCK=64")
    assert proc.returncode == 0 and "define" in proc.stdout
    proc = run_cli("ptx", f"{EXAMPLE}::nope")
    assert proc.returncode == 2 and "no kernel 'nope'" in proc.stderr


@pytest.mark.parametrize("arch", ["sm_90", "cpu"])
def test_ir_after_a_disk_cache_hit(tmp_path, arch):
    """The disk cache keeps PTX / object code but no IR: `pykernel ir` must lower again."""
    env = dict(os.environ, PYKERNEL_CACHE_DIR=str(tmp_path))
    for _ in range(2):   # the second process finds the kernel in the disk cache
        proc = run_cli("ptx" if arch != "cpu" else "ir", f"{EXAMPLE}::scale", "--arch", arch,
                       env=env)
        assert proc.returncode == 0, proc.stderr
    proc = run_cli("ir", f"{EXAMPLE}::scale", "--arch", arch, env=env)
    assert proc.returncode == 0 and "define" in proc.stdout, proc.stdout[:200]


def test_check_reports_every_arch():
    proc = run_cli("check", EXAMPLE, "--const", "BLOCK=128")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for arch in ("sm_75", "sm_90", "sm_120"):
        assert arch in proc.stdout
    if shutil.which("ptxas"):
        assert "regs" in proc.stdout and " ok" in proc.stdout


def test_source_error_is_printed_like_a_compiler(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import pykernel as pk\nfrom pykernel import Ptr, f32, i32\n\n"
                   "@pk.kernel\ndef k(x: Ptr[f32], n: i32):\n    x[0] = x[1] + n\n")
    proc = run_cli("ptx", f"{bad}::k")
    assert proc.returncode == 1
    assert f"{bad}:6:12: error: operands have different types" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_python_dash_m_pykernel_is_the_command():
    proc = subprocess.run([sys.executable, "-m", "pykernel", "--help"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "synth" in proc.stdout and "build" in proc.stdout
