"""Mutated kernel source never crashes the compiler (issue 45, item 9): each case mutates a
valid seed kernel (tests/fuzz/kernel_mutator.py), imports it and compiles every kernel for the
CPU target and for PTX (sm_90). The only acceptable outcomes are success and a
KernelSourceError printed as file:line:col in the mutated file, raised `from None`; any other
exception, or a case running past CASE_SECONDS, fails with the seed, case and mutations.

PYKERNEL_FUZZ_CASES raises the case count (default 96, about 10 s on two shared cores);
PYKERNEL_SEED replays a run (the seed is printed on failure)."""
import importlib.util
import os
import random
import signal
import sys
import traceback
import warnings

import pykernel as pk
from tests.fuzz.kernel_mutator import SEEDS, mutate

CASES = int(os.environ.get("PYKERNEL_FUZZ_CASES", "96"))
ARCHS = ("cpu", "sm_90")
CASE_SECONDS = 30     # a hang (an unbounded unroll or fold) fails the case instead of CI


class CaseTimeout(BaseException):
    """Not an Exception: the compiler's choke point must not turn it into a source error."""


def _on_alarm(signum, frame):
    raise CaseTimeout(f"compiling took more than {CASE_SECONDS} s")


def load_module(path, name, text):
    """Import the mutated module from `path`; None when Python itself rejects the text (not
    the compiler's business). Decorators run here, so signature errors surface here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # SyntaxWarning for `x(1)`-style nonsense
        try:
            compile(text, str(path), "exec")
        except (SyntaxError, ValueError):
            return None
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module             # inspect.getsource finds it like any module
        spec.loader.exec_module(module)
    return module


def run_case(path, name, text, consts) -> list[str]:
    """Compile every kernel of the mutated module for each arch; the unacceptable outcomes."""
    problems = []
    try:
        module = load_module(path, name, text)
    except pk.KernelSourceError as err:
        return _check_located(err, path, "import")
    except Exception as exc:   # noqa: BLE001 - anything else is the finding...
        if traceback.extract_tb(exc.__traceback__)[-1].filename == str(path):
            return []          # ...unless Python raised it running the text itself (a
            #                    NameError in an annotation): its own located error
        return [f"import: {traceback.format_exc()}"]
    if module is None:
        return []
    kernels = [v for v in vars(module).values() if isinstance(v, pk.Kernel)]
    for kernel in kernels:
        for arch in ARCHS:
            try:
                kernel.compile(arch, **consts.get(kernel.name, {}))
            except pk.KernelSourceError as err:
                problems += _check_located(err, path, f"{kernel.name} on {arch}")
            except Exception:   # noqa: BLE001
                problems.append(f"{kernel.name} on {arch}: {traceback.format_exc()}")
    return problems


def _check_located(err, path, where) -> list[str]:
    text = str(err)
    head = f"{err.file}:{err.line}:{err.col + 1}: error: "
    ok = err.file == str(path) and err.line >= 1 and err.col >= 0 and text.startswith(head) \
        and err.__cause__ is None and "pykernel/lower" not in text
    return [] if ok else [f"{where}: KernelSourceError without a usable location:\n{text}"]


def test_mutated_kernels_compile_or_fail_with_a_located_error(tmp_path, monkeypatch, seed):
    monkeypatch.setenv("PYKERNEL_CACHE_DIR", str(tmp_path / "cache"))   # no stale hits
    rng = random.Random(seed)
    failures, python_cases = [], 0
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for case in range(CASES):
            base = SEEDS[case % len(SEEDS)]
            text, applied = mutate(base.source, rng, rng.randint(1, 3))
            name = f"fuzz_kernel_{seed}_{case}"
            path = tmp_path / f"{name}.py"
            signal.alarm(CASE_SECONDS)
            try:
                problems = run_case(path, name, text, base.consts)
            except CaseTimeout as exc:
                problems = [str(exc)]
            finally:
                signal.alarm(0)
                sys.modules.pop(name, None)
            python_cases += path.exists()     # written only when Python compiled it
            if problems:
                failures.append(f"case {case} (seed {seed}, {base.name}): {applied}\n"
                                + "\n".join(problems) + f"\n--- mutated source ---\n{text}")
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert python_cases >= CASES // 4, "the mutator mostly produces text that is not Python"
    assert not failures, (f"PYKERNEL_SEED={seed}: {len(failures)} of {CASES} cases failed\n\n"
                          + "\n\n".join(failures[:5]))
