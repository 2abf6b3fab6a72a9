"""Shared fixtures: a seeded RNG whose seed is printed on failure (PYKERNEL_SEED replays)."""
import faulthandler
import os
import secrets
import shutil
import subprocess
import sys

# Tests import with --import-mode=importlib (test files in different folders may share a
# basename); helper modules next to tests (e.g. tests/llm/tokenizer_data.py) are found here.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("", "llm", "kernels", "runtime"):
    _path = os.path.join(_HERE, _sub)
    if _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np
import pytest


@pytest.fixture
def seed(request):
    value = int(os.environ.get("PYKERNEL_SEED", secrets.randbelow(2**31)))
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seeds = [v for k, v in item.user_properties if k == "seed"]
        if seeds:
            report.sections.append(("seed", f"replay with PYKERNEL_SEED={seeds[0]}"))


# A GPU test that runs longer than this is taken for a hung kernel (a wait on a barrier that
# never completes cannot be interrupted from the host): faulthandler prints every thread's
# stack and ends the process, so xdist reports the test as crashed by name and starts a new
# worker, instead of the suite stalling until an outer timeout kills it without a summary.
# (300 s: several times the slowest GPU test seen with 16 workers compiling beside it.)
GPU_TEST_WATCHDOG_S = float(os.environ.get("PYKERNEL_GPU_TEST_WATCHDOG_S", "300"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    armed = "gpu" in item.keywords and GPU_TEST_WATCHDOG_S > 0
    if armed:
        faulthandler.dump_traceback_later(GPU_TEST_WATCHDOG_S, exit=True)
    try:
        yield
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()


def _gpu_usable() -> bool:
    try:
        import pykernel as pk
        return pk.gpu_available()
    except Exception:
        return False


@pytest.fixture
def assemble(tmp_path):
    """assemble(ptx, arch): ptxas must accept the PTX for arch (skips, saying why, when the
    CUDA toolkit's ptxas is not on PATH)."""
    def run(ptx: str, arch: str) -> None:
        ptxas = shutil.which("ptxas")
        if ptxas is None:
            pytest.skip("ptxas not on PATH: PTX generated but not assembled")
        (tmp_path / "k.ptx").write_text(ptx)
        proc = subprocess.run([ptxas, f"-arch={arch}", str(tmp_path / "k.ptx"), "-o",
                               str(tmp_path / "k.cubin")], capture_output=True, text=True)
        assert proc.returncode == 0, f"ptxas -arch={arch}: {proc.stderr}"
    return run


@pytest.fixture
def checked_ptx(assemble):
    """checked_ptx(kernel, arch, *instructions, **consts) -> the kernel's PTX for arch, after
    checking that each instruction is in it and that ptxas accepts it."""
    def run(kernel, arch: str, *instructions: str, **consts) -> str:
        ptx = kernel.ptx(arch, **consts)
        missing = [instr for instr in instructions if instr not in ptx]
        assert not missing, f"{kernel.name} for {arch}: no {missing} in its PTX"
        assemble(ptx, arch)
        return ptx
    return run


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """Runs the test body once on the CPU target and once on CUDA (skipped without a GPU)."""
    import pykernel as pk
    if request.param == "cuda" and not _gpu_usable():
        pytest.skip("no usable CUDA GPU (driver or device missing)")
    previous = pk.current_device()
    dev = pk.set_device(request.param)
    yield dev
    pk.set_device(previous)


@pytest.fixture
def cpu_device():
    """The CPU target for the test's body (a module of CPU-only checks uses it for every test:
    `pytestmark = pytest.mark.usefixtures("cpu_device")`)."""
    import pykernel as pk
    previous = pk.current_device()
    yield pk.set_device("cpu")
    pk.set_device(previous)


@pytest.fixture
def cuda_device():
    """The CUDA device for the test's body (skipped, saying why, without a usable GPU); for
    GPU-only tests, beside `@pytest.mark.gpu`."""
    import pykernel as pk
    if not _gpu_usable():
        pytest.skip("no usable CUDA GPU (driver or device missing)")
    previous = pk.current_device()
    yield pk.set_device("cuda")
    pk.set_device(previous)


def pytest_collection_modifyitems(config, items):
    # the tests marked slow (a minute or more on the CPU target) first: pytest-xdist hands
    # tests out in this order, so the long ones start early and the workers finish together
    # instead of one of them running a 2-minute test while the other has nothing left
    items.sort(key=lambda item: "slow" not in item.keywords)
    if _gpu_usable():
        return
    skip = pytest.mark.skip(reason="no usable CUDA GPU (driver or device missing)")
    for item in items:
        if "gpu" in item.keywords and "device" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
